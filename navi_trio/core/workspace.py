"""Where a client may point a run: the check of a `message`'s ``cwd``.

A run's cwd is a root of the filesystem tool and a writable folder of the sandbox, so
what a client sends is checked against the sender's role before anything runs
(README "Safety"):

- the path is resolved first (symlinks included), and the real path is what the run
  gets: a link swapped afterwards changes nothing;
- never ``/``, never the daemon's own data (tools/private.py: the data folder, the
  database, the config folders) — inside the data folder only the sender's own
  session folders;
- a role with `workspace_roots` in config.json (``{"user": ["~/projects"]}``) may only
  use those folders (and below), plus its own session folders; without an entry,
  users get their own session folders only, and admins anything but the above.

A refusal is a `ForbiddenError` (``forbidden``) that names the setting.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import attrs
import trio

from navi_trio.errors import ForbiddenError, ProtocolError
from navi_trio.profiles import NaviConfig
from navi_trio.settings import Settings
from navi_trio.store.base import SessionRow
from navi_trio.tools.private import private_paths, real_path, within

SETTING = "workspace_roots"
ROOT = Path("/")


class SessionLookup(Protocol):
    """The part of the store the check needs: who owns a session folder."""

    async def get_session(self, session_id: str) -> SessionRow | None: ...


SHOWN_MAX = 200  # characters of a client's path echoed in a refusal


def _show(raw: str, real: Path | None) -> str:
    text = repr(raw if len(raw) <= SHOWN_MAX else raw[: SHOWN_MAX - 1] + "…")
    return text if real is None or Path(raw) == real else f"{text} (really {str(real)!r})"


@attrs.frozen
class _Facts:
    real: Path | None  # the real folder; None when `raw` is not one
    hidden: Path | None = None  # the hidden path that covers it
    roots: tuple[Path, ...] | None = None  # the role's real roots; None: not configured
    sessions: Path = Path("/")  # the real folder of the session folders


def _facts(raw: str, settings: Settings, config: NaviConfig, role: str) -> _Facts:
    """What the check looks at; blocking (realpath, stat): run in a worker thread."""
    try:
        real = Path(os.path.realpath(raw))
        if not real.is_dir():
            return _Facts(None)
    except (OSError, ValueError):  # a NUL byte, a name too long
        return _Facts(None)
    roots = config.workspace_roots.get(role)
    return _Facts(
        real,
        private_paths(settings, config=config).blocks(real),
        # A root that became a link to / would open everything: it opens nothing.
        None if roots is None else tuple(r for r in map(real_path, map(Path, roots)) if r != ROOT),
        real_path(settings.data_dir) / "sessions",
    )


async def check_cwd(
    raw: str,
    *,
    user_id: str,
    role: str,
    settings: Settings,
    config: NaviConfig,
    store: SessionLookup,
) -> Path:
    """The real folder a run of `user_id` (`role`) may use as its cwd, or a refusal."""
    facts = await trio.to_thread.run_sync(_facts, raw, settings, config, role)
    real, hidden, roots, sessions = facts.real, facts.hidden, facts.roots, facts.sessions
    if real is None:
        raise ProtocolError(f"cwd {_show(raw, None)} is not a directory on the daemon's machine")
    shown = _show(raw, real)
    if real == ROOT:
        raise ForbiddenError(f"cwd {shown}: the root folder is never a workspace ({SETTING})")
    if hidden is not None:
        if within(real, sessions) and real != sessions:
            row = await store.get_session(real.relative_to(sessions).parts[0])
            if row is not None and row.user_id == user_id:
                return real  # the sender's own session folder
            raise ForbiddenError(
                f"cwd {shown}: that session folder is not yours; in navi's data folder "
                f"only your own session folders may be a cwd ({SETTING})"
            )
        raise ForbiddenError(
            f"cwd {shown} lies in navi's own data ({hidden}): never a workspace ({SETTING})"
        )
    if roots is None and role == "admin":
        return real
    if within(real, *(roots or ())):
        return real
    listed = ", ".join(config.workspace_roots.get(role, ())) or "none but your session folders"
    raise ForbiddenError(
        f"cwd {shown} is outside the folders a {role} may work in "
        f"({SETTING}.{role} in config.json: {listed})"
    )
