"""What no tool may show: the daemon's own data.

One list, used by every confinement (the sandbox masks, the filesystem tool refuses, a
client's `cwd` may not lie inside): the data folder (database, journal, token files,
session folders), the database when it lives elsewhere, navi's config folders
(config.json may hold keys), and the SSH identity files ssh_exec uses. The caller's own
session folder is the one exception (`allowed`).

The config folder is hidden whole unless it is ``/``, the home folder or above it: then
only config.json is, so that hiding it does not hide the machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from navi_trio.profiles import NaviConfig
from navi_trio.settings import DB_SIDES, Settings


def real_path(path: Path | str) -> Path:
    """`path` with ~ expanded and every symlink resolved (blocking)."""
    return Path(os.path.realpath(Path(path).expanduser()))


def within(path: Path, *folders: Path) -> bool:
    """Whether `path` is one of `folders` or lies below one. Paths are compared as
    given, part by part (``/a/bc`` is not below ``/a/b``): the caller normalises or
    resolves them first. The one containment check of the tools.

    The answer is ``path == f or f in path.parents``'s, without making each parent:
    a folder is a leading run of the path's parts, the whole path or one of its
    parents. An anchored path's last parent is its anchor, so ``.`` is never above it.
    """
    parts = path.parts
    length = len(parts)
    shortest = 1 if path.anchor else 0  # the fewest parts a parent of `path` has
    for folder in folders:
        head = folder.parts
        size = len(head)
        if size <= length and (size == length or size >= shortest) and parts[:size] == head:
            return True
    return False


@attrs.frozen
class PrivatePaths:
    """`hidden`: real paths no tool may read or write; `allowed`: real folders inside a
    hidden one that stay visible (the caller's own session folder).
    """

    hidden: tuple[Path, ...]
    allowed: tuple[Path, ...] = ()

    def blocks(self, path: Path) -> Path | None:
        """The hidden path that covers the real `path`, or None when it may be used."""
        if any(within(path, a) for a in self.allowed):
            return None
        for hidden in self.hidden:
            if within(path, hidden):
                return hidden
        return None

    def inside(self, folder: Path) -> tuple[Path, ...]:
        """The hidden paths that lie inside (or are) the real `folder`."""
        return tuple(h for h in self.hidden if within(h, folder))


def _config_paths(config_file: Path) -> list[Path]:
    """The config folder, or only the file when its folder holds the home folder."""
    folder = config_file.parent
    home = real_path(Path.home())
    if folder == Path("/") or within(home, folder):
        return [config_file]
    return [folder]


@attrs.frozen
class OwnData:
    """The daemon's own data as `private_paths` finds it on the disk for one session
    folder: `hidden` the real paths (before the config's, duplicates kept), `own` the
    real session folder. Reading it resolves every symlink; `paths` only adds the
    config's part, so a run reads this once and makes both of its lists from it."""

    hidden: tuple[Path, ...]
    own: Path | None

    def paths(self, config: NaviConfig | None = None) -> PrivatePaths:
        """The private paths: these, and the SSH identity files `config` names."""
        hidden = list(self.hidden)
        if config is not None and config.ssh is not None:
            hidden += [real_path(Path(h.identity_file)) for h in config.ssh.hosts.values()]
        unique = tuple(dict.fromkeys(hidden))
        allowed: tuple[Path, ...] = ()
        own = self.own
        # A session folder turned into a link to the data folder (or above) allows nothing.
        if own is not None and not any(within(h, own) for h in unique):
            allowed = (own,)
        return PrivatePaths(hidden=unique, allowed=allowed)


def own_data(settings: Settings, own_session_dir: Path | None = None) -> OwnData:
    """What `private_paths` reads from the disk for `settings` and `own_session_dir`."""
    db = real_path(settings.db_path)
    hidden = (
        real_path(settings.data_dir),
        db,
        *(db.with_name(db.name + side) for side in DB_SIDES),
        *_config_paths(real_path(settings.config_path)),
        real_path(Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config") / "navi"),
    )
    own = None if own_session_dir is None else real_path(own_session_dir)
    return OwnData(hidden=hidden, own=own)


def private_paths(
    settings: Settings,
    own_session_dir: Path | None = None,
    *,
    config: NaviConfig | None = None,
) -> PrivatePaths:
    """The daemon's own data for `settings`; `own_session_dir` stays visible.

    With `config`, the SSH identity files it names are hidden too.
    """
    return own_data(settings, own_session_dir).paths(config)
