"""A bash command line split into the simple commands it runs, for command-aware rules.

A small grammar, on purpose: simple commands (words and redirections) joined by
operators. What it does not know it does not guess at (subshells, substitutions,
expansions, here-docs, assignments, keywords, ``eval``, an unclosed quote): the whole
line is then `Parsed.problem`, and the policy asks. Words are split by `shlex`; a copy
of the line with every quoted character masked tells which tokens are operators.
"""

from __future__ import annotations

import os.path
import re
import shlex
from pathlib import PurePosixPath

import attrs

LINE_MAX = 16_384  # characters: a longer line is not parsed (the policy asks)
PARTS_MAX = 64  # simple commands in one line
SEPARATORS = frozenset({"|", "|&", "&&", "||", ";", "&"})
REDIRECTS = frozenset({">", ">>", "<", ">|", "&>", "&>>", ">&", "<&", "<>"})
# Programs that run their arguments (or a file) as shell code, and shell keywords that
# open a construct this grammar does not follow.
CODE_RUNNERS = frozenset({"eval", "source", ".", "exec", "builtin", "command", "coproc"})
KEYWORDS = frozenset(
    "if then else elif fi for while until do done case esac select function time ! "
    "[[ ]] { } in".split()
)
# Shells: with -c they run their argument as code, which this grammar does not follow.
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish", "busybox"})
# Programs that run another program named among their arguments: a deny or ask rule on
# a program looks among their arguments too (env rm, xargs rm, sudo rm, find -exec rm).
WRAPPERS = frozenset(
    "env sudo doas xargs nice nohup timeout stdbuf ionice chroot watch strace "
    "ltrace setsid unbuffer find parallel flock chrt taskset runuser su script".split()
)
_PUNCT = "();<>|&"
_MASK = "x"
_GLOB = frozenset("*?[")


@attrs.frozen
class SimpleCommand:
    """One program run: its words (program first) and its redirections' targets."""

    words: tuple[str, ...]
    redirects: tuple[str, ...] = ()  # file targets of > >> < &> …

    @property
    def program(self) -> str:
        return self.words[0]

    @property
    def args(self) -> tuple[str, ...]:
        return self.words[1:]

    @property
    def text(self) -> str:
        """The command in one line, unquoted words joined by spaces (what text rules see)."""
        return " ".join(self.words + tuple(f"> {r}" for r in self.redirects))


@attrs.frozen
class Parsed:
    parts: tuple[SimpleCommand, ...] = ()
    problem: str | None = None  # why the line was not parsed: the policy asks


class _Unknown(Exception):
    pass


def _mask(line: str) -> str:
    """`line` with every quoted or escaped character replaced by a letter (quotes kept),
    so shlex splits it where it splits `line` and only unquoted operators remain.
    Raises `_Unknown` for expansions and constructs the grammar does not follow."""
    out: list[str] = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == "\\":
            if i + 1 >= n or line[i + 1] == "\n":
                raise _Unknown("a line continuation")
            out += [c, _MASK]
            i += 2
            continue
        if c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise _Unknown("an unclosed quote")
            out += ["'", _MASK * (end - i - 1), "'"]
            i = end + 1
            continue
        if c == '"':
            i = _double_quoted(line, i + 1, out)
            continue
        if c == "$":
            raise _Unknown("a variable or substitution ($)")
        if c == "`":
            raise _Unknown("command substitution (backticks)")
        if c in "{}":
            raise _Unknown("a brace expansion or group")
        if c == "\n":
            c = ";"  # a newline ends a command as ; does
        out.append(c)
        i += 1
    return "".join(out)


def _double_quoted(line: str, i: int, out: list[str]) -> int:
    """Mask a double-quoted string whose opening quote is before `i`; returns the index
    after its closing quote."""
    out.append('"')
    n = len(line)
    while i < n:
        c = line[i]
        if c == '"':
            out.append('"')
            return i + 1
        if c == "\\":
            # shlex unescapes only \" and \\ here; bash more: anything else is not guessed at.
            if i + 1 >= n or line[i + 1] not in '"\\':
                raise _Unknown("an escape in double quotes")
            out += ["\\", _MASK]
            i += 2
            continue
        if c == "$":
            raise _Unknown("a variable or substitution ($)")
        if c == "`":
            raise _Unknown("command substitution (backticks)")
        out.append(_MASK)
        i += 1
    raise _Unknown("an unclosed quote")


def _tokens(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=_PUNCT)
    lexer.whitespace_split = True
    lexer.commenters = ""  # a # hides nothing from the rules: its words are arguments
    return list(lexer)


def _is_operator(masked_token: str) -> bool:
    return bool(masked_token) and all(c in _PUNCT for c in masked_token)


def parse_command(line: str) -> Parsed:
    """The simple commands of `line`, or why it is not parsed (never raises)."""
    if len(line) > LINE_MAX:
        return Parsed(problem=f"the command is longer than {LINE_MAX} characters")
    try:
        masked = _mask(line)  # as long as `line`, character for character
        plain = "".join(
            ";" if c == "\n" and m == ";" else c for c, m in zip(line, masked, strict=True)
        )
        words, shape = _tokens(plain), _tokens(masked)
        if len(words) != len(shape):
            raise _Unknown("quoting the parser cannot follow")
        return Parsed(parts=_split(words, shape, _fd_prefixed(masked)))
    except _Unknown as exc:
        return Parsed(problem=f"it has {exc}")
    except ValueError as exc:  # shlex: no closing quotation / escaped character
        return Parsed(problem=f"it cannot be split into words ({exc})")


