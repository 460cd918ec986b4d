"""Where a client may point a run: the check of a `message`'s ``cwd``, and a run's roots.

A run's cwd is a root of the filesystem tool and a writable folder of the sandbox, so
it is checked against the sender's role before anything runs (docs/pages/tools.md,
"Safety"): the folder is opened as a held root without following symlinks and every
check is made on what the fd really is; never ``/`` nor the daemon's own data; only the
role's `workspace_roots` (as pinned when the config took effect) and its session's
folder. A refusal is a `ForbiddenError` naming the setting. A queued message may wait
across a restart, so a run checks its cwd again when it starts (`hold_roots`), where a
symlink anywhere in it now means a swap.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import attrs
import trio

from navi_trio.errors import (
    ConfigError,
    ForbiddenError,
    ProtocolError,
    RequestError,
    RootChangedError,
)
from navi_trio.profiles import ConfigSource, Pin
from navi_trio.settings import Settings
from navi_trio.store.base import SessionRow
from navi_trio.tools.private import private_paths, real_path, within
from navi_trio.tools.roots import CWD, Root, RunRoots, session_folder
from navi_trio.tools.runas import session_owner

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
    real: Path  # the real folder: the path its fd has
    hidden: Path | None = None  # the hidden path that covers it
    roots: tuple[Path, ...] | None = None  # the role's real roots; None: not configured
    sessions: Path = Path("/")  # the real folder of the session folders


def _open(
    raw: str, settings: Settings, source: ConfigSource, role: str, resolve: bool
) -> tuple[Root | None, _Facts | None]:
    """The folder held open, and what the check looks at (None: not a folder).
    Blocking: run in a worker thread."""
    try:
        path = Path(os.path.realpath(raw)) if resolve else Path(raw)
        root = Root.open(path, CWD)
    except RootChangedError:
        if not resolve:
            raise  # a path checked before that is not a folder any more: it changed
        return None, None
    except (OSError, ValueError):  # a NUL byte, a name too long
        return None, None
    try:
        config = source.current
        private = private_paths(settings, config=config)
        hidden = private.blocks(root.path)
        if hidden is None:  # the same folder under another name (a bind mount)
            hidden = next((h for h in private.hidden if _ident(h) == root.ident), None)
        roots = config.workspace_roots.get(role)
        facts = _Facts(
            root.path,
            hidden,
            None if roots is None else tuple(_pinned(roots, source.pins)),
            real_path(settings.data_dir) / "sessions",
        )
    except BaseException:
        root.close()
        raise
    return root, facts


def _pinned(roots: Sequence[str], pins: Mapping[str, Pin | None]) -> Iterator[Path]:
    """The real paths of `roots` that are still the folders pinned when the config took
    effect, reached without following a symlink. One that did not exist then, was
    swapped for a link or another folder since, or became / opens nothing."""
    for configured in roots:
        pin = pins.get(configured)
        if pin is None or pin[0] == ROOT:
            continue
        try:
            with Root.open(pin[0], "the workspace root") as held:
                if held.ident == (pin[1], pin[2]):
                    yield held.path
        except RootChangedError:
            continue


def _ident(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


@attrs.frozen(kw_only=True)
class CwdCheck:
    """Who asks for a cwd (`user_id`, `role`) for which session (`session_id`; None: a
    session not made yet), and what the check reads (settings, the config in force
    with its pinned workspace roots, store)."""

    user_id: str
    role: str
    session_id: str | None
    settings: Settings
    config: ConfigSource
    store: SessionLookup

    async def open(self, raw: str, *, resolve: bool = True) -> Root:
        """The folder `raw` held open when it may be this run's cwd (the caller closes it); else a
        refusal. `resolve`: `raw` comes from a client and its symlinks are resolved first; else
        it is a real path already checked, and a symlink in it is `RootChangedError`."""
        root, facts = await trio.to_thread.run_sync(
            _open, raw, self.settings, self.config, self.role, resolve
        )
        if root is None or facts is None:
            raise ProtocolError(
                f"cwd {_show(raw, None)} is not a directory on the daemon's machine"
            )
        try:
            await _check(raw, facts, self)
        except BaseException:
            root.close()
            raise
        return root

    async def check(self, raw: str) -> Path:
        """The real folder `raw` is, when it may be this run's cwd; else a refusal (the
        run holds it again when it starts: `hold_roots`)."""
        root = await self.open(raw)
        root.close()
        return root.path


async def _check(raw: str, facts: _Facts, who: CwdCheck) -> None:
    real, hidden, roots, sessions = facts.real, facts.hidden, facts.roots, facts.sessions
    user_id, role, session_id, config = who.user_id, who.role, who.session_id, who.config.current
    shown = _show(raw, real)
    if real == ROOT:
        raise ForbiddenError(f"cwd {shown}: the root folder is never a workspace ({SETTING})")
    if hidden is not None:
        if within(real, sessions) and real != sessions:
            owner = real.relative_to(sessions).parts[0]
            row = await who.store.get_session(owner)
            if row is None or row.user_id != user_id:
                raise ForbiddenError(
                    f"cwd {shown}: that session folder is not yours; in navi's data folder "
                    f"only the folder of the session itself may be a cwd ({SETTING})"
                )
            if owner != session_id:
                raise ForbiddenError(
                    f"cwd {shown} is the folder of your session {owner!r}, not of this one; "
                    f"in navi's data folder only the folder of the session itself may be a "
                    f"cwd ({SETTING})"
                )
            return  # the session's own folder
        raise ForbiddenError(
            f"cwd {shown} lies in navi's own data ({hidden}): never a workspace ({SETTING})"
        )
    if roots is None and role == "admin":
        return
    if within(real, *(roots or ())):
        return
    listed = ", ".join(config.workspace_roots.get(role, ())) or "none but your session folders"
    raise ForbiddenError(
        f"cwd {shown} is outside the folders a {role} may work in "
        f"({SETTING}.{role} in config.json: {listed})"
    )


async def hold_roots(
    session_id: str,
    cwd: Path | None,
    *,
    user_id: str,
    role: str,
    settings: Settings,
    config: ConfigSource,
    store: SessionLookup,
) -> RunRoots:
    """A run's roots, opened at its start: its session folder (made if need be) and its
    cwd, checked again on what the fd is. A root that cannot be held is the returned
    roots' `error` (each use fails with it), never an exception."""
    given = settings.session_dir(session_id)

    def session_root() -> Root:
        real = real_path(settings.data_dir) / "sessions" / session_id
        return session_folder(real, session_owner(settings.tool_user), given=given)

    try:
        session = await trio.to_thread.run_sync(session_root)
    except (RootChangedError, ConfigError) as exc:
        return RunRoots(None, None, str(exc))
    if cwd is None:
        return RunRoots(session)
    check = CwdCheck(
        user_id=user_id,
        role=role,
        session_id=session_id,
        settings=settings,
        config=config,
        store=store,
    )
    try:
        held = await check.open(str(cwd), resolve=False)
    except (RootChangedError, RequestError) as exc:
        session.close()
        return RunRoots(None, None, f"the run's cwd cannot be used: {exc}")
    except BaseException:
        session.close()
        raise
    return RunRoots(session, held)
