"""The per-run ContextVars the spec names, and one way to set and reset them.

A sub-agent's child task runs in a copy of the context, so it cannot leak into its
parent; `bound()` still resets on every exit so later code in the task sees no stale value.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from pathlib import Path
from typing import Any

current_session_id: ContextVar[str | None] = ContextVar("current_session_id", default=None)
current_model: ContextVar[str | None] = ContextVar("current_model", default=None)
current_working_directory: ContextVar[Path | None] = ContextVar(
    "current_working_directory", default=None
)
current_user_id: ContextVar[str | None] = ContextVar("current_user_id", default=None)
current_user_role: ContextVar[str | None] = ContextVar("current_user_role", default=None)
current_user_info: ContextVar[dict[str, Any] | None] = ContextVar("current_user_info", default=None)

ALL: dict[str, ContextVar[Any]] = {
    "session_id": current_session_id,
    "model": current_model,
    "working_directory": current_working_directory,
    "user_id": current_user_id,
    "user_role": current_user_role,
    "user_info": current_user_info,
}


def snapshot() -> dict[str, Any]:
    """The current value of every run variable (tests compare before/after)."""
    return {name: var.get() for name, var in ALL.items()}


@contextmanager
def bound(**values: Any) -> Iterator[None]:
    """Set the named run variables for the duration of the block, then restore them."""
    tokens: list[tuple[ContextVar[Any], Token[Any]]] = []
    try:
        for name, value in values.items():
            var = ALL[name]
            tokens.append((var, var.set(value)))
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)
