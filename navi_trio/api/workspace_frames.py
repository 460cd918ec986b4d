"""The ``folders`` and ``changes`` frames: a working folder to pick, and what changed.

A folder is listed only when the sender could send it as a message's ``cwd`` for that
session (the same `CwdCheck`): a refusal is the one that message would get. A user
lists the changes of their own sessions only (an admin any), in the folders they may
use now. Both read the disk, so they run beside the connection's reader. The frames are
in docs/pages/protocol.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from navi_trio.api.protocol import Changes, Folders, RequestId, reply
from navi_trio.core.history import Asker, session_changes
from navi_trio.core.turn import list_folders, recent_folders, start_folders
from navi_trio.tools.private import real_path

if TYPE_CHECKING:  # commands imports this module
    from navi_trio.api.commands import Commands


class WorkspaceCommands:
    """The two frames, for one connection's `Commands` (its user, its runtime)."""

    def __init__(self, commands: Commands) -> None:
        self.c = commands

    async def folders(self, rid: RequestId, cmd: Folders) -> None:
        if cmd.session_id is not None:
            await self.c._owned(cmd.session_id)
        check = self.c.cwd_check(cmd.session_id)
        rt = self.c.rt

        async def work() -> None:
            if cmd.path is None:
                own = None
                if cmd.session_id is not None:
                    folder = rt.settings.session_dir(cmd.session_id)
                    own = str(await trio.to_thread.run_sync(real_path, folder))
                await self.c.conn.send(
                    reply(
                        rid,
                        "folders",
                        path=None,
                        session_id=cmd.session_id,
                        starts=await start_folders(check),
                        recent=await recent_folders(rt.store, check),
                        session_folder=own,
                    )
                )
                return
            listing = await list_folders(check, cmd.path)
            await self.c.conn.send(
                reply(
                    rid,
                    "folders",
                    path=listing.path,
                    session_id=cmd.session_id,
                    parent=listing.parent,
                    folders=listing.folders,
                    more=listing.more,
                )
            )

        await self.c.conn.defer(rid, work)

    async def changes(self, rid: RequestId, cmd: Changes) -> None:
        await self.c._owned(cmd.session_id)
        asker = Asker(self.c.user.id, self.c.user.role)
        rewinder = self.c.rt.rewinds.rewinder

        async def work() -> None:
            found = await session_changes(rewinder, cmd.session_id, cmd.since, asker)
            await self.c.conn.send(
                reply(
                    rid,
                    "changes",
                    session_id=cmd.session_id,
                    since=found.since,
                    checkpoint=found.checkpoint,
                    files=found.files,
                    more_files=found.more_files,
                    note=found.note,
                    left_out=[{"root": root, "why": why} for root, why in found.left_out],
                )
            )

        await self.c.conn.defer(rid, work)
