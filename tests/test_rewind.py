"""Rewind through real agent runs (issue 22, "Tests"): a scripted model changes files with
`filesystem`, with `terminal` (``sed -i``, ``rm``, ``mv``, a new folder, ``chmod``) and
from a background job; rewinding the files gives back exactly the earlier tree (content,
deletions, new files removed, modes); rewinding the chat makes the next request carry
the shorter context; the rewind is undone; a fork goes on on its own.

Rules: real HTTP to the fake LLM on 127.0.0.1 (`open_harness`), a real SQLite file and
real folders under tmp_path, real shell commands; every test under an absolute
`fail_after`; nothing sleeps: the tests wait on run ends and on the job's `done` event.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from rewind_kit import (
    FULL,
    PROFILES,
    TIMEOUT,
    call,
    calls,
    diff,
    frames_of,
    run,
    say,
    tree_of,
    turn,
    user_texts,
    workspace,
    write,
)

from navi_trio.core.history import Target
from navi_trio.errors import ChangedError, NotFoundError, RestoreError
from navi_trio.testing import Harness, open_harness

SID = "s-rewind"

TURN_1 = [calls(write("a.txt", "alpha v2\n")), say("one done")]
TURN_2 = [
    calls(
        write("b.txt", "a new file\n"),
        call("filesystem", action="edit", path="a.txt", old="v2", new="v3"),
    ),
    calls(
        run(
            "sed -i s/x/y/ c.txt && rm d/e.txt && mv f.txt g.txt && mkdir -p newdir/sub"
            " && echo n > newdir/sub/n.txt && chmod 600 a.txt && chmod 700 run.sh"
        )
    ),
    calls(run("echo from the job > h.txt", background=True)),
    say("two done"),
]


async def user_ids(h: Harness, sid: str = SID) -> list[str]:
    messages = await h.runtime.store.load_messages(sid)
    return [m["id"] for m in messages if m["role"] == "user"]


async def two_turns(h: Harness, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Turn 1 edits a file; turn 2 edits, creates, deletes, moves, chmods and leaves a
    background job that writes. The trees after each (the job done)."""
    await turn(h, SID, "first", cwd=work, **FULL)
    after_1 = tree_of(work)
    frames = await turn(h, SID, "second", cwd=work, **FULL)
    assert frames_of(frames, "checkpoint_created"), [f["type"] for f in frames]
    (job,) = h.runtime.supervisor.list_jobs(SID)
    await job.done.wait()
    assert job.status == "completed", job.error
    after_2 = tree_of(work)
    assert (work / "h.txt").read_text() == "from the job\n"
    assert diff(after_1, after_2)  # turn 2 changed the tree
    return after_1, after_2


async def rewind(h: Harness, target: Target) -> Any:
    preview = await h.runtime.rewinds.preview(SID, target)
    return preview, await h.runtime.rewinds.apply(SID, target, preview.token)


@pytest.mark.slow
async def test_rewinding_the_files_gives_back_exactly_the_tree_before_the_message(
    tmp_path: Path,
) -> None:
    work = workspace(tmp_path)
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=TURN_1 + TURN_2, profiles=PROFILES) as h:
            after_1, after_2 = await two_turns(h, work)
            first, second = await user_ids(h)
            target = Target(to=second, restore="files")
            preview = await h.runtime.rewinds.preview(SID, target)
            # The preview says what the restore does, and changes nothing.
            assert tree_of(work) == after_2
            assert preview.messages_removed == 0 and preview.files is not None
            root = next(r for r in preview.files.roots if r.root == work)
            assert (root.created, root.deleted) == (2, 4)  # e, f back; b, g, h, n gone
            assert "full mode" in preview.files.not_covered
            event = await h.runtime.rewinds.apply(SID, target, preview.token)
            assert diff(tree_of(work), after_1) == {}
            assert event.files["deleted"] >= 3 and event.undo
            # The conversation was left as it was.
            assert await user_ids(h) == [first, second]


