"""The filesystem tool: confinement to the roots, each action, manuals, bad input.

File work happens in a worker thread, so these tests use the real clock; each is
bounded by `trio.fail_after`.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import trio
from kvfake import make_ctx

from navi_trio.profiles import load_config
from navi_trio.settings import REPO_ROOT, Settings
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.builtin import builtin_tools
from navi_trio.tools.filesystem import FilesystemTool


async def fs(ctx: ToolContext, **args: Any) -> ToolResult:
    with trio.fail_after(20):
        return await FilesystemTool().execute(args, ctx)


async def test_relative_paths_live_in_the_session_folder_created_on_demand(
    tmp_path: Path,
) -> None:
    ctx = make_ctx(tmp_path)
    assert not ctx.session_dir.exists()
    wrote = await fs(ctx, action="write", path="notes/a.txt", content="hello\n")
    assert wrote.ok, wrote.error
    assert (ctx.session_dir / "notes" / "a.txt").read_text() == "hello\n"
    read = await fs(ctx, action="read", path="notes/a.txt")
    assert read.ok and read.output == "hello\n"


async def test_relative_paths_use_the_cwd_and_the_session_folder_stays_reachable(
    tmp_path: Path,
) -> None:
    work = tmp_path / "project"
    work.mkdir()
    ctx = make_ctx(tmp_path, cwd=work)
    assert (await fs(ctx, action="write", path="main.py", content="x = 1\n")).ok
    assert (work / "main.py").read_text() == "x = 1\n"
    inside_session = str(ctx.session_dir / "s.txt")
    assert (await fs(ctx, action="write", path=inside_session, content="s")).ok
    assert (await fs(ctx, action="read", path=inside_session)).output == "s"


@pytest.mark.parametrize("path", ["../escape.txt", "a/../../escape.txt", "../../../etc/passwd"])
async def test_dotdot_escapes_are_refused_naming_the_path(tmp_path: Path, path: str) -> None:
    ctx = make_ctx(tmp_path)
    for action, extra in (("read", {}), ("write", {"content": "x"}), ("delete", {})):
        result = await fs(ctx, action=action, path=path, **extra)
        assert not result.ok
        assert f"'{path}'" in (result.error or "") and "'..'" in (result.error or "")
    assert not (tmp_path / "data" / "sessions" / "escape.txt").exists()


async def test_a_sibling_folder_sharing_the_session_name_prefix_is_refused(
    tmp_path: Path,
) -> None:
    # Session "s1" lives in .../sessions/s1; ".../sessions/s1-evil" starts with the same
    # characters but is not inside it (a string-prefix check would let it through).
    ctx = make_ctx(tmp_path, session_id="s1")
    evil = ctx.session_dir.parent / "s1-evil"
    evil.mkdir(parents=True)
    (evil / "x").write_text("secret")
    for path in ("../s1-evil/x", str(evil / "x")):
        for action, extra in (("read", {}), ("write", {"content": "pwned"}), ("delete", {})):
            result = await fs(ctx, action=action, path=path, **extra)
            assert not result.ok and f"'{path}'" in (result.error or ""), result
    assert (evil / "x").read_text() == "secret"
    assert (await fs(ctx, action="list", path="../s1-evil")).ok is False


async def test_dotdot_that_stays_inside_is_fine(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    assert (await fs(ctx, action="write", path="a/../b.txt", content="ok")).ok
    assert (ctx.session_dir / "b.txt").read_text() == "ok"


async def test_absolute_paths_outside_the_roots_are_refused(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    for path in (str(outside), "/etc/passwd", "~/x"):
        result = await fs(ctx, action="read", path=path)
        assert not result.ok and f"'{path}'" in (result.error or "")
        assert "outside the folders" in (result.error or "")
    assert "secret" not in (await fs(ctx, action="read", path=str(outside))).content()


async def test_symlinks_leading_outside_are_refused(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    ctx.session_dir.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    os.symlink(outside / "secret.txt", ctx.session_dir / "link.txt")
    os.symlink(outside, ctx.session_dir / "linkdir")
    for action, path, extra in (
        ("read", "link.txt", {}),
        ("write", "link.txt", {"content": "overwrite"}),
        ("read", "linkdir/secret.txt", {}),
        ("write", "linkdir/new.txt", {"content": "x"}),
        ("list", "linkdir", {}),
    ):
        result = await fs(ctx, action=action, path=path, **extra)
        assert not result.ok, (action, path)
        assert f"'{path}'" in (result.error or "") and "symlink" in (result.error or "")
    assert (outside / "secret.txt").read_text() == "secret"
    assert not (outside / "new.txt").exists()


async def test_symlinks_inside_the_roots_are_followed(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    ctx.session_dir.mkdir(parents=True)
    (ctx.session_dir / "real.txt").write_text("inside")
    os.symlink(ctx.session_dir / "real.txt", ctx.session_dir / "alias.txt")
    assert (await fs(ctx, action="read", path="alias.txt")).output == "inside"


async def test_read_with_offset_and_limit_in_lines(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    text = "".join(f"line {n}\n" for n in range(1, 11))
    await fs(ctx, action="write", path="f.txt", content=text)
    part = await fs(ctx, action="read", path="f.txt", offset=3, limit=2)
    assert part.ok
    assert part.output.startswith("line 3\nline 4\n")
    assert "line 5" not in part.output
    assert "[lines 3-4 of 10; continue with offset=5]" in part.output
    past = await fs(ctx, action="read", path="f.txt", offset=11)
    assert not past.ok and "offset 11" in (past.error or "")
    bad = await fs(ctx, action="read", path="f.txt", offset=0)
    assert not bad.ok and "'offset'" in (bad.error or "")


async def test_read_of_a_big_file_stops_at_the_cap_and_says_where_to_go_on(
    tmp_path: Path,
) -> None:
    ctx = make_ctx(tmp_path, tool_output_max_chars=100)
    await fs(ctx, action="write", path="big.txt", content="".join(f"{n:09d}\n" for n in range(50)))
    result = await fs(ctx, action="read", path="big.txt")
    assert result.ok
    assert result.output.startswith("000000000\n")
    assert "[lines 1-10 of 50; continue with offset=11]" in result.output


async def test_edit_of_a_file_over_its_cap_is_refused_without_reading_it(
    tmp_path: Path,
) -> None:
    """A big sparse file (no disk, a model's `truncate -s`) costs edit no memory: it is
    refused by its size, naming it and the cap; a file at the cap is edited."""
    cap = 1 << 20
    ctx = make_ctx(tmp_path, file_edit_max_bytes=cap)
    ctx.session_dir.mkdir(parents=True)
    big = ctx.session_dir / "big.txt"
    with big.open("wb") as fh:
        fh.write(b"needle\n")
        fh.truncate(64 << 20)  # 64 MiB, sparse
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = await fs(ctx, action="edit", path="big.txt", old="needle", new="thread")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not result.ok
    assert result.error == (
        f"'big.txt' is {64 << 20} bytes, over the {cap} bytes that edit reads "
        "(NAVI_FILE_EDIT_MAX_BYTES); change it with terminal (sed -i, a script) or write it "
        "whole"
    )
    assert peak < cap, peak  # not even the cap was read
    assert big.stat().st_size == 64 << 20 and big.read_bytes()[:6] == b"needle"
    exact = ctx.session_dir / "exact.txt"
    exact.write_bytes(b"needle" + b"." * (cap - 6))
    assert (await fs(ctx, action="edit", path="exact.txt", old="needle", new="thread")).ok
    assert exact.read_bytes()[:6] == b"thread"


async def test_binary_files_are_not_dumped(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    ctx.session_dir.mkdir(parents=True)
    (ctx.session_dir / "blob.bin").write_bytes(b"\x00\x01\x02" * 10)
    result = await fs(ctx, action="read", path="blob.bin")
    assert not result.ok and "binary" in (result.error or "")


async def test_append_mkdir_list_and_delete(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    await fs(ctx, action="write", path="log.txt", content="a\n")
    assert (await fs(ctx, action="append", path="log.txt", content="b\n")).ok
    assert (await fs(ctx, action="read", path="log.txt")).output == "a\nb\n"
    assert (await fs(ctx, action="mkdir", path="sub/deeper")).ok
    await fs(ctx, action="write", path="sub/deeper/x.txt", content="x")
    flat = await fs(ctx, action="list")
    assert flat.ok and "sub/" in flat.output and "log.txt" in flat.output
    assert "x.txt" not in flat.output
    deep = await fs(ctx, action="list", recursive=True)
    assert "sub/deeper/x.txt" in deep.output
    refused = await fs(ctx, action="delete", path="sub")
    assert not refused.ok and "folder" in (refused.error or "")
    assert (await fs(ctx, action="delete", path="log.txt")).ok
    assert not (ctx.session_dir / "log.txt").exists()
    missing = await fs(ctx, action="read", path="log.txt")
    assert not missing.ok and "'log.txt' does not exist" in (missing.error or "")


async def test_edit_replaces_exactly_one_match(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    await fs(ctx, action="write", path="c.py", content="a = 1\nb = 2\nb = 2\n")
    ok = await fs(ctx, action="edit", path="c.py", old="a = 1", new="a = 10")
    assert ok.ok and "line 1" in ok.output
    none = await fs(ctx, action="edit", path="c.py", old="zzz", new="y")
    assert not none.ok and "not found" in (none.error or "")
    many = await fs(ctx, action="edit", path="c.py", old="b = 2", new="b = 3")
    assert not many.ok and "matches 2 times" in (many.error or "")
    assert (ctx.session_dir / "c.py").read_text() == "a = 10\nb = 2\nb = 2\n"
    deleted = await fs(ctx, action="edit", path="c.py", old="b = 2\nb = 2\n", new="")
    assert deleted.ok and (ctx.session_dir / "c.py").read_text() == "a = 10\n"


async def test_edit_keeps_crlf_line_ends_and_refuses_non_utf8(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    ctx.session_dir.mkdir(parents=True)
    (ctx.session_dir / "win.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    ok = await fs(ctx, action="edit", path="win.txt", old="one\ntwo\n", new="1\n2\n")
    assert ok.ok, ok.error
    assert (ctx.session_dir / "win.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"
    (ctx.session_dir / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    bad = await fs(ctx, action="edit", path="latin.txt", old="caf", new="bar")
    assert not bad.ok and "not UTF-8" in (bad.error or "")


@pytest.mark.parametrize(
    "args, needle",
    [
        ({}, "'action'"),
        ({"action": "shred", "path": "x"}, "'action'"),
        ({"action": "read"}, "'path'"),
        ({"action": "write", "path": "x"}, "'content'"),
        ({"action": "write", "path": "x", "content": 5}, "'content'"),
        ({"action": "edit", "path": "x", "new": "y"}, "'old'"),
        ({"action": "list", "recursive": "yes"}, "'recursive'"),
    ],
)
async def test_bad_arguments_give_a_failed_result_naming_them(
    tmp_path: Path, args: dict[str, Any], needle: str
) -> None:
    result = await fs(make_ctx(tmp_path), **args)
    assert not result.ok and needle in (result.error or ""), result.error


async def test_manuals_are_readable_and_read_only(tmp_path: Path) -> None:
    manuals = tmp_path / "manuals"
    manuals.mkdir()
    (manuals / "terminal.md").write_text("# Terminal\nuse run")
    ctx = make_ctx(tmp_path, manuals_dir=manuals)
    read = await fs(ctx, action="read", path="manual:terminal")
    assert read.ok and read.output == "# Terminal\nuse run"
    unknown = await fs(ctx, action="read", path="manual:nope")
    assert not unknown.ok and "available: terminal" in (unknown.error or "")
    sneaky = await fs(ctx, action="read", path="manual:../secret")
    assert not sneaky.ok and "no manual" in (sneaky.error or "")
    write = await fs(ctx, action="write", path="manual:terminal", content="x")
    assert not write.ok and "read-only" in (write.error or "")


def test_every_builtin_tool_points_to_a_manual_that_exists() -> None:
    settings = Settings.from_env({})
    tools = builtin_tools(settings)
    names = [t.name for t in tools]
    assert names == [
        "filesystem",
        "terminal",
        "code_exec",
        "todo",
        "scratchpad",
        "memory",
        "switch_profile",
        "ssh_exec",
    ]
    config = load_config(REPO_ROOT / "config" / "config.json")
    wanted = {n for p in config.profiles.values() for n in p.tools.agent}
    # Added by the runtime.
    assert set(names) == wanted - {"spawn_agent", "tasks", "peer", "skill"}
    for tool in tools:
        manual = tool.description.rsplit("`manual:", 1)[1].split("`")[0]
        assert tool.description.endswith("with the filesystem tool.")
        assert (REPO_ROOT / "manuals" / f"{manual}.md").is_file(), manual
        assert tool.parameters["type"] == "object"
