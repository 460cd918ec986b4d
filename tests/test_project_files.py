"""A project's instruction files and skills reach the model, through the run's roots.

The fixture repository (tests/fixtures/project/) is copied under tmp_path with a
``.git`` folder made at its top. The fake LLM on 127.0.0.1 records what the model was
sent: the system message's order, caps and cut marks, the skills' list, and what the
`skill` tool answered. Each I/O test has an absolute time limit.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import of_type, with_tools
from api_ws import open_daemon
from served import config_file, send

from navi_trio.cli.doctor_project import project_report
from navi_trio.client.context_view import context_lines
from navi_trio.core.turn.project_files import SKIPPED_CODE, project_view
from navi_trio.profiles import ConfigSource
from navi_trio.project import Reader
from navi_trio.project.files import CHAIN_MAX, folder_chain
from navi_trio.project.skills import SKILL_MAX_BYTES
from navi_trio.settings import Settings
from navi_trio.testing import open_harness
from navi_trio.tools.roots import CWD, Root

TIMEOUT = 20
FIXTURE = Path(__file__).parent / "fixtures" / "project"
TOOLS = ["filesystem", "skill"]


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fixture repository under tmp_path, a repository (its ``.git``), and a user
    folder of navi's own (``$XDG_CONFIG_HOME/navi``) with an AGENTS.md and one skill."""
    root = tmp_path / "repo"
    shutil.copytree(FIXTURE, root)
    (root / ".git").mkdir()
    xdg = tmp_path / "xdg"
    user = xdg / "navi"
    (user / "skills" / "user-notes").mkdir(parents=True)
    (user / "AGENTS.md").write_text("USER-AGENTS: answer in English.\n")
    (user / "skills" / "user-notes" / "SKILL.md").write_text(
        "---\nname: user-notes\ndescription: The user's own way to take notes.\n---\n"
        "USER-NOTES-BODY\n"
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    return root


def profile(**flags: Any) -> dict[str, Any]:
    return {"general": with_tools(TOOLS, planning_first_message=False, **flags)}


def use_tools(data: dict[str, Any]) -> None:
    data["profiles"]["general"].update(with_tools(TOOLS))


def skill_call(**arguments: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "skill", "arguments": arguments}]}


def sizes(paths: list[str]) -> list[int]:
    return [os.stat(p).st_size for p in paths]


def system_of(body: dict[str, Any]) -> str:
    first = body["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


async def test_the_system_message_holds_the_files_in_order_after_the_profile_prompt(
    tmp_path: Path, repo: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "ok"}], profiles=profile()) as h:
            ann = await h.user("ann", "admin")
            frames = await h.turn(
                "s1", "hi", cwd=repo / "docs" / "api", user_id=ann, user_role="admin"
            )
            system = system_of(h.chat_requests[0])
            prompt = h.runtime.agent.config().profile("general").system_prompt.strip()
    marks = ["USER-AGENTS", "ROOT-AGENTS", "DOCS-CLAUDE", "API-AGENTS"]
    at = [system.index(m) for m in marks]
    assert at == sorted(at), system  # the user's first, then root → cwd, nearest last
    assert system.index(prompt[:60]) < system.index("# Instructions from the project's files")
    assert "ROOT-CLAUDE" not in system  # the root has an AGENTS.md: its CLAUDE.md is not read
    assert f"## {repo / 'docs' / 'CLAUDE.md'}" in system
    assert "[… cut here" not in system
    warnings = [f["message"] for f in of_type(frames, "warning") if f.get("code") == SKIPPED_CODE]
    assert len(warnings) == 3, warnings  # the three bad skills, nothing else