@pytest.mark.slow
async def test_rewinding_the_chat_makes_the_next_request_carry_the_shorter_context(
    tmp_path: Path,
) -> None:
    work = workspace(tmp_path)
    replies = [*TURN_1, *TURN_2, say("again, differently")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            _, after_2 = await two_turns(h, work)
            before = await h.runtime.store.load_messages(SID)
            first, second = await user_ids(h)
            preview, event = await rewind(h, Target(to=second, restore="chat"))
            assert preview.text == "second" and preview.files is None
            assert event.messages_removed == len(before) - 4  # turn 1: user, call, result, answer
            assert tree_of(work) == after_2  # the files stay
            messages = await h.runtime.store.load_messages(SID)
            assert [m.get("content") for m in messages if m["role"] == "user"] == ["first"]
            await turn(h, SID, "second, again", cwd=work, **FULL)
            body = h.chat_requests[-1]
            assert user_texts(body) == ["first", "second, again"]
            assert not any("two done" in str(m.get("content")) for m in body["messages"])


@pytest.mark.slow
async def test_a_rewind_of_both_is_undone_and_the_undo_redone(tmp_path: Path) -> None:
    work = workspace(tmp_path)
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=TURN_1 + TURN_2, profiles=PROFILES) as h:
            after_1, after_2 = await two_turns(h, work)
            history = await h.runtime.store.load_messages(SID)
            context = await h.runtime.store.load_context(SID)
            _, second = await user_ids(h)
            _, event = await rewind(h, Target(to=second, restore="both"))
            assert diff(tree_of(work), after_1) == {}
            assert len(await h.runtime.store.load_messages(SID)) < len(history)
            overview = await h.runtime.rewinds.overview(SID)
            assert [b["branch_id"] for b in overview.branches] == [event.undo]
            assert overview.branches[0]["restore"] == "both"
            # Undo: the branch comes back, chat and files.
            _, undone = await rewind(h, Target(branch=event.undo, restore="both"))
            assert await h.runtime.store.load_messages(SID) == history
            assert await h.runtime.store.load_context(SID) == context
            assert diff(tree_of(work), after_2) == {}
            assert undone.messages_restored == len(history) - 4
            # Redo: the undo left its own branch, and the one brought back is gone.
            overview = await h.runtime.rewinds.overview(SID)
            assert [b["branch_id"] for b in overview.branches] == [undone.undo]
            await rewind(h, Target(branch=undone.undo, restore="both"))
            assert diff(tree_of(work), after_1) == {}
            with pytest.raises(NotFoundError, match="no branch"):
                await h.runtime.rewinds.preview(SID, Target(branch=event.undo))


@pytest.mark.slow
async def test_a_stale_preview_or_a_made_up_token_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    work = workspace(tmp_path)
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=TURN_1 + TURN_2, profiles=PROFILES) as h:
            _, after_2 = await two_turns(h, work)
            history = await h.runtime.store.load_messages(SID)
            _, second = await user_ids(h)
            target = Target(to=second, restore="both")
            preview = await h.runtime.rewinds.preview(SID, target)
            (work / "a.txt").write_text("edited by hand after the preview\n")
            edited = tree_of(work)
            with pytest.raises(ChangedError, match="preview"):
                await h.runtime.rewinds.apply(SID, target, preview.token)
            for token in ("", "x", preview.token.split(".")[0] + ".", "." * 3):
                with pytest.raises(ChangedError):
                    await h.runtime.rewinds.apply(SID, target, token)
            assert tree_of(work) == edited and edited != after_2
            assert await h.runtime.store.load_messages(SID) == history
            for bad in ("m-nope", "i0", "../../etc", "x" * 500):
                with pytest.raises(NotFoundError, match="no user message"):
                    await h.runtime.rewinds.preview(SID, Target(to=bad))