def _fd_prefixed(masked: str) -> list[bool]:
    """For each unquoted operator of `masked`, in order: whether digits written right
    before it name a file descriptor (``2>f``), not an argument (``echo 2 >f``)."""
    return [bool(m.group(1)) for m in re.finditer(r"(?:(?<![^\s;&|()<>])(\d+))?[();<>|&]+", masked)]


def _split(words: list[str], shape: list[str], fds: list[bool]) -> tuple[SimpleCommand, ...]:
    parts: list[SimpleCommand] = []
    current: list[str] = []
    redirects: list[str] = []
    operators = iter(fds)
    i = 0
    while i < len(words):
        word, masked = words[i], shape[i]
        if not _is_operator(masked):
            current.append(word)
            i += 1
            continue
        fd = next(operators, False)
        if masked in SEPARATORS:
            parts.append(_command(current, redirects))
            current, redirects = [], []
            i += 1
            continue
        if masked not in REDIRECTS:
            raise _Unknown(_operator_problem(masked))
        if i + 1 >= len(words) or _is_operator(shape[i + 1]):
            raise _Unknown(f"a redirection {masked} with no target")
        target = words[i + 1]
        if fd and current and current[-1].isdigit() and masked not in ("&>", "&>>"):
            current.pop()  # `2>file`: a file descriptor, written against the operator
        if not (masked in (">&", "<&") and (target.isdigit() or target == "-")):
            redirects.append(target)  # >&2 duplicates a descriptor: no path
        i += 2
    if current or redirects:
        parts.append(_command(current, redirects))
    elif parts and shape[-1] not in (";", "&"):
        raise _Unknown(f"nothing after {shape[-1]}")
    if not parts:
        raise _Unknown("no command")
    if len(parts) > PARTS_MAX:
        raise _Unknown(f"more than {PARTS_MAX} commands")
    return tuple(parts)


def _operator_problem(op: str) -> str:
    if "(" in op or ")" in op:
        return "a subshell or process substitution"
    if "<<" in op:
        return "a here-doc or here-string"
    return f"the operator {op}"


def _command(words: list[str], redirects: list[str]) -> SimpleCommand:
    if not words:
        raise _Unknown("an empty command between operators")
    program = words[0]
    if "=" in program and program.split("=", 1)[0].isidentifier():
        raise _Unknown(f"an assignment before the program ({program.split('=', 1)[0]}=)")
    if program in KEYWORDS:
        raise _Unknown(f"the shell keyword {program}")
    if program in CODE_RUNNERS:
        raise _Unknown(f"{program}, which runs its arguments as shell code")
    if os.path.basename(program) in SHELLS and any(
        w.startswith("-") and not w.startswith("--") and "c" in w for w in words[1:]
    ):
        raise _Unknown(f"{program} -c, which runs its argument as shell code")
    return SimpleCommand(tuple(words), tuple(redirects))


def path_words(part: SimpleCommand) -> tuple[str, ...]:
    """What in `part` names a path: its redirections' targets, and each argument that
    looks like one (has a ``/``, starts with ``~`` or ``.``), an option's value too."""
    found = list(part.redirects)
    for arg in part.args:
        value = _candidates(arg)[-1]  # an option's value, else the argument
        if value not in found and _looks_like_path(value):
            found.append(value)
    return tuple(found)


def _candidates(arg: str) -> list[str]:
    """`arg` itself, and the value of an option glued to it (``--out=/x``, ``-o/x``)."""
    out = [arg]
    if arg.startswith("-") and "=" in arg:
        out.append(arg.split("=", 1)[1])
    elif arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:
        out.append(arg[2:])
    return out


def _looks_like_path(word: str) -> bool:
    return "/" in word or word.startswith(("~", ".")) or word in (".", "..")


def inside(path: str, cwd: str, roots: tuple[str, ...]) -> bool:
    """Whether `path`, resolved against `cwd` without following links, is inside one of
    `roots` (``~`` is never: this reads no home folder)."""
    if path.startswith("~") or not roots:
        return False
    if any(c.startswith(".") and _GLOB & set(c) for c in path.split("/")):
        return False  # .* may match .. in a bash that globs it
    full = os.path.normpath(os.path.join(cwd, path))
    here = PurePosixPath(full)
    return any(here == PurePosixPath(r) or PurePosixPath(r) in here.parents for r in roots)


CHDIR = frozenset({"cd", "pushd", "popd"})


def moved_to(part: SimpleCommand, cwd: str) -> str:
    """The folder the parts after `part` run in: `cwd`, or where a ``cd`` goes ("" when
    it cannot be known, as for ``cd -`` or ``popd``: every relative path is outside then)."""
    if part.program not in CHDIR:
        return cwd
    args = [a for a in part.args if a != "--"]
    if part.program == "popd" or len(args) != 1 or args[0].startswith(("-", "~")) or not cwd:
        return ""
    return os.path.normpath(os.path.join(cwd, args[0]))


def outside_paths(part: SimpleCommand, cwd: str, roots: tuple[str, ...]) -> tuple[str, ...]:
    """The words of `part` that may name a path outside `roots`: every candidate of every
    argument is checked (not only the ones that look like paths: ``..`` alone is one),
    so an allow rule for paths inside never covers them."""
    words = list(part.redirects)
    for arg in part.args:
        words += _candidates(arg)
    return tuple(w for w in dict.fromkeys(words) if not inside(w, cwd, roots))
