"""The filesystem tool's confinement, action by action (issue 17, item 3): a symlink
leading outside (as the file itself or as a folder on the way), a ``..`` escape, and
navi's own data inside a root are refused by every action, and nothing outside or in
the data folder is read, created, changed or deleted. Symlinks that stay inside the
roots keep working. The race itself: tests/test_tools_filesystem_race.py.

File work happens in a worker thread, so these tests use the real clock; each is
bounded by `trio.fail_after`.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import trio
from kvfake import make_ctx

from navi_trio.errors import ToolInputError
from navi_trio.tools._beneath import MAX_HOPS, Beneath, PrivateError
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.filesystem import FilesystemTool, resolve_dir
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.roots import CWD, Root

# (action, extra arguments) for every action; "list" twice: flat and recursive.
ACTIONS: list[tuple[str, dict[str, Any]]] = [
    ("read", {}),
    ("write", {"content": "pwned"}),
    ("append", {"content": "pwned"}),
    ("edit", {"old": "secret", "new": "pwned"}),
    ("list", {}),
    ("list", {"recursive": True}),
    ("mkdir", {}),
    ("delete", {}),
]
IDS = [a + ("-recursive" if x.get("recursive") else "") for a, x in ACTIONS]


async def fs(ctx: ToolContext, **args: Any) -> ToolResult:
    with trio.fail_after(20):
        return await FilesystemTool().execute(args, ctx)


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under `folder` with its content (files) or target (symlinks)."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            key = str(full.relative_to(folder))
            if full.is_symlink():
                out[key] = "-> " + os.readlink(full)
            elif full.is_file():
                out[key] = full.read_bytes()
            else:
                out[key] = "dir"
    return out


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("secret outside\n")
    return folder


def refused(result: ToolResult, path: str, *words: str) -> bool:
    error = result.error or ""
    return not result.ok and f"'{path}'" in error and all(w in error for w in words)


# A symlink leading outside as the path itself ("file"), or as a folder on the way:
# the path each action uses then (mkdir: through the link, making new folders).
THROUGH_A_FOLDER_LINK = {"list": "linkdir", "mkdir": "linkdir/new/deeper"}


@pytest.mark.parametrize("action, extra", ACTIONS, ids=IDS)
@pytest.mark.parametrize("link", ["file", "folder"])
async def test_a_symlink_leading_outside_is_refused_by_every_action(
    tmp_path: Path, outside: Path, action: str, extra: dict[str, Any], link: str
) -> None:
    ctx = make_ctx(tmp_path)
    ctx.session_dir.mkdir(parents=True)
    os.symlink(outside / "secret.txt", ctx.session_dir / "link.txt")
    os.symlink(outside, ctx.session_dir / "linkdir")
    if link == "file":
        path = "link.txt"
    else:
        path = THROUGH_A_FOLDER_LINK.get(action, "linkdir/secret.txt")
    before = snapshot(outside)
    result = await fs(ctx, action=action, path=path, **extra)
    assert refused(result, path, "symlink", str(outside)), result
    assert "secret outside" not in result.content()
    assert snapshot(outside) == before


async def test_a_recursive_list_shows_a_symlink_but_never_enters_it(
    tmp_path: Path, outside: Path
) -> None:
    ctx = make_ctx(tmp_path)
    (ctx.session_dir / "sub").mkdir(parents=True)
    os.symlink(outside, ctx.session_dir / "sub" / "linkdir")
    listed = await fs(ctx, action="list", recursive=True)
    assert listed.ok, listed.error
    assert f"sub/linkdir -> {outside}" in listed.output
    assert "secret.txt" not in listed.output


@pytest.mark.parametrize("action, extra", ACTIONS, ids=IDS)
@pytest.mark.parametrize("path", ["../escape", "a/../../escape", "../s1-evil/secret.txt"])
async def test_dotdot_escapes_are_refused_by_every_action(
    tmp_path: Path, action: str, extra: dict[str, Any], path: str
) -> None:
    ctx = make_ctx(tmp_path)
    sessions = ctx.session_dir.parent
    (sessions / "s1-evil").mkdir(parents=True)
    (sessions / "s1-evil" / "secret.txt").write_text("secret")
    before = snapshot(tmp_path)
    result = await fs(ctx, action=action, path=path, **extra)
    assert refused(result, path, "'..'"), result
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k != "data/sessions/s1"} == before


def data_ctx(tmp_path: Path) -> ToolContext:
    """A run whose cwd holds navi's data folder (as a home folder holds
    ~/.local/share/navi), with the admin token and another user's session in it."""
    ctx = make_ctx(tmp_path, cwd=tmp_path, config_path=tmp_path / "conf" / "config.json",
                   db_path=tmp_path / "db" / "navi.db")  # fmt: skip
    data = tmp_path / "data"
    (data / "sessions" / "other").mkdir(parents=True)
    (data / "local-token").write_text("secret admin token\n")
    (data / "sessions" / "other" / "notes.txt").write_text("secret of another user\n")
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "navi.db").write_text("secret database\n")
    ctx.session_dir.mkdir(parents=True)
    return ctx