@pytest.mark.slow
async def test_a_fork_copies_history_and_files_and_both_sessions_go_on_on_their_own(
    tmp_path: Path,
) -> None:
    work = workspace(tmp_path)
    replies = [*TURN_1, *TURN_2, say("in the fork"), say("in the source")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            after_1, after_2 = await two_turns(h, work)
            _, second = await user_ids(h)
            store = h.runtime.store
            await store.create_session("s-fork", profile_id="general")
            event = await h.runtime.rewinds.fork(SID, "s-fork", at=second, files=True)
            assert event.new_session_id == "s-fork" and event.folder is not None
            copy = Path(event.folder)
            assert copy.is_relative_to(h.runtime.settings.session_dir("s-fork"))
            assert diff(tree_of(copy), after_1) == {}
            assert tree_of(work) == after_2  # the source's folder is left alone
            row = await store.get_session("s-fork")
            assert row is not None and row.meta["forked_from"] == SID
            assert row.meta["mode"] == "full" and row.profile_id == "general"
            forked = await store.load_messages("s-fork")
            assert [m["content"] for m in forked if m["role"] == "user"] == ["first"]
            await turn(h, "s-fork", "go on here", cwd=copy, user_role="admin")
            assert user_texts(h.chat_requests[-1]) == ["first", "go on here"]
            await turn(h, SID, "and here", cwd=work, **FULL)
            assert user_texts(h.chat_requests[-1]) == ["first", "second", "and here"]
            assert len(await store.load_messages("s-fork")) == len(forked) + 2


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon acts as the tool user")
async def test_a_root_daemons_fork_never_copies_what_the_tool_user_may_not_read(
    tmp_path: Path,
) -> None:
    # Root's own files in the user's folder: a 0600 file and a 0700 folder. The fork's
    # copy goes to the new session's folder, which is the tool user's: it holds the
    # user's files and none of root's, and the checkpoint says why each was left out.
    # (The harness sets no NAVI_TOOL_USER: nobody.)
    work = workspace(tmp_path)
    (work / "secret.txt").write_text("root's only")
    os.chmod(work / "secret.txt", 0o600)
    (work / "vault").mkdir(mode=0o700)
    (work / "vault" / "key.txt").write_text("root's too")
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=TURN_1, profiles=PROFILES) as h:
            await turn(h, SID, "first", cwd=work, **FULL)
            await h.runtime.store.create_session("s-fork", profile_id="general")
            event = await h.runtime.rewinds.fork(SID, "s-fork", files=True)
            assert event.folder is not None
            copy = Path(event.folder)
            assert tree_of(copy) == tree_of(work, skip=["secret.txt", "vault"])
            # And what it holds is the tool user's (nobody's), as a run's own files are.
            session = h.runtime.settings.session_dir("s-fork")
            made = [session, *session.rglob("*")]
            assert {(p.lstat().st_uid, p.lstat().st_gid) for p in made} == {(65534, 65534)}
            # A copy into a folder of root's (0755) is made nowhere: they may not write there.
            closed = tmp_path / "closed"
            closed.mkdir(mode=0o755)
            await h.runtime.store.create_session("s-f2", profile_id="general")
            with pytest.raises(RestoreError, match="the tool user may not make a folder in"):
                await h.runtime.rewinds.fork(SID, "s-f2", files=True, folder=closed / "copy")
            assert await h.runtime.store.get_session("s-f2") is None
            assert list(closed.iterdir()) == []
            infos = await h.runtime.checkpoints.engine.checkpoints(SID)
            left = {(item.path, item.reason) for item in infos[-1].left_out}
    assert left == {
        ("secret.txt", "the tool user may not read it (permission denied)"),
        ("vault", "a folder that cannot be read (Permission denied)"),
    }


async def test_a_files_rewind_to_a_message_after_which_nothing_was_written_changes_nothing(
    tmp_path: Path,
) -> None:
    work = workspace(tmp_path)
    replies = [*TURN_1, say("just talking")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            await turn(h, SID, "first", cwd=work, **FULL)
            await turn(h, SID, "talk", cwd=work, **FULL)
            before = tree_of(work)
            _, talk = await user_ids(h)
            preview, event = await rewind(h, Target(to=talk, restore="files"))
            assert preview.files is None and "no file was changed" in preview.files_note
            assert event.undo == "" and tree_of(work) == before


async def test_a_subagents_writes_are_checkpointed_through_the_same_executor_and_rewound(
    tmp_path: Path,
) -> None:
    work = workspace(tmp_path)
    before = tree_of(work)
    replies = [
        calls(call("spawn_agent", task="write the file")),
        calls(write("by_the_subagent.txt", "s\n")),  # the sub-agent's round
        say("written"),  # the sub-agent's answer
        say("it is done"),
    ]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            frames = await turn(h, SID, "delegate", cwd=work, **FULL)
            created = frames_of(frames, "checkpoint_created")
            assert [f["is_subagent"] for f in created] == [False, True]
            assert created[1]["reused"]  # nothing changed between the two snapshots
            assert (work / "by_the_subagent.txt").exists()
            (delegate,) = await user_ids(h)
            await rewind(h, Target(to=delegate, restore="files"))
            assert tree_of(work) == before


async def test_checkpoints_are_pruned_by_count_and_a_files_rewind_past_them_is_refused(
    tmp_path: Path,
) -> None:
    work = workspace(tmp_path)
    replies = [r for n in range(4) for r in (calls(write(f"n{n}.txt", f"{n}\n")), say(f"{n}"))]
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, profiles=PROFILES, checkpoint_keep=2
        ) as h:  # fmt: skip
            for n in range(4):
                await turn(h, SID, f"message {n}", cwd=work, **FULL)
            engine = h.runtime.checkpoints.engine
            await h.runtime.checkpoints.wait_pruned()  # pruned in the background
            assert len(await engine.checkpoints(SID)) == 2
            first, *_, last = await user_ids(h)
            with pytest.raises(NotFoundError, match="pruned"):
                await h.runtime.rewinds.preview(SID, Target(to=first, restore="files"))
            await rewind(h, Target(to=last, restore="files"))  # still kept
            assert not (work / "n3.txt").exists() and (work / "n2.txt").exists()
            await rewind(h, Target(to=first, restore="chat"))  # the chat needs none
            assert await user_ids(h) == []
            listed = await h.runtime.rewinds.overview(SID)
            assert listed.points == []


