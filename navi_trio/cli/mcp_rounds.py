"""Approvals over MCP on the 2026-07-28 protocol: an `ask` in "input required" rounds.

A client on that protocol takes no request from the server during a call: a call that
needs input returns "input required" with the questions and an opaque state (sealed by
the SDK, so a client cannot forge another's), and the client calls again with the
answers. The run goes on meanwhile, parked in the server's nursery (`Rounds`).

An approval nobody answers is denied at the approval timeout; a call cancelled while it
waits stops the run; an ended run whose result no call took is dropped when room is
needed (`MAX_PARKED` at most).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable

import attrs
import trio
from mcp.server.elicitation import render_elicitation_schema
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    InputResponses,
)
from pydantic import ValidationError

from navi_trio.cli.mcp_approve import ApprovalAnswer

log = logging.getLogger(__name__)

KEY = "approval"  # the name of the one question of a round
MAX_PARKED = 16  # asks of one server whose runs go on between calls
GONE = (
    "this ask is no longer known (its answer was taken, it was dropped for room, or the "
    "server restarted): call ask again"
)

Report = Callable[[float, str], Awaitable[None]]


@attrs.define(eq=False)
class Parked:
    """One ask whose run goes on between its calls: the approval it waits on, if any,
    and its end."""

    key: str
    question: str | None = None  # the approval waiting for the client's answer
    serial: int = 0  # which approval of the run it is: a late answer is for an older one
    result: CallToolResult | None = None
    error: str | None = None
    stop: Callable[[], object] | None = None  # stops the run, once it runs
    waiting: bool = False  # a call waits on it
    report_to: Report | None = None  # the progress of the call that waits, if one does
    _answer: str = "deny"
    _answered: trio.Event = attrs.field(factory=trio.Event)
    _changed: trio.Event = attrs.field(factory=trio.Event)

    @property
    def ended(self) -> bool:
        return self.result is not None or self.error is not None

    def set_stop(self, stop: Callable[[], object]) -> None:
        """The run's stop, once it runs (a cancelled call uses it)."""
        self.stop = stop

    def signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def ask(self, message: str) -> str:
        """The run's asker (`mcp_approve.approver`): until a call brings the answer."""
        self.serial += 1
        self.question, self._answer, self._answered = message, "deny", trio.Event()
        self.signal()
        try:
            await self._answered.wait()
        finally:
            self.question = None  # answered, or timed out: no call may answer it now
        return self._answer

    def answer(self, serial: int, answer: str) -> None:
        """The client's answer to approval `serial`; dropped when that one is over."""
        if self.question is not None and serial == self.serial and not self._answered.is_set():
            self._answer = answer
            self._answered.set()

    async def report(self, progress: float, line: str) -> None:
        """Progress goes to the call that waits; between calls, nowhere."""
        if self.report_to is not None:
            await self.report_to(progress, line)

    async def next(self) -> CallToolResult | tuple[str, int]:
        """Until the run ends (its result) or asks (the question and its serial)."""
        while True:
            if self.result is not None:
                return self.result
            if self.error is not None:
                raise ToolError(self.error)
            if self.question is not None and not self._answered.is_set():
                return self.question, self.serial
            await self._changed.wait()


class Rounds:
    """The parked asks of one server, their runs in its nursery."""

    def __init__(self, nursery: trio.Nursery, limit: int = MAX_PARKED) -> None:
        self._nursery = nursery
        self._limit = limit
        self._parked: dict[str, Parked] = {}

    def __len__(self) -> int:
        return len(self._parked)

    def start(self, body: Callable[[Parked], Awaitable[CallToolResult]]) -> Parked:
        """Park a new ask: `body` runs it (its approvals asked through `Parked.ask`)."""
        self._make_room()
        parked = Parked(secrets.token_urlsafe(16))
        self._parked[parked.key] = parked
        self._nursery.start_soon(self._run, parked, body)
        return parked

    def _make_room(self) -> None:
        for key, parked in list(self._parked.items()):  # oldest first
            if len(self._parked) < self._limit:
                return
            if parked.ended and not parked.waiting:
                del self._parked[key]
        if len(self._parked) >= self._limit:
            raise ToolError(
                f"{self._limit} asks already wait for their client's answers; answer or "
                "cancel one first"
            )

    @staticmethod
    async def _run(parked: Parked, body: Callable[[Parked], Awaitable[CallToolResult]]) -> None:
        try:
            parked.result = await body(parked)
        except* ToolError as group:
            parked.error = "; ".join(str(exc) for exc in group.exceptions)
        except* Exception as group:  # a bug must not end the server: the call says it
            log.error("an ask in input-required rounds failed", exc_info=group)
            parked.error = "the ask failed: " + "; ".join(
                f"{type(exc).__name__}: {exc}" for exc in group.exceptions
            )
        finally:
            if not parked.ended:
                parked.error = "the server stopped the ask"
            parked.signal()

    async def serve(self, parked: Parked, report: Report) -> CallToolResult | InputRequiredResult:
        """One call of `parked`: its result, or the next approval as "input required".
        A cancelled call stops the run."""
        parked.waiting, parked.report_to = True, report
        try:
            event = await parked.next()
        except trio.Cancelled:
            if parked.stop is not None:
                parked.stop()
            raise
        except ToolError:  # the ask failed (bad arguments, no daemon): said, and gone
            self._parked.pop(parked.key, None)
            raise
        finally:
            parked.waiting, parked.report_to = False, None
        if isinstance(event, CallToolResult):
            self._parked.pop(parked.key, None)
            return event
        question, serial = event
        form = ElicitRequestFormParams(
            message=question, requested_schema=render_elicitation_schema(ApprovalAnswer)
        )
        return InputRequiredResult(
            input_requests={KEY: ElicitRequest(params=form)},
            request_state=f"{parked.key}:{serial}",
        )

    async def resume(
        self, state: str, responses: InputResponses | None, report: Report
    ) -> CallToolResult | InputRequiredResult:
        """A call that answers a round: the answer to its run, then as `serve`."""
        key, _, serial = state.partition(":")
        parked = self._parked.get(key)
        if parked is None:
            raise ToolError(GONE)
        if serial.isdigit():
            parked.answer(int(serial), answer_of(responses))
        return await self.serve(parked, report)


def answer_of(responses: InputResponses | None) -> str:
    """The client's answer to the round's approval: its choice when it accepted the
    form, else "deny" (declined, cancelled, missing, or not the form's shape)."""
    response = (responses or {}).get(KEY)
    if not isinstance(response, ElicitResult) or response.action != "accept":
        return "deny"
    try:
        return ApprovalAnswer.model_validate(response.content or {}).answer
    except ValidationError:
        return "deny"
