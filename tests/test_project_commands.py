"""Slash commands kept as files (``.navi/commands``, ``.claude/commands``, the user's
``~/.config/navi/commands``): the daemon's ``commands`` request, and their expansion.

- the daemon lists a folder's commands in Claude Code's format, with their description
  and body, the user's own after them, and names each bad file with its key;
- the folder is checked as a message's cwd is: one the sender may not work in lists
  nothing (refused), another user's session is refused, a file linked out of the folder
  is not read;
- `$ARGUMENTS` is the rest of the line, `$1`… its words; a client's own command wins
  over a file of the same name, with a notice;
- `navi chat` (a `ChatApp` fed by a `QueueReader`, tests/test_client_app.py) offers
  them in /help and sends one typed with its arguments as the expanded prompt;
- `navi acp` (driven by the ACP SDK's client, tests/test_acp.py) offers them in
  ``available_commands_update`` and runs one with its arguments;
- `navi run "/name words"` sends the command's prompt (a name no file gives: as typed).

Rules: real WebSocket connections on 127.0.0.1 (port 0) to a runtime over a real SQLite
file under tmp_path; the fixture repository tests/fixtures/project-b copied there; every
test has an absolute time limit.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import open_daemon
from daemons import no_plan_config
from project_repo import FIXTURE, repo
from test_acp import DEADLINE as ACP_DEADLINE
from test_acp import said, sdk_client
from test_cli import _session_of, fake_llm, messages, navi
from test_control_chat import chatting

from navi_trio.command_text import (
    EXPANDED_MAX_CHARS,
    CommandTooLongError,
    expand_command,
    usable,
)
from navi_trio.project.commands import (
    MAX_COMMANDS,
    MAX_TOTAL_BYTES,
    collect_commands,
    find_commands,
    parse_command,
)
from navi_trio.project.files import MAX_FILE_BYTES, MAX_FILES, Found, MdFile, read_md_folders
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.roots import Root

TIMEOUT = 30


@pytest.fixture
def user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's own commands folder, under a config home of the test's."""
    home = tmp_path / "config-home"
    folder = home / "navi" / "commands"
    folder.mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return folder


async def test_the_daemon_lists_a_folders_commands_and_the_users_own(
    tmp_path: Path, user_folder: Path
) -> None:
    work = repo(tmp_path)
    (user_folder / "standup.md").write_text("Write my standup notes for $ARGUMENTS.\n")
    (user_folder / "review.md").write_text("The user's own review: taken by the project's.\n")
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d, d.connect("root") as c:
            answer = await c.request({"type": "commands", "cwd": str(work)})
    assert answer["type"] == "commands", answer
    listed = {x["name"]: x for x in answer["commands"]}
    # .navi's first, then .claude's, then the user's; the daemon lists /help too (a
    # client leaves out the names of its own commands).
    assert list(listed) == ["help", "fix-issue", "review", "standup"]
    review = listed["review"]
    assert review["description"] == "Review the changes in a file"
    assert review["argument_hint"] == "FILE"
    assert review["body"] == "Review the code in $ARGUMENTS and list the problems you find."
    assert review["source"] == "project"
    assert listed["standup"]["source"] == "user"
    # No front matter (Claude Code's plain form): its first line describes it.
    assert listed["fix-issue"]["description"].startswith("Fix issue #$1")
    notices = "\n".join(answer["notices"])
    assert "bad-key.md: $.runs-as: unknown key" in notices
    assert f"{user_folder / 'review.md'}: /review is taken by" in notices


async def test_a_folder_the_sender_may_not_work_in_lists_no_commands(
    tmp_path: Path, user_folder: Path
) -> None:
    work = repo(tmp_path)
    (user_folder / "standup.md").write_text("The daemon account's own prompt.\n")
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d, d.connect("alice") as c:
            answer = await c.request({"type": "commands", "cwd": str(work)})
            mine = await c.request({"type": "commands"})
    assert answer["type"] == "error", answer
    assert answer["code"] == "forbidden"
    assert "workspace_roots" in answer["message"]
    # The daemon account's own commands are its admins': an ordinary user sees none.
    assert mine["type"] == "commands", mine
    assert mine["commands"] == []


async def test_another_users_session_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d:
            async with d.connect("bob") as c:
                made = await c.request(
                    {"type": "sessions", "action": "create", "session_id": "bob.one"}
                )
                assert made["type"] == "session", made
            async with d.connect("alice") as c:
                answer = await c.request({"type": "commands", "session_id": "bob.one"})
    assert answer["type"] == "error"
    assert answer["code"] == "forbidden", answer


