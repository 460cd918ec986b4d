"""The chat's status line: session, profile, model, context size, connection.

Shown under each answer and, with what the run is doing now, in the prompt's toolbar.
"""

from __future__ import annotations

import attrs


@attrs.define
class Status:
    session_id: str | None = None
    # The session's profile as the daemon reports it (`sessions list`); for a session
    # not created yet, the one asked for with /profile (None: the daemon's default).
    profile: str | None = None
    model: str | None = None
    context_tokens: int | None = None
    # The budget nearest its limit, from the run's last `budget` event ("turn tokens
    # 1200/5000"); None: no budget applies.
    budget: str | None = None
    connected: bool = False
    activity: str = ""  # what the run is doing now ("answering… 42 words"), toolbar only

    def toolbar(self) -> str:
        return f"{self.activity} │ {self.line()}" if self.activity else self.line()

    def line(self) -> str:
        parts = [
            f"session {self.session_id or '(new)'}",
            f"profile {self.profile or ('(default)' if self.session_id is None else '?')}",
            f"model {self.model or '?'}",
        ]
        if self.context_tokens is not None:
            parts.append(f"context {self.context_tokens} tokens")
        if self.budget is not None:
            parts.append(f"budget {self.budget}")
        if not self.connected:
            parts.append("disconnected")
        return " · ".join(parts)
