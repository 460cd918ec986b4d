"""The symlink race of issue 17, item 3: while another process swaps a folder ``d`` and
a symlink to somewhere forbidden with ``renameat2(RENAME_EXCHANGE)`` as fast as it can,
the filesystem tool reads ``d/…`` and writes ``d/pwn.txt`` again and again. Every read
gives the folder's own file or a refusal, never the forbidden one, and nothing is
created where the symlink points. The old check-then-open code leaked here (see the
issue: 22 of 100 reads, and the admin token 282 times in about 2,500 reads).

Bounded: a fixed number of calls, the swapper stops by itself after a minute at most
and is killed when the test ends, every test has an absolute deadline. The daemon test
drives the same race through a real WebSocket daemon with two users: Bob's scripted
model makes the calls in his session folder, and Alice's file and the admin token
never reach Bob (his frames) nor the model (its requests).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import of_type, with_tools
from api_ws import open_daemon
from fsrace import skip_reason, swapping
from kvfake import make_ctx

from navi_trio.api.auth import ensure_local_token
from navi_trio.core.turn.tool_executor import run_tool
from navi_trio.tools.base import ToolContext
from navi_trio.tools.filesystem import FilesystemTool

pytestmark = pytest.mark.slow  # its tests start processes

CALLS = 150  # reads and as many writes per test
DEADLINE = 120


@pytest.fixture(autouse=True)
def _needs_rename_exchange(tmp_path: Path) -> None:
    if (reason := skip_reason(tmp_path)) is not None:
        pytest.skip(reason)


def plant(root: Path, target: Path, secret: str) -> None:
    (root / "d").mkdir(parents=True)
    (root / "d" / secret).write_text("the folder's own file\n")
    target.mkdir(exist_ok=True)
    (target / secret).write_text("forbidden\n")
    (root / "x").symlink_to(target)


async def race(ctx: ToolContext, target: Path, secret: str) -> None:
    """In the session folder, swap a folder d (holding its own `secret`) with a symlink
    x to `target` (holding the forbidden one) while reading d/`secret` and writing
    d/pwn.txt CALLS times each; check that nothing leaked."""
    root = ctx.session_dir
    plant(root, target, secret)
    tool = FilesystemTool()
    seen = {"inside": 0, "leaked": 0, "refused": 0}
    with trio.fail_after(DEADLINE):
        async with swapping(root / "d", root / "x"):
            for _ in range(CALLS):
                # As the agent runs it: an exception becomes a failed result.
                read = await run_tool(
                    tool, {"action": "read", "path": str(root / "d" / secret)}, ctx
                )
                if read.ok:
                    seen["leaked" if "forbidden" in read.output else "inside"] += 1
                else:
                    seen["refused"] += 1
                    assert "forbidden" not in read.content()
                write = {"action": "write", "path": str(root / "d" / "pwn.txt"), "content": "x"}
                await run_tool(tool, write, ctx)
    assert seen["leaked"] == 0, seen
    assert not (target / "pwn.txt").exists()
    # Both sides of the swap were met: the race really ran.
    assert seen["inside"] and seen["refused"], seen


async def test_a_folder_swapped_with_a_symlink_outside_never_leaks(tmp_path: Path) -> None:
    await race(make_ctx(tmp_path), tmp_path / "outside", "secret.txt")


async def test_a_folder_swapped_with_a_symlink_to_navis_data_never_leaks(
    tmp_path: Path,
) -> None:
    # The cwd holds the data folder, so the symlink's target is inside a root: only the
    # check of navi's own data stands in the way.
    await race(make_ctx(tmp_path, cwd=tmp_path), tmp_path / "data", "local-token")


def fs_call(action: str, path: str, **extra: Any) -> dict[str, Any]:
    return {"name": "filesystem", "arguments": {"action": action, "path": path, **extra}}


async def test_through_a_daemon_bobs_race_never_reaches_alices_file_or_the_admin_token(
    tmp_path: Path,
) -> None:
    reads_per_kind = 60
    replies: list[dict[str, Any]] = [{"text": "noted"}]  # Alice's turn
    with trio.fail_after(DEADLINE):
        # Checkpoints off: the swapper floods the session folder's watch, and each
        # write's checkpoint boundary drained thousands of moves (0.3-0.5 s a write, a
        # minute in all); the tool's checks, which this race is about, are the same.
        async with open_daemon(
            tmp_path, replies=replies, num_ctx=1 << 22, checkpoints=False,
            profiles={"general": with_tools(["filesystem"], planning_first_message=False)},
        ) as d:  # fmt: skip
            settings = d.harness.runtime.settings
            token_file = await ensure_local_token(d.harness.runtime.store, settings.data_dir)
            token = token_file.read_text().strip()
            async with d.connect("alice") as alice, d.connect("bob") as bob:
                made = await alice.request({"type": "message", "content": "keep my notes"})
                alice_sid = made["session_id"]
                await alice.until_end(alice_sid)
                alice_dir = settings.session_dir(alice_sid)
                alice_dir.mkdir(parents=True, exist_ok=True)
                (alice_dir / "secret.txt").write_text("alice's secret notes\n")

                created = await bob.request({"type": "sessions", "action": "create"})
                bob_sid = created["session_id"]
                bob_dir = settings.session_dir(bob_sid)
                decoy = bob_dir / "d"
                (decoy / "sessions" / alice_sid).mkdir(parents=True)
                (decoy / "local-token").write_text("bob's own token file\n")
                (decoy / "sessions" / alice_sid / "secret.txt").write_text("bob's own notes\n")
                (bob_dir / "x").symlink_to(settings.data_dir)
                calls = []
                for _ in range(reads_per_kind):
                    calls.append(fs_call("read", "d/local-token"))
                    calls.append(fs_call("read", f"d/sessions/{alice_sid}/secret.txt"))
                    calls.append(fs_call("write", "d/pwn.txt", content="x"))
                d.harness.add_replies({"tool_calls": calls}, {"text": "done"})
                async with swapping(decoy, bob_dir / "x"):
                    sent = await bob.request(
                        {"type": "message", "session_id": bob_sid, "content": "go"}
                    )
                    assert sent["type"] == "ok", sent
                    end = await bob.until_end(bob_sid)
            assert end["text"] == "done"
            results = of_type(bob.frames, "tool_result")
            assert len(results) == len(calls)
            wire = json.dumps(bob.frames) + json.dumps(d.harness.chat_requests)
            assert token not in wire
            assert "alice's secret" not in wire
            reads = [r for r, c in zip(results, calls, strict=True)
                     if c["arguments"]["action"] == "read"]  # fmt: skip
            own = [r for r in reads if r["ok"]]
            refused = [r for r in reads if not r["ok"]]
            assert all("bob's own" in str(r) for r in own), own
            errors = sorted({r["error"] for r in refused})
            assert all("symlink" in e for e in errors), errors
            assert own and refused, "the swap was never met: the race did not run"
    assert not (settings.data_dir / "pwn.txt").exists()
    assert not (alice_dir / "pwn.txt").exists()
    assert (alice_dir / "secret.txt").read_text() == "alice's secret notes\n"
