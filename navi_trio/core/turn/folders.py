"""The folders a user may pick as a run's working folder: browsed, and the last used.

A folder is browsed only through what could be a message's ``cwd``: opened and checked
exactly as one (`CwdCheck`), its sub-folders read through the held fd. Symlinks and
navi's own data (by path or identity) are never listed, so every name listed is one the
user may choose. Bounded by `FOLDERS_MAX` and `SCAN_MAX`. The last folders used are
kept in the store and offered again only while the check still passes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from navi_trio.errors import RequestError, RootChangedError
from navi_trio.tools.private import private_paths, real_path
from navi_trio.tools.roots import Root

from .workspace import CwdCheck, _pinned

FOLDERS_MAX = 500  # sub-folders listed
SCAN_MAX = 20_000  # entries read of one folder
RECENT_MAX = 8
RECENT_SCOPE = "recent_folders"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class KV(Protocol):
    async def kv_get(self, scope: str, key: str) -> Any | None: ...
    async def kv_set(self, scope: str, key: str, value: Any, *, durable: bool = True) -> None: ...


@attrs.frozen
class Listing:
    """A folder's real path, its parent when that may be used too (None: the top), its
    sub-folders' names (sorted, at most `FOLDERS_MAX`) and how many more there are."""

    path: str
    parent: str | None
    folders: list[str]
    more: int


async def list_folders(check: CwdCheck, raw: str) -> Listing:
    """The sub-folders of `raw`, when `raw` may be the asker's cwd; else the refusal a
    message with that cwd would get."""
    root = await check.open(raw)
    try:
        names, more = await trio.to_thread.run_sync(_subfolders, root, check)
    finally:
        root.close()
    parent: str | None = None
    if root.path.parent != root.path:
        try:
            parent = str(await check.check(str(root.path.parent)))
        except (RequestError, RootChangedError):
            parent = None
    return Listing(str(root.path), parent, names, more)


def _subfolders(root: Root, check: CwdCheck) -> tuple[list[str], int]:
    """The names of the real sub-folders of `root` (no symlink, nothing private), and
    how many more there are. Blocking."""
    settings = check.settings
    own = None if check.session_id is None else settings.session_dir(check.session_id)
    private = private_paths(settings, own, config=check.config.current)
    idents = set()
    for hidden in private.hidden:
        try:
            st = os.stat(hidden)
        except OSError:
            continue
        idents.add((st.st_dev, st.st_ino))
    fd = os.open(".", _DIR, dir_fd=root.fd)
    names: list[str] = []
    seen = 0
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                seen += 1
                if seen > SCAN_MAX:
                    break
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in idents:
                    continue
                if private.blocks(root.path / entry.name) is not None:
                    continue
                if not _printable(entry.name):
                    continue
                names.append(entry.name)
    finally:
        os.close(fd)
    names.sort(key=lambda n: (n.startswith("."), n.lower()))
    return names[:FOLDERS_MAX], max(0, len(names) - FOLDERS_MAX)


def _printable(name: str) -> bool:
    """A name that is text (not bytes that are no UTF-8) and has no control character."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return not any(ord(c) < 32 or ord(c) == 127 for c in name)


async def start_folders(check: CwdCheck) -> list[str]:
    """Where browsing starts: the role's workspace roots, the session's own folder,
    and for an admin without roots the daemon's home (each only when usable now)."""
    source = check.config
    configured = source.current.workspace_roots.get(check.role)
    found: list[str] = []
    if configured is not None:
        roots = await trio.to_thread.run_sync(lambda: list(_pinned(configured, source.pins)))
        found.extend(str(r) for r in roots)
    elif check.role == "admin":
        found.append(str(Path.home()))
    if check.session_id is not None:
        own = check.settings.session_dir(check.session_id)
        found.append(str(await trio.to_thread.run_sync(real_path, own)))
    return await usable(check, found)


async def usable(check: CwdCheck, paths: list[str]) -> list[str]:
    """The real paths of those of `paths` the asker may use as a cwd now, in order."""
    out: list[str] = []
    for path in paths:
        try:
            real = str(await check.check(path))
        except (RequestError, RootChangedError):
            continue
        if real not in out:
            out.append(real)
    return out


async def recent_folders(store: KV, check: CwdCheck) -> list[str]:
    """The user's last folders, newest first, that they may still use."""
    kept = await store.kv_get(RECENT_SCOPE, check.user_id)
    paths = [str(p) for p in kept if isinstance(p, str)] if isinstance(kept, list) else []
    return await usable(check, paths[:RECENT_MAX])


async def remember_folder(store: KV, user_id: str, folder: Path) -> None:
    """`folder` (a real path a message was checked at) first among the user's last.
    Not waited to the disk: it only feeds the folder picker, and the message's own
    durable save follows it."""
    kept = await store.kv_get(RECENT_SCOPE, user_id)
    paths = [str(p) for p in kept if isinstance(p, str)] if isinstance(kept, list) else []
    paths = [str(folder)] + [p for p in paths if p != str(folder)]
    await store.kv_set(RECENT_SCOPE, user_id, paths[:RECENT_MAX], durable=False)