async def test_a_chat_preview_is_refused_once_a_message_came_after_it(tmp_path: Path) -> None:
    work = workspace(tmp_path)
    replies = [*TURN_1, say("a second answer")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            await turn(h, SID, "first", cwd=work, **FULL)
            (first,) = await user_ids(h)
            target = Target(to=first, restore="chat")
            preview = await h.runtime.rewinds.preview(SID, target)
            await turn(h, SID, "more", cwd=work, **FULL)
            history = await h.runtime.store.load_messages(SID)
            with pytest.raises(ChangedError, match="changed after the preview"):
                await h.runtime.rewinds.apply(SID, target, preview.token)
            assert await h.runtime.store.load_messages(SID) == history


@pytest.mark.slow
async def test_a_fork_copies_the_working_folder_into_the_new_folder_it_is_given(
    tmp_path: Path,
) -> None:
    work = workspace(tmp_path)
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=TURN_1 + TURN_2, profiles=PROFILES) as h:
            after_1, after_2 = await two_turns(h, work)
            _, second = await user_ids(h)
            copy = tmp_path / "elsewhere" / "copy"
            copy.parent.mkdir()
            await h.runtime.store.create_session("s-f2", profile_id="general")
            event = await h.runtime.rewinds.fork(SID, "s-f2", at=second, files=True, folder=copy)
            assert event.folder == str(copy)
            assert diff(tree_of(copy), after_1) == {}
            # A fork that cannot be made leaves no session behind (the folder exists now).
            await h.runtime.store.create_session("s-f3", profile_id="general")
            with pytest.raises(RestoreError, match="exists"):
                await h.runtime.rewinds.fork(SID, "s-f3", at=second, files=True, folder=copy)
            assert await h.runtime.store.get_session("s-f3") is None
            assert diff(tree_of(copy), after_1) == {} and tree_of(work) == after_2


async def test_a_round_whose_only_writing_call_the_policy_denies_takes_no_checkpoint(
    tmp_path: Path,
) -> None:
    work = workspace(tmp_path)
    denied = {"tool": "filesystem", "action": "write", "decision": "deny"}
    profiles = {"general": {**PROFILES["general"], "policy": {"rules": [denied]}}}
    replies = [calls(write("no.txt", "never\n")), say("denied")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=profiles) as h:
            frames = await turn(h, SID, "try", cwd=work, **FULL)
            (result,) = frames_of(frames, "tool_result")
            assert not result["ok"] and "denies" in result["error"], result
            assert not frames_of(frames, "checkpoint_created"), [f["type"] for f in frames]
            assert await h.runtime.checkpoints.engine.checkpoints(SID) == []
            assert not (work / "no.txt").exists()


