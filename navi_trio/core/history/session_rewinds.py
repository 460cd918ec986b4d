"""Rewind and fork as every client reaches them: through the session's actor.

`SessionRewinds` runs the rewinder and the forker in the session actor's exclusive
section, so nothing else of the session runs meanwhile (a message sent then is queued
and runs on what the rewind left), and tells the session's subscribers, while the rewind
or the fork still holds the session's lease: ``rewound`` then ``resync`` (the history
they show is gone), or ``forked``. Who may do it is the caller's check; which folders it
may touch is checked here, against the asker (`Asker`) as they are now.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import trio

from navi_trio.core.history.fork import Forker, NewFolder
from navi_trio.core.history.rewind import Asker, Rewinder, RewindPreview, Target
from navi_trio.core.history.rewind_points import (
    POINTS_MAX,
    Point,
    branch_summary,
    branches,
    files_checkpoint,
    message_at,
    points,
)
from navi_trio.core.session import SessionRegistry
from navi_trio.core.turn import RoundCheckpoints
from navi_trio.errors import NotFoundError
from navi_trio.events import Forked, Rewound


@attrs.frozen
class Overview:
    """What a client shows to pick a rewind: the user messages (newest `POINTS_MAX`,
    each with the checkpoint a files rewind would restore), the checkpoints (each with
    the message it came after), the branches (undoable rewinds)."""

    points: list[dict[str, Any]]
    more_points: int
    checkpoints: list[dict[str, Any]]
    branches: list[dict[str, Any]]


class SessionRewinds:
    def __init__(
        self, rewinder: Rewinder, sessions: SessionRegistry, checkpoints: RoundCheckpoints
    ) -> None:
        self.rewinder = rewinder
        self.forker = Forker(rewinder)
        self.sessions = sessions
        self.checkpoints = checkpoints

    async def overview(self, session_id: str) -> Overview:
        messages, _ = await self.rewinder.history(session_id)
        engine, store = self.rewinder.engine, self.rewinder.store
        infos = await engine.checkpoints(session_id)
        listed = points(messages)
        shown: list[dict[str, Any]] = []
        for point in listed[-POINTS_MAX:]:
            try:
                info = await files_checkpoint(store, infos, session_id, point.created_at)
                checkpoint: str | None = None if info is None else info.id
            except NotFoundError:
                checkpoint = "pruned"
            shown.append(_point(point, checkpoint))
        checkpoints = []
        for info in infos:
            after = message_at(messages, info.created)
            checkpoints.append(
                {
                    "checkpoint_id": info.id,
                    "created_at": info.created,
                    "label": info.label,
                    "message_id": after.message_id if after else None,
                    "message": after.text if after else "",
                    "files": info.files,
                    "changed": info.changed,
                    "bytes": info.bytes,
                    "new_bytes": info.new_bytes,
                    "left_out": len(info.left_out),
                }
            )
        kept = [branch_summary(b) for b in await branches(store, session_id)]
        return Overview(shown, max(0, len(listed) - POINTS_MAX), checkpoints, kept)

    async def preview(
        self, session_id: str, target: Target, asker: Asker | None = None
    ) -> RewindPreview:
        actor = await self.sessions.get(session_id)

        async def work() -> RewindPreview:
            # A pruning under way settles first: which checkpoints are kept decides.
            await self.checkpoints.wait_pruned()
            return await self.rewinder.preview(session_id, target, asker)

        return await actor.exclusive(work)

    async def apply(
        self, session_id: str, target: Target, confirm: str, asker: Asker | None = None
    ) -> Rewound:
        actor = await self.sessions.get(session_id)

        def publish(event: Rewound) -> None:
            actor.publish(event)
            if event.messages_removed or event.messages_restored or target.chat:
                actor.resync()

        async def work() -> Rewound:
            await self.checkpoints.wait_pruned()
            return await self.rewinder.apply(session_id, target, confirm, asker, publish=publish)

        return await actor.exclusive(work)

    async def fork(
        self,
        session_id: str,
        new_id: str,
        *,
        at: str | None = None,
        files: bool = False,
        folder: Path | NewFolder | None = None,
        asker: Asker | None = None,
    ) -> Forked:
        """Fill the new session `new_id` (made by the caller) from `session_id`; a fork
        that cannot be made (the source busy, a bad `at`) removes it again. `folder`:
        where the copy of the working folder goes (a `NewFolder`: its parent held since
        it was checked; the caller closes it)."""
        try:
            actor = await self.sessions.get(session_id)
            return await actor.exclusive(
                lambda: self.forker.fork(
                    session_id,
                    new_id,
                    at=at,
                    files=files,
                    folder=folder,
                    asker=asker,
                    publish=actor.publish,
                )
            )
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.forker.discard(new_id, [])
            raise


def _point(point: Point, checkpoint: str | None) -> dict[str, Any]:
    return {
        "message_id": point.message_id,
        "index": point.index,
        "text": point.text,
        "created_at": point.created_at,
        "checkpoint": checkpoint,
    }