PRIVATE = {
    "read": "data/local-token",
    "write": "data/local-token",
    "append": "data/sessions/other/notes.txt",
    "edit": "data/local-token",
    "list": "data",
    "mkdir": "data/sessions/other/new",
    "delete": "data/local-token",
}


@pytest.mark.parametrize("action, extra", ACTIONS, ids=IDS)
async def test_navis_own_data_inside_a_root_is_refused_by_every_action(
    tmp_path: Path, action: str, extra: dict[str, Any]
) -> None:
    ctx = data_ctx(tmp_path)
    before = snapshot(tmp_path / "data")
    for path in (PRIVATE[action], "data/sessions/other" if action == "list" else "db/navi.db"):
        result = await fs(ctx, action=action, path=path, **extra)
        assert refused(result, path, "navi's own data; tools may not use it"), result
        assert "secret" not in result.content()
    assert snapshot(tmp_path / "data") == before


async def test_navis_data_is_refused_through_symlinks_and_hard_links_too(
    tmp_path: Path,
) -> None:
    ctx = data_ctx(tmp_path)
    token = tmp_path / "data" / "local-token"
    os.symlink(token, ctx.session_dir / "tok")
    os.symlink(tmp_path / "data", ctx.session_dir / "dd")
    # The database by another name: the same inode, which only an identity check sees.
    os.link(tmp_path / "db" / "navi.db", tmp_path / "hard-db")
    for path in (str(ctx.session_dir / "tok"), str(ctx.session_dir / "dd/local-token"),
                 "hard-db"):  # fmt: skip
        for action, extra in ACTIONS:
            if action in ("list", "mkdir"):
                continue
            result = await fs(ctx, action=action, path=path, **extra)
            assert refused(result, path, "navi's own data"), (action, result)
    assert token.read_text() == "secret admin token\n"
    assert (tmp_path / "hard-db").read_text() == "secret database\n"
    listed = await fs(ctx, action="list")
    assert listed.ok and "hard-db" not in listed.output


async def test_what_navi_would_create_is_refused_before_it_exists(tmp_path: Path) -> None:
    # The config folder does not exist yet, nor the database's journal (a planted
    # "hot journal" would be rolled into the database by SQLite), nor the users marker
    # (whose change makes every daemon look at the users again).
    ctx = data_ctx(tmp_path)
    planted = [("mkdir", "conf"), ("write", "conf/config.json"),
               ("write", "db/navi.db-journal"), ("append", "db/navi.db-wal"),
               ("write", "db/navi.db-users")]  # fmt: skip
    for action, path in planted:
        result = await fs(ctx, action=action, path=path, content="{}")
        assert refused(result, path, "navi's own data"), (action, result)
    assert not (tmp_path / "conf").exists()
    assert sorted(p.name for p in (tmp_path / "db").iterdir()) == ["navi.db"]


