"""The config in force, reloaded from its files when they change (hot reload).

`current()`, asked once per turn, reloads when a file of the config changed: a broken
one is ignored (the last good config stays), cached system prompts are dropped and the
planning prompts read again, so an edit reaches the very next model call.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from navi_trio.core.turn.context import ContextBuilder
from navi_trio.core.turn.planning import PlanningPrompts
from navi_trio.profiles import ConfigSource, NaviConfig

Signature = tuple[tuple[str, int, int], ...]
_NO_FILE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


class LiveConfig:
    def __init__(self, source: ConfigSource, builder: ContextBuilder) -> None:
        self.source = source
        self._builder = builder
        self._generation = source.generation
        # The prompt files a config names, and its prompts folder: made once per config.
        self._named: tuple[NaviConfig | None, list[str], str] = (None, [], "")
        self._signature = self._files_signature()
        self.planning_prompts = PlanningPrompts.load(self.prompts_dir)

    @property
    def prompts_dir(self) -> Path:
        return self.source.current.base_dir / "prompts"

    def current(self) -> NaviConfig:
        signature = self._files_signature()
        if signature != self._signature:
            self._signature = signature
            self.source.reload()
        if self.source.generation != self._generation:
            self._generation = self.source.generation
            self._builder.invalidate()
            self.planning_prompts = PlanningPrompts.load(self.prompts_dir)
        return self.source.current

    def _files_signature(self) -> Signature:
        """(path, mtime, size) of every file the config is read from: a cheap stat each.

        Asked at every turn, so on plain strings: the files a config names and its
        prompts folder are worked out once per config; the folder is listed each time."""
        cfg = self.source.current
        if self._named[0] is not cfg:
            named = [os.fspath(p) for p in (self.source.path, *_prompt_files(cfg))]
            self._named = (cfg, named, os.fspath(self.prompts_dir))
        _, named, prompts = self._named
        out = []
        for path in sorted({*named, *_listed(prompts)}):
            try:
                st = os.stat(path)
            except OSError:
                out.append((path, -1, -1))
            else:
                out.append((path, st.st_mtime_ns, st.st_size))
        return tuple(out)


def _prompt_files(cfg: NaviConfig) -> list[Path]:
    names = [cfg.persona_file]
    for profile in cfg.profiles.values():
        names += [profile.system_prompt_file, profile.compression_prompt_file]
    return [cfg.resolve_path(n) for n in names if n]


def _listed(folder: str) -> list[str]:
    """The files in `folder` (links to files too), by path; none when it cannot be read."""
    try:
        with os.scandir(folder) as entries:
            return [e.path for e in entries if _is_file(e)]
    except OSError:
        return []


def _is_file(entry: os.DirEntry[str]) -> bool:
    """``Path.is_file``'s answer: an entry that is gone, a dangling link or a loop is
    no file; any other error (a permission) leaves the folder unread."""
    try:
        return entry.is_file()
    except OSError as exc:
        if exc.errno in _NO_FILE:
            return False
        raise
