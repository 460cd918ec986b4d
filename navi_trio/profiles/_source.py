"""The config in force, reloaded on demand without losing the last good one.

A broken edit is logged and the last good config keeps running. A daemon started with
``--local`` keeps its default profile across reloads. Each config taking effect pins
the folders of `workspace_roots` (real path and identity then), so a root swapped for a
link later opens nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from pathlib import Path

import attrs

from navi_trio.errors import ConfigError
from navi_trio.profiles._load import check_config, load_config
from navi_trio.profiles._schema import NaviConfig

log = logging.getLogger("navi_trio.profiles")

# A folder of workspace_roots as it was when its config took effect: (real path, device,
# inode); None when it did not exist then.
Pin = tuple[Path, int, int]


def pin_roots(cfg: NaviConfig) -> dict[str, Pin | None]:
    """Every folder `cfg.workspace_roots` names, pinned now (blocking: a stat each)."""
    pins: dict[str, Pin | None] = {}
    for folders in cfg.workspace_roots.values():
        for folder in folders:
            real = Path(os.path.realpath(Path(folder).expanduser()))
            try:
                st = os.stat(real)
            except OSError:
                pins[folder] = None
                continue
            pins[folder] = (real, st.st_dev, st.st_ino)
    return pins


class ConfigSource:
    """The config in force, reloadable at run time: a broken file's error is logged and kept
    in `last_error`, and `current` stays the last good config. `maybe_reload()` reloads
    only when the file's modification time changed (a cheap stat per turn).
    """

    def __init__(
        self, path: Path, initial: NaviConfig | None = None, *, default_profile: str | None = None
    ) -> None:
        self.path = path
        # `navi ... --local`: new sessions get this profile, whatever the file says.
        self.default_profile = default_profile
        cfg = initial if initial is not None else load_config(path)
        self.current: NaviConfig = self._with_default(cfg)
        self.pins = pin_roots(cfg)
        self.last_error: ConfigError | None = None
        self.generation = 0
        # Set by `require`: a reload must pass `check_config` with these tool names too.
        self.known_tools: frozenset[str] | None = None
        self._mtime = self._stat()

    def require(self, known_tools: Collection[str]) -> None:
        """Check the config in force, and from now on every reload, with `check_config`.
        ConfigError when the current config fails: start-up refuses it.
        """
        check_config(self.current, self.path, known_tools)
        self.known_tools = frozenset(known_tools)

    def _stat(self) -> float | None:
        try:
            return os.stat(self.path).st_mtime_ns / 1e9
        except OSError:
            return None

    def _with_default(self, cfg: NaviConfig) -> NaviConfig:
        if self.default_profile is None or self.default_profile not in cfg.profiles:
            return cfg
        return attrs.evolve(cfg, default_profile=self.default_profile)

    def reload(self) -> bool:
        """Re-read the file. True when a new config took effect."""
        self._mtime = self._stat()
        try:
            cfg = load_config(self.path)
            if self.known_tools is not None:
                check_config(cfg, self.path, self.known_tools)
        except ConfigError as exc:
            self.last_error = exc
            log.error("config reload failed, keeping the last good config: %s", exc)
            return False
        self.current = self._with_default(cfg)
        self.pins = pin_roots(cfg)
        self.last_error = None
        self.generation += 1
        return True

    def maybe_reload(self) -> bool:
        if self._stat() != self._mtime:
            return self.reload()
        return False