async def test_a_listing_leaves_navis_data_out_but_the_own_session_stays_usable(
    tmp_path: Path,
) -> None:
    ctx = data_ctx(tmp_path)
    (tmp_path / "notes.md").write_text("mine")
    listed = await fs(ctx, action="list", recursive=True)
    assert listed.ok, listed.error
    assert "notes.md" in listed.output
    for hidden in ("data", "local-token", "other", "navi.db"):
        assert hidden not in listed.output, listed.output
    # The own session folder lies inside the data folder and is the run's workspace.
    own = "data/sessions/s1/mine.txt"
    assert (await fs(ctx, action="write", path=own, content="kept")).ok
    assert (await fs(ctx, action="read", path=own)).output == "kept"
    assert (ctx.session_dir / "mine.txt").read_text() == "kept"
    assert "mine.txt" in (await fs(ctx, action="list", path="data/sessions/s1")).output


async def test_symlinks_that_stay_inside_keep_working_and_loops_end(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    root = ctx.session_dir
    (root / "real" / "deep").mkdir(parents=True)
    (root / "real" / "deep" / "f.txt").write_text("inside")
    (root / "sub").mkdir()
    os.symlink("../real/deep/f.txt", root / "sub" / "rel")  # relative, with ..
    os.symlink(root / "real", root / "alias")  # absolute, a folder
    os.symlink("alias/deep", root / "chain")  # a symlink to a path through a symlink
    assert (await fs(ctx, action="read", path="sub/rel")).output == "inside"
    assert (await fs(ctx, action="read", path="chain/f.txt")).output == "inside"
    assert (await fs(ctx, action="write", path="alias/new/n.txt", content="n")).ok
    assert (root / "real" / "new" / "n.txt").read_text() == "n"
    assert "f.txt" in (await fs(ctx, action="list", path="chain")).output
    os.symlink("loop-b", root / "loop-a")
    os.symlink("loop-a", root / "loop-b")
    looped = await fs(ctx, action="read", path="loop-a")
    assert refused(looped, "loop-a", "more than 40 symlinks"), looped


async def test_a_call_follows_as_many_symlinks_as_linux_and_no_more(tmp_path: Path) -> None:
    # A chain of links inside the roots: 40 in a row are followed, as the kernel would;
    # one more is refused, so a maze of links costs one call a bounded walk.
    ctx = make_ctx(tmp_path)
    root = ctx.session_dir
    root.mkdir(parents=True)
    (root / "end.txt").write_text("the end")
    previous = "end.txt"
    for k in range(MAX_HOPS + 1):
        os.symlink(previous, root / f"link{k}")
        previous = f"link{k}"
    last_followed, one_more = f"link{MAX_HOPS - 1}", f"link{MAX_HOPS}"
    assert (await fs(ctx, action="read", path=last_followed)).output == "the end"
    refused_read = await fs(ctx, action="read", path=one_more)
    assert refused(refused_read, one_more, f"more than {MAX_HOPS} symlinks"), refused_read


def test_what_lies_in_navis_data_is_private_because_the_folder_is(tmp_path: Path) -> None:
    # navi's data folder is known by its identity too: renamed while a call walks (after
    # the call read where navi's data is), a file in it is refused through the folder,
    # not only by its path.
    work = tmp_path.resolve() / "work"
    data = work / "data"
    data.mkdir(parents=True)
    (data / "local-token").write_text("TOKEN")
    with Root.open(work, CWD) as held, ExitStack() as stack:
        beneath = Beneath([held], PrivatePaths(hidden=(data,)), stack)
        data.rename(work / "moved")
        with pytest.raises(PrivateError):
            beneath.open_file(work / "moved" / "local-token", os.O_RDONLY)


async def unblock_after(seconds: float, fifo: Path) -> None:
    """A watchdog: a worker thread stuck opening `fifo` cannot be cancelled, so after
    `seconds` open both ends (non-blocking) to release it; the test then fails on what
    the call returned instead of hanging."""
    await trio.sleep(seconds)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # releases a blocked writer
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # releases a blocked reader
    finally:
        os.close(reader)


async def test_pipes_are_refused_without_hanging_and_new_files_get_the_umask(
    tmp_path: Path,
) -> None:
    ctx = make_ctx(tmp_path)
    ctx.session_dir.mkdir(parents=True)
    fifo = ctx.session_dir / "pipe"
    os.mkfifo(fifo)
    for action in ("read", "write"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(unblock_after, 10, fifo)
            result = await fs(ctx, action=action, path="pipe", content="x")
            nursery.cancel_scope.cancel()
        assert refused(result, "pipe", "not a regular file"), (action, result)
    mask = os.umask(0o022)
    os.umask(mask)
    assert (await fs(ctx, action="write", path="d/new.txt", content="x")).ok
    assert (ctx.session_dir / "d" / "new.txt").stat().st_mode & 0o777 == 0o666 & ~mask
    assert (ctx.session_dir / "d").stat().st_mode & 0o777 == 0o777 & ~mask
    again = await fs(ctx, action="write", path="d/new.txt", content="y")
    assert again.ok and (ctx.session_dir / "d" / "new.txt").read_text() == "y"


def command_dir(ctx: ToolContext, raw: str | None) -> Path:
    """Where `resolve_dir` starts a command, its held folder closed again."""
    roots = ctx.call_roots()
    try:
        with resolve_dir(ctx, raw, roots) as folder:
            assert os.readlink(f"/proc/self/fd/{folder.fd}") == str(folder.path)
            return folder.path
    finally:
        roots.close()


def test_a_commands_cwd_is_checked_as_the_filesystem_tool_checks_a_folder(
    tmp_path: Path,
) -> None:
    ctx = data_ctx(tmp_path)  # the cwd is tmp_path itself
    os.symlink("/etc", tmp_path / "linkdir")
    os.symlink(ctx.session_dir, tmp_path / "own")
    assert command_dir(ctx, None) == tmp_path
    assert command_dir(ctx, "own") == ctx.session_dir
    bad = [("data", "navi's own data"), ("data/sessions/other", "navi's own data"),
           ("linkdir", "symlink"), ("..", "'..'"), ("missing", "not an existing")]  # fmt: skip
    for raw, words in bad:
        with pytest.raises(ToolInputError) as info:
            command_dir(ctx, raw)
        assert f"'{raw}'" in str(info.value) and words in str(info.value)
    hidden_cwd = make_ctx(tmp_path, cwd=tmp_path / "data")
    with pytest.raises(ToolInputError, match="navi's own data"):
        command_dir(hidden_cwd, None)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon acts as the tool user")
@pytest.mark.parametrize(("action", "extra"), ACTIONS, ids=IDS)
async def test_a_root_daemons_tool_acts_with_the_tool_users_rights(
    tmp_path: Path, action: str, extra: dict[str, Any]
) -> None:
    # A root-only folder and file in a run's cwd, which the tool user (nobody here) may
    # not read or change, as a command of the same run may not: every action is
    # refused as the kernel would refuse it, and nothing in them is read or changed.
    work = tmp_path / "work"
    work.mkdir(mode=0o777)
    ctx = make_ctx(tmp_path, cwd=work)
    closed = work / "closed"
    closed.mkdir(mode=0o755)
    (closed / "inside.txt").write_text("secret inside\n")
    (closed / "inside.txt").chmod(0o644)
    locked = work / "locked.txt"
    locked.write_text("secret root only\n")
    locked.chmod(0o600)
    shut = work / "shut"
    shut.mkdir(mode=0o700)
    (shut / "deep.txt").write_text("secret deep\n")
    before = snapshot(work)
    files = {"read": "locked.txt", "write": "locked.txt", "append": "locked.txt",
             "edit": "locked.txt", "list": "shut", "mkdir": "closed/new",
             "delete": "closed/inside.txt"}  # fmt: skip
    where = [files[action], "shut/deep.txt"]
    if action in ("write", "append"):
        where.append("closed/made.txt")  # a new file in a folder it may not write
    for path in where:
        result = await fs(ctx, action=action, path=path, **extra)
        assert refused(result, path, "permission denied"), (path, result)
        assert "secret" not in result.content(), result
    assert snapshot(work) == before
    # What the tool user may use stays usable: a file open to all, in the open folder.
    assert (await fs(ctx, action="read", path="closed/inside.txt")).ok