class Wall:
    """The checkpoints' clock: now, moved on by `ahead` seconds."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


async def test_a_prune_that_drops_several_checkpoints_refuses_a_files_rewind_to_any_of_them(
    tmp_path: Path,
) -> None:
    work = workspace(tmp_path)
    wall = Wall()
    replies = [r for n in range(3) for r in (calls(write(f"n{n}.txt", f"{n}\n")), say(f"{n}"))]
    hour = 3600.0
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, profiles=PROFILES, checkpoint_wall=wall,
            checkpoint_max_age_sec=hour,
        ) as h:  # fmt: skip
            engine = h.runtime.checkpoints.engine
            for n in range(3):
                if n == 2:
                    # The third checkpoint comes ten hours later: the prune after it
                    # drops the first two at once.
                    assert len(await engine.checkpoints(SID)) == 2
                    wall.ahead = 10 * hour
                await turn(h, SID, f"message {n}", cwd=work, **FULL)
            await h.runtime.checkpoints.wait_pruned()
            assert len(await engine.checkpoints(SID)) == 1
            first, second, third = await user_ids(h)
            for covered in (first, second):
                with pytest.raises(NotFoundError, match="pruned"):
                    await h.runtime.rewinds.preview(SID, Target(to=covered, restore="files"))
            await rewind(h, Target(to=third, restore="files"))
            assert not (work / "n2.txt").exists() and (work / "n1.txt").exists()


async def test_after_21_rewinds_exactly_the_newest_20_branches_remain(tmp_path: Path) -> None:
    replies = [say(f"answer {n}") for n in range(21)]
    undos = []
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            for n in range(21):
                await turn(h, SID, f"message {n}")
                (only,) = await user_ids(h)
                _, event = await rewind(h, Target(to=only, restore="chat"))
                undos.append(event.undo)
            overview = await h.runtime.rewinds.overview(SID)
            assert [b["branch_id"] for b in overview.branches] == undos[1:]


async def test_a_rewind_previewed_before_a_compaction_is_refused_when_applied(
    tmp_path: Path,
) -> None:
    profiles = {"general": {**PROFILES["general"], "compression_keep_recent": 2}}
    replies = [say("one"), say("two"), say("three"), say("the summary")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=profiles) as h:
            for text in ("first", "second", "third"):
                await turn(h, SID, text)
            _, second, _ = await user_ids(h)
            target = Target(to=second, restore="chat")
            preview = await h.runtime.rewinds.preview(SID, target)
            messages = await h.runtime.store.load_messages(SID)
            context = await h.runtime.store.load_context(SID)
            actor = await h.runtime.sessions.get(SID)
            actor.compact()
            await actor.idle.wait()
            # The display history is the same; what the model is sent is not.
            assert await h.runtime.store.load_messages(SID) == messages
            compacted = await h.runtime.store.load_context(SID)
            assert compacted != context and "the summary" in str(compacted)
            with pytest.raises(ChangedError, match="changed after the preview"):
                await h.runtime.rewinds.apply(SID, target, preview.token)
            assert await h.runtime.store.load_context(SID) == compacted


async def cut_fork(h: Harness, copy: Path, at_cut: Callable[[], None]) -> None:
    """A fork of SID at its second message with its files, copied to `copy`, cut short
    once the copies are made (its session row not yet filled), `at_cut` run first."""
    _, second = await user_ids(h)
    store = h.runtime.store
    update = store.update_session
    cut = trio.Event()

    async def copied_then_hang(session_id: str, **fields: Any) -> Any:
        if session_id == "s-cut":  # the copies are made: the fork is cut here
            at_cut()
            cut.set()
            await trio.sleep_forever()
        return await update(session_id, **fields)

    store.update_session = copied_then_hang  # type: ignore[method-assign]
    await store.create_session("s-cut", profile_id="general")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            functools.partial(
                h.runtime.rewinds.fork, SID, "s-cut", at=second, files=True, folder=copy
            )
        )
        await cut.wait()
        nursery.cancel_scope.cancel()
    assert await store.get_session("s-cut") is None
    assert not h.runtime.settings.session_dir("s-cut").exists()


@pytest.mark.slow
async def test_a_fork_cancelled_part_way_leaves_no_session_and_no_copied_folder(
    tmp_path: Path,
) -> None:
    work = workspace(tmp_path)
    copy = tmp_path / "elsewhere" / "copy"
    copy.parent.mkdir()
    made = []
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=TURN_1 + TURN_2, profiles=PROFILES) as h:
            await two_turns(h, work)
            await cut_fork(h, copy, lambda: made.append(copy.is_dir()))
            assert made == [True]
            assert not copy.exists()


@pytest.mark.slow  # its turn runs a sandboxed command
async def test_a_fork_cut_short_removes_its_copy_beneath_its_parent_never_through_a_link(
    tmp_path: Path,
) -> None:
    # The copy is made in `elsewhere`; before the fork ends, `elsewhere` is renamed away
    # and a link to a folder of someone else's holding a `copy` of theirs takes its
    # place. Cut short, the fork removes its own copy (where it went with its parent),
    # and nothing behind the link.
    work = workspace(tmp_path)
    elsewhere = (tmp_path / "elsewhere").resolve()
    elsewhere.mkdir()
    theirs = tmp_path / "theirs"
    (theirs / "copy").mkdir(parents=True)
    (theirs / "copy" / "keep.txt").write_text("someone else's\n")
    moved = tmp_path / "elsewhere-moved"

    def swap() -> None:
        elsewhere.rename(moved)
        elsewhere.symlink_to(theirs)
        assert (moved / "copy" / "a.txt").is_file()  # the copy, moved with its parent

    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=TURN_1 + TURN_2, profiles=PROFILES) as h:
            await two_turns(h, work)
            await cut_fork(h, elsewhere / "copy", swap)
            assert (theirs / "copy" / "keep.txt").read_text() == "someone else's\n"
            assert os.listdir(moved) == []  # the fork's own copy is gone
