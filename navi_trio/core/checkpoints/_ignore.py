"""What a checkpoint leaves out: `.gitignore` rules and the configured list of names.

`.gitignore` follows git's rules (gitignore(5)), checked against ``git check-ignore`` in
tests/test_checkpoints_ignore.py:

- blank lines and ``#`` comments are skipped; ``\\#`` and ``\\!`` start a literal; trailing
  spaces are cut unless escaped;
- ``!`` re-includes what an earlier pattern excluded, except below an excluded folder
  (the walk never enters one, so that rule holds by construction);
- a trailing ``/`` matches folders only;
- a pattern with a ``/`` at its start or in its middle is anchored to the folder of its
  `.gitignore`; one without matches a name at any depth;
- ``*`` and ``?`` and ``[...]`` never match ``/``; ``**/`` at the start, ``/**`` at the
  end and ``/**/`` in the middle match any number of folders; other ``**`` are ``*``.

Within one file the last matching pattern wins; a deeper file wins over a higher one.
Each file's patterns are joined into one regular expression tried last pattern first, so
checking a path costs one match per `.gitignore` above it, not one per pattern.

Only `.gitignore` files inside a root count (not those of folders above it, not
``.git/info/exclude``, not the user's global excludes): the checkpoint follows the
workspace, not the machine's git set-up. The configured names (`NameList`) are
fnmatch patterns matched against one name, never re-included, and ``.git`` is always
among them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

import attrs

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


def _segment(text: str) -> str:
    """The regex for glob text without ``*`` or ``/``: ``?``, ``[...]``, ``\\x``."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = i + 1
            if j < n and text[j] in "!^":
                j += 1
            if j < n and text[j] == "]":
                j += 1
            while j < n and text[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal "["
                out.append(re.escape(c))
                i += 1
                continue
            inner = text[i + 1 : j]
            negate = inner[:1] in ("!", "^")
            inner = inner[1:] if negate else inner
            inner = inner.replace("\\", "\\\\").replace("[", "\\[")
            out.append(f"(?!/)[{'^' if negate else ''}{inner}]")
            i = j + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(text[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _component(glob: str) -> str:
    """The regex for one path component's glob.

    Each ``*`` but the last is matched to the leftmost place where the text after it
    fits, inside an atomic group: right for globs (the leftmost fit leaves the most room
    for the rest), and it keeps the match linear. A plain translation (``[^/]*a[^/]*a…``)
    backtracks polynomially in the name's length, holding the GIL: a hostile
    `.gitignore` written by a tool would freeze the daemon.
    """
    parts = re.split(r"\*+", glob)
    if len(parts) == 1:
        return _segment(glob)
    middle = "".join(f"(?>[^/]*?{_segment(p)})" for p in parts[1:-1])
    return f"{_segment(parts[0])}{middle}[^/]*{_segment(parts[-1])}"


_ANY_FOLDERS = "(?:[^/]*/)*?"  # zero or more whole components, each followed by "/"


def _translate(body: str, anchored: bool) -> str:
    """The regex for one pattern's body (no ``!``, no trailing ``/``, no leading ``/``).

    ``**`` components are "any folders". Every such run but the last is atomic with the
    components that follow it (leftmost fit, as in `_component`), so matching stays
    linear in the depth of the path however many ``**`` a pattern has.
    """
    comps: list[str | None] = [] if anchored else [None]  # None: "**"
    comps += body.split("/")
    tokens: list[str | None] = []
    for comp in comps:
        if comp is None or comp == "**":
            if not tokens or tokens[-1] is not None:
                tokens.append(None)
        else:
            tokens.append(comp)
    trailing = tokens[-1] is None
    if trailing:
        tokens.pop()
    groups: list[list[str]] = [[]]
    for token in tokens:
        if token is None:
            groups.append([])
        else:
            groups[-1].append(token)
    regex = "/".join(_component(c) for c in groups[0])
    for k, group in enumerate(groups[1:], start=1):
        fixed = "/".join(_component(c) for c in group)
        sep = "/" if regex else ""
        if k < len(groups) - 1 or trailing:
            regex += f"{sep}(?>{_ANY_FOLDERS}{fixed})"
        else:
            regex += f"{sep}{_ANY_FOLDERS}{fixed}"
    if trailing:
        return f"{regex}/.*" if regex else ".*"
    return regex


def _strip_trailing_spaces(line: str) -> str:
    end = len(line)
    while end > 0 and line[end - 1] == " ":
        if end >= 2 and line[end - 2] == "\\":
            break
        end -= 1
    return line[:end]


@attrs.frozen
class Rules:
    """One `.gitignore`: its folder (relative to the root, ``""`` for the root) and its
    patterns joined into two expressions (folders; everything else)."""

    base: str
    folders: re.Pattern[str] | None
    files: re.Pattern[str] | None
    negated: frozenset[str]

    @classmethod
    def parse(cls, base: str, text: str) -> Rules | None:
        """The rules of a `.gitignore` in folder `base`, or None when it has none."""
        dirs: list[str] = []
        files: list[str] = []
        negated: set[str] = set()
        for k, raw in enumerate(text.splitlines()):
            line = _strip_trailing_spaces(raw.rstrip("\r"))
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            if negate:
                line = line[1:]
            elif line.startswith("\\!") or line.startswith("\\#"):
                line = line[1:]
            only_dirs = line.endswith("/") and not line.endswith("\\/")
            line = line.rstrip("/") if only_dirs else line
            if not line:
                continue
            anchored = "/" in line
            line = line.lstrip("/") if line.startswith("/") else line
            if not line:
                continue
            regex = _translate(line, anchored)
            group = f"p{k}"
            if negate:
                negated.add(group)
            dirs.append(f"(?P<{group}>{regex})")
            if not only_dirs:
                files.append(f"(?P<{group}>{regex})")
        if not dirs:
            return None
        # Last pattern first: the first alternative that matches is the last in the file.
        return cls(
            base=base,
            folders=re.compile("|".join(reversed(dirs)), re.S),
            files=re.compile("|".join(reversed(files)), re.S) if files else None,
            negated=frozenset(negated),
        )

    def decide(self, rel: str, is_dir: bool) -> bool | None:
        """True: ignored; False: re-included; None: no pattern of this file matches."""
        sub = rel[len(self.base) + 1 :] if self.base else rel
        regex = self.folders if is_dir else self.files
        found = regex.fullmatch(sub) if regex is not None else None
        if found is None:
            return None
        return found.lastgroup not in self.negated


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


def ignorer_for(folders: Sequence[str], gitignore_text: dict[str, str]) -> dict[str, Ignorer]:
    """The `Ignorer` of each folder in `folders` (relative, parents before children),
    from the texts of the `.gitignore` files found in them (by folder)."""
    out: dict[str, Ignorer] = {}
    for rel in folders:
        parent = out.get(rel.rpartition("/")[0], Ignorer()) if rel else Ignorer()
        text = gitignore_text.get(rel)
        out[rel] = parent.below(Rules.parse(rel, text) if text is not None else None)
    return out