async def test_a_command_file_linked_out_of_the_folder_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("the secret body\n")
    work = repo(tmp_path)
    (work / ".claude" / "commands" / "leak.md").symlink_to(secret)
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d, d.connect("root") as c:
            answer = await c.request({"type": "commands", "cwd": str(work)})
    assert "leak" not in {x["name"] for x in answer["commands"]}
    assert "the secret body" not in str(answer)
    assert any(
        f"leak.md: a symlink to {secret}, outside the folders" in n for n in answer["notices"]
    )


# (body, what follows the name, the prompt sent): tests/test_web_slash.py holds the
# page's twin of the rule to the same cases.
EXPANSIONS = [
    ("Review $ARGUMENTS now", "src/a.py  src/b.py", "Review src/a.py  src/b.py now"),
    ("Fix #$1 with priority $2.", "123 high", "Fix #123 with priority high."),
    ("Fix #$1 ($2)", "7", "Fix #7 ()"),
    ("Say $ARGUMENTS", "", "Say "),
    ("Plain body", "extra words", "Plain body\n\nARGUMENTS: extra words"),
    ("Costs $10 and $ARGUMENTS", "x", "Costs $10 and x"),
]


@pytest.mark.parametrize(("body", "arguments", "expanded"), EXPANSIONS)
def test_arguments_replace_the_placeholders(body: str, arguments: str, expanded: str) -> None:
    assert expand_command(body, arguments) == expanded


def test_a_body_repeating_its_arguments_cannot_grow_past_the_bound() -> None:
    body = "$ARGUMENTS " * 1000
    with pytest.raises(CommandTooLongError, match="over 900000 characters"):
        expand_command(body, "x" * 1000)
    with pytest.raises(CommandTooLongError):
        expand_command("plain", "x" * EXPANDED_MAX_CHARS)
    assert len(expand_command(body, "x" * 800)) == 801_000


def test_a_clients_own_command_wins_over_a_file_of_its_name() -> None:
    listed = [
        {"name": "help", "path": "/r/.navi/commands/help.md", "body": "x"},
        {"name": "review", "path": "/r/.claude/commands/review.md", "body": "y"},
    ]
    kept, notices = usable(listed, {"help", "quit"})
    assert list(kept) == ["review"]
    assert notices == [
        "/help of /r/.navi/commands/help.md is not offered: /help is a built-in command"
    ]


# --- navi chat -------------------------------------------------------------------------


