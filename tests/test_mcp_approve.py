"""Approvals over MCP without a process: the client's answer mapped to an approval, a
client that never answers (bounded by the approval's timeout, on the autojump clock), a
client whose elicitation fails, the question's size; and the "input required" rounds
of the newest protocol: a parked run asked round by round, a round nobody answers, a
cancelled round, the bound on parked asks."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitResult,
    InputRequiredResult,
    InputResponse,
    TextContent,
)

from navi_trio.cli.mcp_approve import QUESTION_MAX, approver, question
from navi_trio.cli.mcp_ask import AskFeed, ProgressPump
from navi_trio.cli.mcp_rounds import Parked, Rounds, answer_of

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


# -- "input required" rounds (cli/mcp_rounds.py), the runs faked by `approver` alone ----


def _ran(decided: list[tuple[bool, str]]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=repr(decided))])


def _state(result: object) -> str:
    assert isinstance(result, InputRequiredResult) and result.request_state is not None
    return result.request_state


def _accept(answer: str) -> dict[str, InputResponse]:
    return {"approval": ElicitResult(action="accept", content={"answer": answer})}


async def _quiet(progress: float, line: str) -> None:
    return None


async def test_a_parked_run_asks_round_by_round_and_ends_with_its_answer() -> None:
    async with trio.open_nursery() as nursery:
        rounds = Rounds(nursery)

        async def body(parked: Parked) -> CallToolResult:
            decide = approver(_feed(), parked.ask)
            return _ran([await decide(FRAME), await decide(FRAME)])

        first = await rounds.serve(rounds.start(body), _quiet)
        assert isinstance(first, InputRequiredResult) and first.input_requests is not None
        request = first.input_requests["approval"]
        assert isinstance(request, ElicitRequest) and "terminal run: rm x" in request.params.message
        second = await rounds.resume(_state(first), _accept("allow_session"), _quiet)
        # An answer to the first question again (a replayed round) changes nothing.
        assert not isinstance(
            await rounds.resume(_state(first), _accept("deny"), _quiet), CallToolResult
        )
        done = await rounds.resume(
            _state(second), {"approval": ElicitResult(action="decline")}, _quiet
        )
        assert isinstance(done, CallToolResult)
        assert done.content[0].text == "[(True, 'session'), (False, 'once')]"  # type: ignore[union-attr]
        assert len(rounds) == 0  # its answer taken, it is gone
        with pytest.raises(ToolError, match="no longer known"):
            await rounds.resume(_state(second), _accept("allow_once"), _quiet)


async def test_a_round_nobody_answers_is_denied_at_the_approval_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        rounds = Rounds(nursery)
        feed = _feed()

        async def body(parked: Parked) -> CallToolResult:
            return _ran([await approver(feed, parked.ask)(FRAME)])

        asked = await rounds.serve(rounds.start(body), _quiet)
        start = trio.current_time()
        await trio.sleep(46)  # the client's user thinks past timeout_sec (45)
        # The late answer is for an approval that is over: the run was denied.
        done = await rounds.resume(_state(asked), _accept("allow_once"), _quiet)
        assert isinstance(done, CallToolResult)
        assert done.content[0].text == "[(False, 'once')]"  # type: ignore[union-attr]
        assert trio.current_time() - start == 46
        assert feed.notes == [
            "denied terminal (terminal run: rm x): the MCP client did not answer within 45 s"
        ]


async def test_a_cancelled_round_stops_the_run_and_parked_asks_are_bounded() -> None:
    async with trio.open_nursery() as nursery:
        rounds = Rounds(nursery, limit=2)
        stopped = trio.Event()

        async def body(parked: Parked) -> CallToolResult:
            parked.stop = stopped.set
            await approver(_feed(), parked.ask)(FRAME)
            await stopped.wait()
            return _ran([])

        asked = await rounds.serve(rounds.start(body), _quiet)
        with trio.move_on_after(1) as scope:  # the client cancels the next call
            scope.cancel()
            await rounds.resume(_state(asked), _accept("allow_once"), _quiet)
        assert stopped.is_set()
        await trio.testing.wait_all_tasks_blocked()  # the run ended; nobody took it
        second = rounds.start(body)
        await rounds.serve(second, _quiet)
        assert len(rounds) == 2
        third = rounds.start(body)  # room made: the ended, untaken one is dropped
        assert len(rounds) == 2
        await rounds.serve(third, _quiet)
        with pytest.raises(ToolError, match="2 asks already wait"):
            rounds.start(body)
        nursery.cancel_scope.cancel()


async def test_a_parked_ask_that_fails_says_why_and_is_gone() -> None:
    async with trio.open_nursery() as nursery:
        rounds = Rounds(nursery)

        async def body(parked: Parked) -> CallToolResult:
            raise ToolError("cwd '/nope' is not a directory")

        with pytest.raises(ToolError, match="is not a directory"):
            await rounds.serve(rounds.start(body), _quiet)
        assert len(rounds) == 0


def test_an_answer_is_the_form_s_choice_else_deny() -> None:
    assert answer_of(_accept("allow_once")) == "allow_once"
    assert answer_of(_accept("maybe")) == "deny"
    assert answer_of({"approval": ElicitResult(action="cancel")}) == "deny"
    assert (
        answer_of({"other": ElicitResult(action="accept", content={"answer": "allow_once"})})
        == "deny"
    )
    assert answer_of(None) == "deny"