async def test_the_skills_are_listed_and_the_skill_tool_gives_the_body(
    tmp_path: Path, repo: Path
) -> None:
    replies = [
        skill_call(name="pdf-forms"),
        skill_call(name="pdf-forms", file="references/fields.md"),
        skill_call(name="release-notes"),
        {"text": "done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=profile()) as h:
            ann = await h.user("ann", "admin")
            frames = await h.turn(
                "s1", "hi", cwd=repo / "docs" / "api", user_id=ann, user_role="admin"
            )
            bodies = h.chat_requests
    system = system_of(bodies[0])
    listed = system[system.index("# Skills") :]
    for name in ("api-style", "pdf-forms", "release-notes", "user-notes"):
        assert f"- {name}: " in listed, listed
    for bad in ("no-front-matter", "wrong-name", "another-name", "long-description"):
        assert bad not in listed
    # Only the metadata at the start: no body reaches the model before the tool is used.
    assert "PDF-FORMS-BODY" not in system
    assert "Write release notes from the commits since the last tag. Use when" in listed
    results = [m["content"] for m in bodies[-1]["messages"] if m["role"] == "tool"]
    assert "PDF-FORMS-BODY" in results[0]
    assert str(repo / ".claude" / "skills" / "pdf-forms") in results[0]
    assert "PDF-FORMS-REFERENCE" in results[1]
    assert "RELEASE-NOTES-BODY" in results[2]
    warnings = " | ".join(
        f["message"] for f in of_type(frames, "warning") if f.get("code") == SKIPPED_CODE
    )
    assert "no-front-matter/SKILL.md: skipped: no front matter" in warnings
    assert "wrong-name/SKILL.md: skipped: the name 'another-name' does not match" in warnings
    assert "long-description/SKILL.md: skipped: its description is 1100 characters" in warnings


async def test_a_profile_without_the_skill_tool_gets_no_skill_list(
    tmp_path: Path, repo: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[{"text": "ok"}],
            profiles={"general": with_tools(["filesystem"], planning_first_message=False)},
        ) as h:
            ann = await h.user("ann", "admin")
            await h.turn("s1", "hi", cwd=repo, user_id=ann, user_role="admin")
            system = system_of(h.chat_requests[0])
    assert "ROOT-AGENTS" in system
    assert "# Skills" not in system


async def test_every_cut_is_marked_and_the_nearest_file_keeps_its_room(
    tmp_path: Path, repo: Path
) -> None:
    # one byte over its bound: the cut of a single byte is marked too
    (repo / "docs" / "api" / "AGENTS.md").write_text("API-AGENTS " + "a" * 289 + "\n")
    (repo / "AGENTS.md").write_text("ROOT-AGENTS " + "r" * 500 + "\n")
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[{"text": "ok"}],
            profiles=profile(),
            instructions_file_max_bytes=300,
            instructions_total_max_bytes=400,
        ) as h:
            ann = await h.user("ann", "admin")
            await h.turn("s1", "hi", cwd=repo / "docs" / "api", user_id=ann, user_role="admin")
            system = system_of(h.chat_requests[0])
    api = system[system.index(f"## {repo / 'docs' / 'api' / 'AGENTS.md'}") :]
    assert "API-AGENTS " + "a" * 289 in api  # its 300 bytes, all of them
    assert "[… cut here: this file is 301 bytes, only its first 300 are read " in api
    assert "(instructions_file_max_bytes)]" in api
    # 100 bytes were left for the farther ones, nearest first: the docs' file (59) whole,
    # the root's first 41, and nothing of the user's file (the farthest).
    assert "DOCS-CLAUDE" in system
    root = system[system.index(f"## {repo / 'AGENTS.md'}") : system.index("DOCS-CLAUDE")]
    assert "ROOT-AGENTS " + "r" * 29 + "\n[… cut here: the instruction files are over 400 " in root
    assert "(instructions_total_max_bytes); 472 of this file's 513 bytes are left out]" in root
    assert "USER-AGENTS" not in system
    user = system[system.index("AGENTS.md\n[… cut here") - 100 : system.index(str(repo))]
    assert "32 of this file's 32 bytes are left out]" in user


async def test_a_link_out_of_the_roots_is_not_read_and_the_notice_says_so(
    tmp_path: Path, repo: Path
) -> None:
    secret = tmp_path / "outside" / "secret.md"
    secret.parent.mkdir()
    secret.write_text("SECRET-TEXT\n")
    api = repo / "docs" / "api"
    (api / "AGENTS.md").unlink()
    (api / "AGENTS.md").symlink_to(secret)
    with trio.fail_after(TIMEOUT):
        path = config_file(tmp_path / "config", {"user": [str(repo / "docs")]}, use_tools)
        async with open_harness(tmp_path, replies=[{"text": "ok"}], config=ConfigSource(path)) as h:
            bob = await h.user("bob", "user")
            frames = await h.turn("s1", "hi", cwd=api, user_id=bob, user_role="user")
            system = system_of(h.chat_requests[0])
    assert "SECRET-TEXT" not in system
    assert "ROOT-AGENTS" not in system  # the repository root is above bob's workspace
    assert "DOCS-CLAUDE" in system  # docs/ is his workspace root: read
    notices = [f["message"] for f in of_type(frames, "warning") if f.get("code") == SKIPPED_CODE]
    link = [n for n in notices if n.startswith(str(api / "AGENTS.md"))]
    assert link and f"a symlink to {secret}, outside the folders this run may read" in link[0]
    root = [n for n in notices if n.startswith(str(repo / "AGENTS.md"))]
    assert root and "outside the folders this run may read" in root[0]
    assert "a user may work in: workspace_roots" in root[0]


async def test_only_a_changed_file_is_read_again(tmp_path: Path, repo: Path) -> None:
    settings = Settings(db_path=tmp_path / "navi.db", data_dir=tmp_path / "data")
    reader = Reader()
    cwd = repo / "docs" / "api"
    with trio.fail_after(TIMEOUT), Root.open(cwd, CWD) as held:
        first = await project_view(settings, reader, cwd=held, check=None)
        read = reader.reads
        assert read == 4  # the user's AGENTS.md and skill, the cwd's AGENTS.md and skill
        again = await project_view(settings, reader, cwd=held, check=None)
        assert reader.reads == read  # nothing changed: nothing read again
        assert again == first
        stat = (cwd / "AGENTS.md").stat()
        (cwd / "AGENTS.md").write_text("API-AGENTS changed\n")
        os.utime(cwd / "AGENTS.md", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        changed = await project_view(settings, reader, cwd=held, check=None)
    assert reader.reads == read + 1  # that file, and only it
    assert "API-AGENTS changed" in changed.instructions.text


async def test_the_context_frame_lists_what_a_run_there_gets_and_checks_who_asks(
    tmp_path: Path, repo: Path
) -> None:
    cwd = repo / "docs" / "api"
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[{"text": "ok"}], profiles=profile()) as d:
            async with d.connect("root") as root, d.connect("bob") as bob:
                listing = await root.request({"type": "context", "cwd": str(cwd)})
                await send(root, "hi", cwd=str(cwd))
                await root.until_type("stream_end")
                system = system_of(d.harness.chat_requests[0])
                sessions = await root.request({"type": "sessions", "action": "list"})
                sid = sessions["sessions"][0]["session_id"]
                other = await bob.request({"type": "context", "session_id": sid})
                outside = await bob.request({"type": "context", "cwd": str(repo)})
    assert listing["type"] == "context", listing
    paths = [f["path"] for f in listing["files"]]
    assert paths == [
        str(tmp_path / "xdg" / "navi" / "AGENTS.md"),
        str(repo / "AGENTS.md"),
        str(repo / "docs" / "CLAUDE.md"),
        str(cwd / "AGENTS.md"),
    ]
    assert [f["size"] for f in listing["files"]] == sizes(paths)
    # What the run was given: the same files, in the same order.
    assert [system.index(f"## {p}\n") for p in paths] == sorted(
        system.index(f"## {p}\n") for p in paths
    )
    names = sorted(s["name"] for s in listing["skills"])
    assert names == ["api-style", "pdf-forms", "release-notes", "user-notes"]
    assert len(listing["skipped"]) == 3 and listing["more_skipped"] == 0
    assert other["type"] == "error" and other["code"] == "forbidden", other
    assert outside["type"] == "error" and outside["code"] == "forbidden", outside


async def test_doctor_lists_the_files_in_effect_for_its_folder(tmp_path: Path, repo: Path) -> None:
    settings = Settings(db_path=tmp_path / "navi.db", data_dir=tmp_path / "data")
    with trio.fail_after(TIMEOUT):
        report = await project_report(settings, repo / "docs" / "api")
    text = "\n".join(context_lines(report))
    (size,) = sizes([str(repo / "docs" / "CLAUDE.md")])
    assert f"{repo / 'docs' / 'CLAUDE.md'}  ({size} bytes; project)" in text
    assert f"instruction files for {repo / 'docs' / 'api'}: 4" in text
    assert "skills: 4" in text
    assert "wrong-name/SKILL.md: skipped: the name 'another-name' does not match" in text


async def test_the_skill_tool_reads_no_file_outside_its_folder(tmp_path: Path, repo: Path) -> None:
    (tmp_path / "outside.md").write_text("OUTSIDE-TEXT\n")
    refs = repo / ".claude" / "skills" / "pdf-forms" / "references"
    (refs / "link.md").symlink_to(tmp_path / "outside.md")
    replies = [
        skill_call(name="pdf-forms", file="../../../../outside.md"),
        skill_call(name="pdf-forms", file="references/link.md"),
        skill_call(name="pdf-forms", file="/etc/passwd"),
        skill_call(name="no-such-skill"),
        {"text": "done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=profile()) as h:
            ann = await h.user("ann", "admin")
            await h.turn("s1", "hi", cwd=repo, user_id=ann, user_role="admin")
            last = h.chat_requests[-1]
    results = [m["content"] for m in last["messages"] if m["role"] == "tool"]
    assert all("OUTSIDE-TEXT" not in r and "root:" not in r for r in results), results
    assert "'../../../../outside.md' is not inside the skill's folder" in results[0]
    assert f"a symlink to {tmp_path / 'outside.md'}, outside the folders" in results[1]
    assert "'/etc/passwd' is not inside the skill's folder" in results[2]
    names = "release-notes, pdf-forms, user-notes"
    assert f"no skill named 'no-such-skill'; skills: {names}" in results[3]


def skill_of_size(folder: Path, name: str, size: int) -> str:
    """A SKILL.md of exactly `size` bytes for the skill `name` under `folder`; returns
    its body, which ends with a mark of the last bytes."""
    head = f"---\nname: {name}\ndescription: A skill {size} bytes long.\n---\n"
    tail = f"\n{name.upper()}-LAST-BYTES"
    body = "b" * (size - len(head) - len(tail)) + tail
    (folder / name).mkdir(parents=True)
    (folder / name / "SKILL.md").write_text(head + body)
    assert (folder / name / "SKILL.md").stat().st_size == size
    return body


async def test_a_skill_md_of_the_bound_is_read_whole_and_one_byte_more_is_refused(
    tmp_path: Path, repo: Path
) -> None:
    """The bound on a SKILL.md, to the byte, through the tool: its whole body reaches
    the model (the tool's output cap and the model's window set above it, so no cut
    hides a lost byte)."""
    assert SKILL_MAX_BYTES == 64 << 10  # the bound docs/security.md names
    skills = repo / ".claude" / "skills"
    body = skill_of_size(skills, "at-the-bound", SKILL_MAX_BYTES)
    skill_of_size(skills, "past-the-bound", SKILL_MAX_BYTES + 1)
    replies = [skill_call(name="at-the-bound"), skill_call(name="past-the-bound"), {"text": "ok"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=replies,
            profiles=profile(),
            tool_output_max_chars=2 * SKILL_MAX_BYTES,
            num_ctx=1 << 20,  # a window whose per-message share holds the body uncut
        ) as h:
            ann = await h.user("ann", "admin")
            frames = await h.turn("s1", "hi", cwd=repo, user_id=ann, user_role="admin")
            last = h.chat_requests[-1]
    results = [m["content"] for m in last["messages"] if m["role"] == "tool"]
    assert results[0].endswith(f"\n\n{body}"), results[0][-200:]
    assert "cut here" not in results[0]
    assert "no skill named 'past-the-bound'" in results[1]
    warnings = [f["message"] for f in of_type(frames, "warning") if f.get("code") == SKIPPED_CODE]
    over = f"SKILL.md is {SKILL_MAX_BYTES + 1} bytes, over the {SKILL_MAX_BYTES} read"
    assert any(w.endswith(f"past-the-bound/SKILL.md: skipped: {over}") for w in warnings), warnings
    assert not any("at-the-bound" in w for w in warnings), warnings


async def test_a_skill_linked_in_from_the_project_is_found_and_one_linked_out_is_named(
    tmp_path: Path, repo: Path
) -> None:
    shared = repo / "shared" / "lint-rules"
    shared.mkdir(parents=True)
    (shared / "SKILL.md").write_text(
        "---\nname: lint-rules\ndescription: The project's lint rules.\n---\nLINT-BODY\n"
    )
    (repo / ".claude" / "skills" / "lint-rules").symlink_to("../../shared/lint-rules")
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "SKILL.md").write_text("---\nname: evil\ndescription: x\n---\n")
    (repo / ".claude" / "skills" / "evil").symlink_to(tmp_path / "evil")
    replies = [skill_call(name="lint-rules"), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=profile()) as h:
            ann = await h.user("ann", "admin")
            frames = await h.turn("s1", "hi", cwd=repo, user_id=ann, user_role="admin")
            bodies = h.chat_requests
    listed = system_of(bodies[0])
    assert "- lint-rules: The project's lint rules." in listed
    assert "- evil" not in listed
    (result,) = [m["content"] for m in bodies[-1]["messages"] if m["role"] == "tool"]
    assert "LINT-BODY" in result and str(shared) in result  # its real folder
    notices = [f["message"] for f in of_type(frames, "warning") if f.get("code") == SKIPPED_CODE]
    evil = f"{repo / '.claude' / 'skills' / 'evil'}: a symlink to {tmp_path / 'evil'}, outside"
    assert any(n.startswith(evil) for n in notices), notices


def test_the_folders_walked_up_to_the_repository_are_bounded(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    assert CHAIN_MAX == 64  # the bound docs/security.md names
    near = repo.joinpath(*["d"] * (CHAIN_MAX - 1))  # the root is the 64th folder looked at
    near.mkdir(parents=True)
    chain = folder_chain(near, tmp_path)
    assert chain.repo == repo and len(chain.folders) == CHAIN_MAX
    far = near / "d"  # one more: the root is not reached, only the cwd is read
    far.mkdir()
    assert folder_chain(far, tmp_path) == type(chain)((far,), None)