async def test_navi_chat_sends_a_file_command_with_its_arguments(tmp_path: Path) -> None:
    work = repo(tmp_path)
    general = {"general": {"planning_first_message": False}}
    replies = [{"text": "reviewed"}, {"text": "fixed"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies, profiles=general) as d:
            async with chatting(d, "root", cwd=str(work)) as chat:
                # The daemon's /help is ours: the file of that name is left out, saying so.
                await chat.screen.wait_for("/help is a built-in command")
                await chat.screen.wait_for("$.runs-as: unknown key")
                chat.reader.type("/help")
                await chat.screen.wait_for("/review FILE  Review the changes in a file")
                chat.reader.type("/review src/app.py")
                await chat.screen.wait_for("reviewed")
                chat.reader.type("/fix-issue 123 high")
                await chat.screen.wait_for("fixed")
            sent = [r["body"]["messages"] for r in d.harness.fake.chat_requests]  # type: ignore[union-attr]
    asked = [m["content"] for m in sent[0] if m["role"] == "user"]
    assert asked == ["Review the code in src/app.py and list the problems you find."]
    asked = [m["content"] for m in sent[1] if m["role"] == "user"]
    assert asked[-1] == (
        "Fix issue #123 with priority high. Follow the coding standards of this repository."
    )


# --- navi acp --------------------------------------------------------------------------


@pytest.mark.slow  # the ACP SDK's client, navi acp and the fake LLM: processes
async def test_acp_offers_the_file_commands_and_runs_one_with_its_arguments(
    env: dict[str, str], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    shutil.copytree(FIXTURE, work, symlinks=True)
    env = {**env, "NAVI_CONFIG": str(no_plan_config(tmp_path))}
    steps: list[dict[str, Any]] = [{"op": "new"}, {"op": "prompt", "text": "/review src/app.py"}]
    async with fake_llm(tmp_path, [{"text": "reviewed"}]) as llm:
        with trio.fail_after(ACP_DEADLINE):
            _, new, review = await sdk_client(env, tmp_path, steps, llm=llm)
    offered = {
        c["name"]: c
        for u in new["updates"] + review["updates"]
        if u["sessionUpdate"] == "available_commands_update"
        for c in u["availableCommands"]
    }
    assert {"compact", "rewind", "fork", "review", "fix-issue", "help"} <= set(offered)
    assert offered["review"]["description"] == "Review the changes in a file"
    assert offered["review"]["input"] == {"hint": "FILE"}
    assert said(review) == "reviewed"
    saved = await messages(tmp_path / "navi.db", new["result"]["sessionId"])
    assert saved[0]["content"] == "Review the code in src/app.py and list the problems you find."


def test_a_list_holds_at_most_its_count_and_bytes_of_commands() -> None:
    many = Found(files=[MdFile(Path(f"/u/c{i:03}.md"), f"Do {i}.") for i in range(105)])
    got = collect_commands([(many, "user")])
    assert len(got.commands) == MAX_COMMANDS
    assert len(got.problems) == 5
    assert got.problems[0].startswith("/u/c100.md: past the 100 commands or 262144 bytes")
    big = "x" * 60_000
    heavy = Found(files=[MdFile(Path(f"/u/h{i}.md"), big) for i in range(6)])
    got = collect_commands([(heavy, "user")])
    assert len(got.commands) == MAX_TOTAL_BYTES // 60_000  # 4 of 6


def test_a_commands_claude_code_permissions_are_taken_and_change_nothing() -> None:
    text = "---\nallowed-tools: Bash(git add:*)\nmodel: opus\n---\nCommit $ARGUMENTS.\n"
    command = parse_command(text, Path("/r/.claude/commands/commit.md"), "project")
    assert command.frame()["body"] == "Commit $ARGUMENTS."
    assert set(command.frame()) == {
        "name", "description", "argument_hint", "body", "source", "path",
    }  # fmt: skip


# --- navi run --------------------------------------------------------------------------


@pytest.mark.slow  # navi run and the fake LLM: processes
async def test_navi_run_sends_a_file_command_with_its_arguments(
    env: dict[str, str], tmp_path: Path
) -> None:
    work = repo(tmp_path)
    env = {**env, "NAVI_CONFIG": str(no_plan_config(tmp_path))}
    async with fake_llm(tmp_path, [{"text": "fixed"}, {"text": "as typed"}]) as llm:
        done = await navi("run", "--llm-url", llm, "/fix-issue 7 low", env=env, cwd=work)
        typed = await navi("run", "--llm-url", llm, "/nothing here", env=env, cwd=work)
    assert done.code == 0, done
    assert done.out == "fixed\n"
    saved = await messages(tmp_path / "navi.db", _session_of(done))
    assert saved[0]["content"] == (
        "Fix issue #7 with priority low. Follow the coding standards of this repository."
    )
    assert typed.code == 0, typed
    saved = await messages(tmp_path / "navi.db", _session_of(typed))
    assert saved[0]["content"] == "/nothing here"  # no such command: sent as typed


def test_a_commands_folder_linked_out_of_the_run_folder_is_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "steal.md").write_text("the outside body\n")
    work = repo(tmp_path)
    shutil.rmtree(work / ".navi" / "commands")
    (work / ".navi" / "commands").symlink_to(outside)
    with Root.open(work, "the working folder (cwd)") as root:
        got = find_commands(root, PrivatePaths(hidden=()), None, None)
    assert [c.name for c in got.commands] == ["fix-issue", "review"]  # .claude's only
    assert (
        f"{work / '.navi' / 'commands'}: leads out of the folders this run may read"
        in (got.problems[0])
    )


def test_a_folders_files_are_read_bounded_in_count_and_bytes_and_as_utf8(tmp_path: Path) -> None:
    """The one reader of project files reads an agents' or commands' folder: at most
    MAX_FILES files by name, each at most MAX_FILE_BYTES and UTF-8; the rest are named."""
    folder = tmp_path / "commands"
    folder.mkdir()
    for i in range(MAX_FILES + 2):
        (folder / f"c{i:03}.md").write_text(f"Do {i}.")
    (folder / "c000.md").write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    (folder / "c001.md").write_bytes(b"\xff\xfe not text")
    with Root.open(tmp_path, "the working folder (cwd)") as root:
        got = read_md_folders([root], [folder], PrivatePaths(hidden=()))
    assert got.problems == [
        f"{folder}: holds {MAX_FILES + 2} .md files; only the first {MAX_FILES} by name are "
        "read (2 skipped)",
        f"{folder / 'c000.md'}: larger than {MAX_FILE_BYTES} bytes; not read",
        f"{folder / 'c001.md'}: not UTF-8 text; not read",
    ]
    assert [f.path.name for f in got.files] == [f"c{i:03}.md" for i in range(2, MAX_FILES)]
    assert got.files[0].text == "Do 2."
