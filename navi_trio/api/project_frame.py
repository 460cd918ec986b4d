"""The ``context`` frame: which project files a run in a cwd would be given.

The cwd is checked as a message's is (`CwdCheck`), the session (when named) must be the
sender's, and the files are read as the run would read them, so a client is shown
exactly what its runs get: the instruction files with their sizes, the skills, and what
was skipped with why (at most `SKIPPED_LISTED`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from navi_trio.api.protocol import Context, RequestId, reply
from navi_trio.core.turn import project_view
from navi_trio.project import Reader

if TYPE_CHECKING:  # commands imports this module
    from navi_trio.api.commands import Commands

SKIPPED_LISTED = 100


async def handle_context(host: Commands, rid: RequestId, cmd: Context) -> None:
    if cmd.session_id is not None:
        await host._owned(cmd.session_id)
    rt = host.rt
    check = host.cwd_check(cmd.session_id)
    session_dir = None if cmd.session_id is None else rt.settings.session_dir(cmd.session_id)
    root = None if cmd.cwd is None else await check.open(cmd.cwd)
    try:
        view = await project_view(
            rt.settings, Reader(), cwd=root, check=check, session_dir=session_dir
        )
    finally:
        if root is not None:
            root.close()
    listing = view.listing()
    skipped = listing["skipped"]
    listing["skipped"] = skipped[:SKIPPED_LISTED]
    listing["more_skipped"] = max(0, len(skipped) - SKIPPED_LISTED)
    cwd = None if root is None else str(Path(root.path))
    await host.conn.send(reply(rid, "context", cwd=cwd, session_id=cmd.session_id, **listing))
