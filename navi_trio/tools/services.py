"""What tools need from the core, as Protocols.

The core passes one services object as ``ToolContext.services``. Tools look up the
attributes below and cope when `services` is None or lacks one (a failed result saying
the feature "is not available here", e.g. inside a sub-agent without it):

- ``ctx.services.switch_profile(profile_id)`` — `ProfileSwitcher`: switch the session's
  profile from the next iteration on; raises `ToolInputError` for an unknown id.
- ``ctx.services.processes`` — `ProcessService` (implemented by
  `navi_trio.tools.procs.ProcessPool`): the persistent processes of ``terminal open``.

Other services (spawn_agent, tasks) are described by the modules that use them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from navi_trio.tools.base import ToolResult
from navi_trio.tools.procs import ProcessInfo, ReadResult


class ProfileSwitcher(Protocol):
    def switch_profile(self, profile_id: str) -> None: ...


class ProcessService(Protocol):
    async def open(self, session_id: str, command: str, cwd: Path) -> str: ...

    async def read(
        self, session_id: str, handle_id: str, max_chars: int, wait: float = 0.0
    ) -> ReadResult: ...

    async def write(
        self, session_id: str, handle_id: str, text: str, eof: bool = False
    ) -> None: ...

    async def kill(self, session_id: str, handle_id: str) -> ReadResult: ...

    def list(self, session_id: str) -> list[ProcessInfo]: ...


def get_service(services: Any, name: str) -> Any | None:
    """`services.<name>`, or None when there are no services or not that one."""
    if services is None:
        return None
    return getattr(services, name, None)


def unavailable(what: str) -> ToolResult:
    return ToolResult.fail(f"{what} is not available here")
