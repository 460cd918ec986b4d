"""What no tool may show: the daemon's own data.

One list, used by every confinement: the sandbox masks these paths (tools/sandbox.py),
the filesystem tool refuses them (tools/filesystem.py), and a client's `cwd` may not lie
inside them (the daemon's workspace check). Whatever their paths are: the data folder
(the database, its WAL and journal, the token files, every session folder), the
database when it lives elsewhere, and navi's config folders. The caller's own session
folder is the one exception (`allowed`): it lives inside the data folder, and it is
the run's own workspace.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from navi_trio.settings import Settings

# Next to the database: SQLite's write-ahead log, its index and a rollback journal.
DB_SIDE_FILES = ("-wal", "-shm", "-journal")


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path.expanduser()))


@attrs.frozen
class PrivatePaths:
    """`hidden`: real paths (files or folders) no tool may read or write.

    `allowed`: real folders inside a hidden one that stay visible (the caller's own
    session folder).
    """

    hidden: tuple[Path, ...]
    allowed: tuple[Path, ...] = ()

    def blocks(self, path: Path) -> Path | None:
        """The hidden path that covers the real `path`, or None when it may be used."""
        if any(path == a or a in path.parents for a in self.allowed):
            return None
        for hidden in self.hidden:
            if path == hidden or hidden in path.parents:
                return hidden
        return None

    def inside(self, folder: Path) -> tuple[Path, ...]:
        """The hidden paths that lie inside (or are) the real `folder`."""
        return tuple(h for h in self.hidden if h == folder or folder in h.parents)


def private_paths(settings: Settings, own_session_dir: Path | None = None) -> PrivatePaths:
    """The daemon's own data for `settings`; `own_session_dir` stays visible."""
    db = _real(settings.db_path)
    hidden = [
        _real(settings.data_dir),
        db,
        *(db.with_name(db.name + side) for side in DB_SIDE_FILES),
        _real(settings.config_path).parent,
        _real(Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config") / "navi"),
    ]
    allowed = () if own_session_dir is None else (_real(own_session_dir),)
    return PrivatePaths(hidden=tuple(dict.fromkeys(hidden)), allowed=allowed)
