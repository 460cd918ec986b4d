"""Rewind and fork for the command line and the MCP server, through a daemon's frames
(``checkpoints``, ``rewind``, ``fork``), one request per call.

`resolve_point` turns what a person types for a message into its id: the id itself, or
its number as `navi rewind --list` shows it (1 = the first user message, -1 = the last).
"""

from __future__ import annotations

from typing import Any

from navi_trio import wire
from navi_trio.errors import UsageError

Fields = dict[str, Any]


class Rewinds:
    """Through the daemon at `url`."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token

    async def _ask(self, frame: wire.Frame) -> Fields:
        from navi_trio.api.remote import request

        return await request(self.url, self.token, frame)

    async def overview(self, session_id: str) -> Fields:
        return await self._ask(wire.checkpoints(session_id))

    async def preview(self, session_id: str, target: Fields) -> Fields:
        return await self._ask(wire.rewind(session_id, **target))

    async def apply(self, session_id: str, target: Fields, token: str) -> Fields:
        return await self._ask(wire.rewind(session_id, **target, confirm=token))

    async def fork(
        self,
        session_id: str,
        *,
        at: str | None,
        files: bool,
        folder: str | None,
        new_session_id: str | None,
    ) -> Fields:
        frame = wire.fork(
            session_id, at=at, files=files, folder=folder, new_session_id=new_session_id
        )
        return await self._ask(frame)


def resolve_point(overview: Fields, given: str) -> str:
    """A message id from what a person typed: the id, or its number (1 = first, -1 = last)."""
    messages = list(overview.get("messages") or [])
    ids = [str(m.get("message_id")) for m in messages]
    if given in ids:
        return given
    try:
        number = int(given)
    except ValueError:
        return given  # an id of an older message: the daemon checks it
    more = int(overview.get("more_messages") or 0)
    index = number - 1 - more if number > 0 else number
    if number == 0 or not -len(ids) <= index < len(ids):
        raise UsageError(
            f"message number {number} is not listed: the session has "
            f"{len(ids) + more} user message(s) (`navi rewind --list` numbers them)"
        )
    return ids[index]
