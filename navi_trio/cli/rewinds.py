"""Rewind and fork for the command line and the MCP server: one face, two ways there.

`RemoteRewinds` speaks the daemon's frames (``checkpoints``, ``rewind``, ``fork``: docs/pages/
protocol.md), one request per call; `LocalRewinds` calls a runtime of this
process (`Runtime.rewinds`, the same core the daemon's frames reach). Both answer with
the daemon's reply fields (api/checkpoint_frames.py builds them for both), so whoever
prints them (cli/rewind.py, cli/mcp_server.py) does not know which it had.

A rewind's target is the frame's fields: ``to`` or ``branch``, ``restore``, ``conflicts``.

`resolve_point` turns what a person types for a message into its id: the id itself, or
its number as `navi rewind --list` shows it (1 = the first user message, -1 = the last).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from navi_trio import wire
from navi_trio.errors import NotFoundError, UsageError

if TYPE_CHECKING:
    from navi_trio.runtime import Runtime

Fields = dict[str, Any]


class Rewinds(Protocol):
    async def overview(self, session_id: str) -> Fields: ...
    async def preview(self, session_id: str, target: Fields) -> Fields: ...
    async def apply(self, session_id: str, target: Fields, token: str) -> Fields: ...
    async def fork(
        self,
        session_id: str,
        *,
        at: str | None,
        files: bool,
        folder: str | None,
        new_session_id: str | None,
    ) -> Fields: ...


class RemoteRewinds:
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


class LocalRewinds:
    """In a runtime of this process (the person at the shell owns its database)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def _known(self, session_id: str) -> None:
        if await self.rt.store.get_session(session_id) is None:
            raise NotFoundError(f"no session {session_id!r} (in {self.rt.settings.db_path})")

    async def overview(self, session_id: str) -> Fields:
        from navi_trio.api.checkpoint_frames import overview_fields

        await self._known(session_id)
        found = await self.rt.rewinds.overview(session_id)
        return {"session_id": session_id, **overview_fields(found)}

    async def preview(self, session_id: str, target: Fields) -> Fields:
        from navi_trio.api.checkpoint_frames import preview_fields
        from navi_trio.core.rewind import Target

        await self._known(session_id)
        preview = await self.rt.rewinds.preview(session_id, Target(**target))
        return {"session_id": session_id, "action": "preview", **preview_fields(preview)}

    async def apply(self, session_id: str, target: Fields, token: str) -> Fields:
        from navi_trio.api.checkpoint_frames import done_fields
        from navi_trio.core.rewind import Target

        await self._known(session_id)
        event = await self.rt.rewinds.apply(session_id, Target(**target), token)
        return {"session_id": session_id, "action": "done", **done_fields(event)}

    async def fork(
        self,
        session_id: str,
        *,
        at: str | None,
        files: bool,
        folder: str | None,
        new_session_id: str | None,
    ) -> Fields:
        from navi_trio.cli.runner import new_session_id as new_id

        await self._known(session_id)
        source = await self.rt.store.get_session(session_id)
        assert source is not None
        row = await self.rt.store.create_session(
            new_session_id or new_id(), profile_id=source.profile_id, user_id=source.user_id
        )
        dest = Path(folder) if folder is not None else None
        event = await self.rt.rewinds.fork(session_id, row.id, at=at, files=files, folder=dest)
        return {
            "session_id": session_id,
            "new_session_id": row.id,
            "at": event.at,
            "messages": event.messages,
            "folder": event.folder,
            "left_out": list(event.left_out),
        }


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
