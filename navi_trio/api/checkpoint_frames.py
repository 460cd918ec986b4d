"""The ``checkpoints``, ``rewind`` and ``fork`` frames: owner checks, then the core's rewinds.

A user rewinds, forks and lists only their own sessions (an admin any): every frame is
checked against the sender first (`Commands._owned`); message and branch ids are looked
up in that session's own history, never trusted. What a rewind or fork touches is
checked against the sender too (`Asker`): a folder they may not use now is left out and
named (``roots_left_out`` / ``left_out``). A fork is a new session of the sender (the
per-user limit applies), and a `folder` for its copy must not exist and lie in a folder
the sender may use as a cwd. The work runs beside the connection's reader (a restore can
take seconds). The frames are in docs/pages/protocol.md ("Checkpoints").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from navi_trio.api.protocol import Checkpoints, Fork, RequestId, Rewind, reply
from navi_trio.core.checkpoints import NOT_COVERED, Preview
from navi_trio.core.history import Asker, NewFolder, Overview, RewindPreview, Target
from navi_trio.errors import ExistsError, ProtocolError
from navi_trio.events import Rewound

if TYPE_CHECKING:  # commands imports this module
    from navi_trio.api.commands import Commands

CHANGES_LISTED = 50
KEPT_LISTED = 20
CONFLICTS_LISTED = 50


def overview_fields(overview: Overview) -> dict[str, Any]:
    return {
        "messages": overview.points,
        "more_messages": overview.more_points,
        "checkpoints": overview.checkpoints,
        "branches": overview.branches,
    }


def files_fields(files: Preview) -> dict[str, Any]:
    """An engine preview as a frame carries it (the first paths of each root)."""
    return {
        "checkpoint": files.checkpoint,
        "undo": files.undo,
        "undo_skipped": files.undo_skipped,
        "not_covered": files.not_covered,
        "roots": [
            {
                "root": str(r.root),
                "restored": r.restored,
                "created": r.created,
                "deleted": r.deleted,
                "modes": r.modes,
                "dirs_created": r.dirs_created,
                "dirs_deleted": r.dirs_deleted,
                "bytes": r.bytes,
                "changes": [{"path": c.path, "what": c.what} for c in r.changes[:CHANGES_LISTED]],
                "more_changes": max(0, len(r.changes) - CHANGES_LISTED),
                "kept": [{"path": k.path, "why": k.why} for k in r.kept[:KEPT_LISTED]],
                "kept_count": r.kept_count,
                "conflicts": list(r.conflicts[:CONFLICTS_LISTED]),
                "conflicts_count": r.conflicts_count,
                "others": list(r.others[:CONFLICTS_LISTED]),
                "others_count": r.others_count,
            }
            for r in files.roots
        ],
    }


def preview_fields(preview: RewindPreview) -> dict[str, Any]:
    t = preview.target
    return {
        "to": t.to,
        "branch": t.branch,
        "restore": t.restore,
        "conflicts": t.conflicts,
        "messages_removed": preview.messages_removed,
        "messages_restored": preview.messages_restored,
        "text": preview.text,
        "files": None if preview.files is None else files_fields(preview.files),
        "files_note": preview.files_note,
        "not_covered": NOT_COVERED if t.files else "",
        "roots_left_out": [{"root": root, "why": why} for root, why in preview.left_out],
        "token": preview.token,
    }


def done_fields(event: Rewound) -> dict[str, Any]:
    """A rewind that was applied, as its reply carries it."""
    return {
        "to": event.to,
        "branch": event.branch,
        "restore": event.restore,
        "undo": event.undo,
        "messages_removed": event.messages_removed,
        "messages_restored": event.messages_restored,
        "files": event.files,
        "failed": list(event.failed),
    }


class CheckpointCommands:
    """The three frames, for one connection's `Commands` (its user, its runtime)."""

    def __init__(self, commands: Commands) -> None:
        self.c = commands

    async def overview(self, rid: RequestId, cmd: Checkpoints) -> None:
        await self.c._owned(cmd.session_id)

        async def work() -> None:
            found = await self.c.rt.rewinds.overview(cmd.session_id)
            await self.c.conn.send(
                reply(rid, "checkpoints", session_id=cmd.session_id, **overview_fields(found))
            )

        await self.c.conn.defer(rid, work)

    def _asker(self) -> Asker:
        return Asker(self.c.user.id, self.c.user.role)

    async def rewind(self, rid: RequestId, cmd: Rewind) -> None:
        await self.c._owned(cmd.session_id)
        target = Target(restore=cmd.restore, to=cmd.to, branch=cmd.branch, conflicts=cmd.conflicts)
        rewinds = self.c.rt.rewinds
        asker = self._asker()

        async def work() -> None:
            if cmd.confirm is None:
                preview = await rewinds.preview(cmd.session_id, target, asker)
                fields = preview_fields(preview)
                await self.c.conn.send(
                    reply(rid, "rewind", action="preview", session_id=cmd.session_id, **fields)
                )
                return
            event = await rewinds.apply(cmd.session_id, target, cmd.confirm, asker)
            await self.c.conn.send(
                reply(rid, "rewind", action="done", session_id=cmd.session_id, **done_fields(event))
            )

        await self.c.conn.defer(rid, work)

    async def fork(self, rid: RequestId, cmd: Fork) -> None:
        await self.c._owned(cmd.session_id)
        if cmd.folder is not None and not cmd.files:
            raise ProtocolError("a fork's folder is for its copy of the files: add files: true")
        folder = None
        if cmd.folder is not None:
            folder = await self._folder(cmd.folder, cmd.new_session_id)
        try:
            row = await self.c._create(cmd.new_session_id, None)
        except BaseException:
            if folder is not None:
                folder.parent.close()
            raise
        asker = self._asker()

        async def work() -> None:
            try:
                event = await self.c.rt.rewinds.fork(
                    cmd.session_id,
                    row.id,
                    at=cmd.at,
                    files=cmd.files,
                    folder=folder,
                    asker=asker,
                )
            finally:
                if folder is not None:
                    folder.parent.close()
            await self.c.conn.send(
                reply(
                    rid,
                    "fork",
                    session_id=cmd.session_id,
                    new_session_id=row.id,
                    at=event.at,
                    messages=event.messages,
                    folder=event.folder,
                    left_out=list(event.left_out),
                )
            )

        try:
            await self.c.conn.defer(rid, work)
        except BaseException:
            if folder is not None:
                folder.parent.close()  # (never started: its work closes it otherwise)
            raise

    async def _folder(self, raw: str, session_id: str | None) -> NewFolder:
        """The new folder a fork's copy goes to: not there yet, in a folder the sender
        may use as a cwd of the new session `session_id` (the same check as a message's
        cwd), held open from this check on (the caller closes it)."""
        path = Path(raw)
        if path.name in ("", ".", "..") or ".." in path.parts:
            raise ProtocolError("field 'folder' must name a new folder (no . or ..)")
        parent = await self.c.cwd_check(session_id).open(str(path.parent))
        folder = NewFolder(parent, path.name)
        try:
            if await trio.to_thread.run_sync(_exists, folder):
                raise ExistsError(f"folder {str(folder.path)!r} exists already: name a new one")
        except BaseException:
            parent.close()
            raise
        return folder


def _exists(folder: NewFolder) -> bool:
    """Whether anything (a link too) is at `folder` already, looked up beneath its parent."""
    try:
        os.stat(folder.name, dir_fd=folder.parent.fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
