"""The log lines of one run: `RunLog`, kept by the session actor."""

from __future__ import annotations

import logging

import trio

from navi_trio.core.turn import UserMessage
from navi_trio.events import (
    AgentEvent,
    ErrorEvent,
    StreamEnd,
    TextDelta,
    ThinkingDelta,
    ToolResultEvent,
)

# The session actor's logger: operators filter on it (and the tests read it).
log = logging.getLogger("navi_trio.core.session.session_actor")


class RunLog:
    """The log lines of one run, at INFO with the session and user: its start and end, each
    tool call and each error event."""

    def __init__(self, session_id: str, msg: UserMessage) -> None:
        info = msg.user_info or {}
        self.session_id = session_id
        self.user = str(info.get("name") or msg.user_id)
        self.reason = "cancelled"  # no StreamEnd: the runtime was shut down under it
        self.last: StreamEnd | None = None  # the run's own stream_end
        self.started = trio.current_time()
        log.info("session %s: run started (user %s)", session_id, self.user)

    def event(self, event: AgentEvent) -> None:
        # Called for every event of the run, deltas included: only these three are read.
        if type(event) is TextDelta or type(event) is ThinkingDelta:  # a token: none of them
            return
        if isinstance(event, ToolResultEvent):
            log.info(
                "%s: tool %s %s in %d ms (user %s)",
                self._where(event),
                event.name,
                "ok" if event.ok else "failed",
                event.duration_ms,
                self.user,
            )
        elif isinstance(event, ErrorEvent):
            log.info(
                "%s: error [%s] %s (user %s)",
                self._where(event),
                event.code,
                event.message,
                self.user,
            )
        elif isinstance(event, StreamEnd) and not event.is_subagent:
            self.reason = event.reason
            self.last = event

    def _where(self, event: AgentEvent) -> str:
        sub = f" [{event.agent_id or 'sub-agent'}]" if event.is_subagent else ""
        return f"session {self.session_id}{sub}"

    def end(self) -> None:
        took = trio.current_time() - self.started
        log.info(
            "session %s: run ended: %s in %.2f s (user %s)",
            self.session_id,
            self.reason,
            took,
            self.user,
        )
