"""``navi doctor``'s part on the project files: what a run in this folder would get.

The doctor's cwd is read as a run by the daemon's own account reads it, so it shows the
same instruction files, skills and skipped files a run there is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from navi_trio.core.turn import CwdCheck, project_view
from navi_trio.errors import ConfigError, RootChangedError
from navi_trio.profiles import ConfigSource
from navi_trio.project import Reader
from navi_trio.settings import Settings
from navi_trio.store.base import SessionRow
from navi_trio.tools.private import real_path
from navi_trio.tools.roots import CWD, Root


class _NoSessions:
    """The doctor names no session: no session folder is anyone's."""

    async def get_session(self, session_id: str) -> SessionRow | None:
        return None


async def project_report(settings: Settings, cwd: Path) -> dict[str, Any]:
    """The files in effect for a run in `cwd`, as the ``context`` frame lists them."""
    report: dict[str, Any] = {"cwd": str(cwd)}
    try:
        source = await trio.to_thread.run_sync(ConfigSource, settings.config_path)
    except ConfigError:
        source = None  # the config's own error is reported: only the cwd is read then
    check = None
    if source is not None:
        check = CwdCheck(
            user_id="local",
            role="admin",
            session_id=None,
            settings=settings,
            config=source,
            store=_NoSessions(),
        )
    try:
        root = await trio.to_thread.run_sync(Root.open, real_path(cwd), CWD)
    except RootChangedError as exc:
        return {**report, "error": str(exc)}
    with root:
        view = await project_view(settings, Reader(), cwd=root, check=check)
    return {**report, "cwd": str(root.path), **view.listing()}
