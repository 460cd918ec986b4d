"""What a checkpoint leaves out: `.gitignore` rules and the configured list of names.

`.gitignore` files are matched by pathspec (`GitIgnoreSpec`: git's rules) on its re2
backend: re2 matches in linear time, where Python's `re` backtracks polynomially on a
hostile pattern (``*a*a*a*a*b``) while holding the GIL, which would freeze the daemon.
A line git cannot read is skipped, as git skips it; ``!`` cannot re-include below an
excluded folder, which the walk never enters. Only `.gitignore` files inside a root
count: the checkpoint follows the workspace, not the machine's git set-up. The
configured names (`NameList`) are fnmatch patterns matched against one name, never
re-included, ``.git`` always among them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

# A `.gitignore` larger than this is not read (its folder is checkpointed without it).
GITIGNORE_MAX_BYTES = 1 << 20
ALWAYS_LEFT_OUT = (".git",)


class NameList:
    """The configured names left out wherever they appear (files and folders alike)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        names = tuple(dict.fromkeys((*ALWAYS_LEFT_OUT, *(p for p in patterns if p))))
        self.patterns = names
        self._re = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in names))

    def __call__(self, name: str) -> bool:
        return self._re.match(name) is not None


@attrs.frozen
class Rules:
    """One `.gitignore`: its folder (relative to the root, ``""`` for the root) and its
    patterns."""

    base: str
    spec: GitIgnoreSpec

    @classmethod
    def parse(cls, base: str, text: str) -> Rules | None:
        """The rules of a `.gitignore` in folder `base`, or None when it has none."""
        # Imported here: only a workspace with a `.gitignore` pays for it.
        from pathspec import GitIgnoreSpec
        from pathspec.patterns.gitignore import GitIgnorePatternError
        from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern

        patterns = []
        for line in text.splitlines():
            try:
                pattern = GitIgnoreSpecPattern(line)
            except GitIgnorePatternError:
                continue  # git skips a line it cannot read
            if pattern.include is not None:  # not blank, not a comment
                patterns.append(pattern)
        if not patterns:
            return None
        return cls(base=base, spec=GitIgnoreSpec(patterns, backend="re2"))

    def decide(self, rel: str, is_dir: bool) -> bool | None:
        """True: ignored; False: re-included; None: no pattern of this file matches."""
        sub = rel[len(self.base) + 1 :] if self.base else rel
        # A trailing "/" tells pathspec it is a folder (for "build/" patterns).
        return self.spec.check_file(f"{sub}/" if is_dir else sub).include


@attrs.frozen
class Ignorer:
    """The `.gitignore` files that apply in one folder, the root's first."""

    stack: tuple[Rules, ...] = ()

    def below(self, rules: Rules | None) -> Ignorer:
        """The rules of a sub-folder with its own `.gitignore` `rules` (None: none)."""
        return self if rules is None else Ignorer((*self.stack, rules))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether the entry at `rel` (its folder not ignored) is ignored."""
        for rules in reversed(self.stack):
            decided = rules.decide(rel, is_dir)
            if decided is not None:
                return decided
        return False
