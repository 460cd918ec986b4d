"""The config in force, reloaded from its files when they change (hot reload).

`current()`, asked once per turn, reloads when a file of the config changed: a broken
one is ignored (the last good config stays), cached system prompts are dropped and the
planning prompts read again, so an edit reaches the very next model call.
"""

from __future__ import annotations

import os
from pathlib import Path

from navi_trio.core.turn.context import ContextBuilder
from navi_trio.core.turn.planning import PlanningPrompts
from navi_trio.profiles import ConfigSource, NaviConfig

Signature = tuple[tuple[str, int, int], ...]


class LiveConfig:
    def __init__(self, source: ConfigSource, builder: ContextBuilder) -> None:
        self.source = source
        self._builder = builder
        self._generation = source.generation
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
        """(path, mtime, size) of every file the config is read from: a cheap stat each."""
        cfg = self.source.current
        files = {self.source.path, *_prompt_files(cfg), *_listed(self.prompts_dir)}
        out = []
        for path in sorted(files):
            try:
                st = os.stat(path)
            except OSError:
                out.append((str(path), -1, -1))
            else:
                out.append((str(path), st.st_mtime_ns, st.st_size))
        return tuple(out)


def _prompt_files(cfg: NaviConfig) -> list[Path]:
    names = [cfg.persona_file]
    for profile in cfg.profiles.values():
        names += [profile.system_prompt_file, profile.compression_prompt_file]
    return [cfg.resolve_path(n) for n in names if n]


def _listed(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_file()]
    except OSError:
        return []
