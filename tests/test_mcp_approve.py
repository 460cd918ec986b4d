"""Approvals over MCP without a process: the client's answer mapped to an approval, a
client that never answers (bounded by the approval's timeout, on the autojump clock), a
client whose elicitation fails, and the question's size."""

from __future__ import annotations

import trio
import trio.testing

from navi_trio.cli.mcp_approve import QUESTION_MAX, approver, question
from navi_trio.cli.mcp_ask import AskFeed, ProgressPump

FRAME = {"type": "approval_request", "call_id": "c1", "tool": "terminal",
         "summary": "terminal run: rm x", "rule": "mode full", "timeout_sec": 45}  # fmt: skip


def _feed() -> AskFeed:
    async def report(progress: float, line: str) -> None:
        return None

    return AskFeed(ProgressPump(report))


async def test_each_answer_maps_to_an_approval_and_a_scope() -> None:
    for answer, expected in [
        ("allow_once", (True, "once")),
        ("allow_session", (True, "session")),
        ("deny", (False, "once")),
        ("something else", (False, "once")),
    ]:

        async def asker(message: str, answer: str = answer) -> str:
            return answer

        feed = _feed()
        assert await approver(feed, asker)(FRAME) == expected
        assert bool(feed.notes) is (not expected[0])


async def test_a_client_that_never_answers_is_denied_at_the_approval_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def never(message: str) -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    feed = _feed()
    start = trio.current_time()
    with trio.fail_after(100):
        assert await approver(feed, never)(FRAME) == (False, "once")
    assert trio.current_time() - start == 45
    (note,) = feed.notes
    assert note == "denied terminal (terminal run: rm x): the MCP client did not answer within 45 s"


async def test_a_failed_elicitation_denies_with_its_error() -> None:
    async def broken(message: str) -> str:
        raise ValueError("content does not match the requested schema")

    feed = _feed()
    assert await approver(feed, broken)(FRAME) == (False, "once")
    assert "asking the MCP client failed (content does not match" in feed.notes[0]


def test_the_question_is_bounded_and_names_the_parts_and_the_grant() -> None:
    parts = [{"text": "curl x", "decision": "ask"}, {"text": "sh", "decision": "ask"}]
    text = question(FRAME | {"parts": parts, "grant": "`curl` in this workspace"})
    assert "? ask: curl x\n? ask: sh" in text
    assert '"allow_session" allows: `curl` in this workspace' in text
    assert len(question(FRAME | {"summary": "x" * 100_000})) <= QUESTION_MAX
