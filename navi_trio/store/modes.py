"""navi's data on disk is for its own account only, whatever the umask.

The data folder and the session folders are 0700; the SQLite database and the files
SQLite keeps beside it (``-wal``, ``-shm``, ``-journal``) and the users marker
(``-users``) are 0600. The database file is created 0600 before SQLite opens it:
SQLite gives the files it makes beside a database the database's own mode, so they
follow. An install made before (with the usual umask 022: folders 0755, files 0644,
readable to every account that can reach the home folder) is fixed when the store or
the runtime opens, and the log says what was changed.

Only group and other bits are taken away: the owner's bits stay as they are.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from navi_trio.settings import DB_SIDES

log = logging.getLogger(__name__)

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
SESSIONS = "sessions"


def _private(path: Path) -> int | None:
    """Take group and other bits off `path` (no link followed); its old mode when it
    had any, else None (also when it does not exist)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
        return None
    try:
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
    except OSError as exc:  # another account's file: say so, and go on
        log.warning("%s is readable to other accounts and could not be made private: %s", path, exc)
        return None
    return stat.S_IMODE(st.st_mode)


def private_folder(path: Path) -> int | None:
    """`path` made (0700, parents as the umask says) or made private; its old mode when
    it was readable to others."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    return _private(path)


def private_database(path: Path) -> list[str]:
    """The SQLite file `path` created 0600 when missing, and it and its side files made
    private; what was changed, as "name (was 0644)"."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    except FileExistsError:
        pass
    else:
        os.close(fd)  # an empty file is an empty database to SQLite
    changed = []
    for one in (path, *(path.with_name(path.name + side) for side in DB_SIDES)):
        old = _private(one)
        if old is not None:
            changed.append(f"{one.name} (was {old:04o})")
    if changed:
        log.warning(
            "the database files %s in %s were readable to other accounts: made private (0600)",
            ", ".join(changed),
            path.parent,
        )
    return changed


def private_data(data_dir: Path) -> list[str]:
    """The data folder, its ``sessions`` folder and every session folder made (0700) or
    made private; what was changed, as "path (was 0755)" (also logged)."""
    changed = []
    for folder in (data_dir, data_dir / SESSIONS):
        old = private_folder(folder)
        if old is not None:
            changed.append(f"{folder} (was {old:04o})")
    fixed = 0
    with os.scandir(data_dir / SESSIONS) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and _private(Path(entry.path)) is not None:
                fixed += 1
    if fixed:
        changed.append(f"{fixed} session folder(s) in {data_dir / SESSIONS}")
    if changed:
        log.warning(
            "navi's data was readable to other accounts: made private (0700): %s",
            "; ".join(changed),
        )
    return changed
