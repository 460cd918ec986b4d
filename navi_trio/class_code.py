"""The code attrs, cattrs and dataclasses generate for navi's classes, kept from one
process to the next as a module's bytecode is.

attrs writes each class's methods (``__init__``, ``__eq__``, ``__hash__``,
``__repr__``) as Python source and compiles it when the class is made: ~350 classes
before `navi run`'s first LLM request, about a fifth of its imports' CPU. cattrs does
the same for the functions that structure the config and the frames (~30 before the
first request), and dataclasses for the classes of the WebSocket and HTTP libraries
(wsproto's and h11's events: ~90 functions). A module's ``.pyc`` spares compiling the
same source in every process; this does the same for their source. The code objects
are kept in one file beside navi's own bytecode (``navi_trio/__pycache__``) and follow
its rules: written only where Python would write navi's ``.pyc`` (not under
PYTHONDONTWRITEBYTECODE, not where the process may not write), so whoever could change
the file could already change navi's ``.pyc`` files. A file that another user owns,
or that others may write, is not read.

A piece of code is found by its source (a hash of it, and the name its generator gives
it), less the one number that differs from process to process: the constant attrs puts
in ``__hash__`` (a hash of the class's name, random per process). The code loaded keeps
the constant of the process that compiled it, which serves as well: one constant per
class, the same for all its instances.

The hooks are names: attrs' ``_make`` and cattrs' ``gen`` modules call ``compile`` by
its global name, dataclasses calls ``exec`` with the source; `install` sets those
names to functions that look the source up first. Should a later version compile
another way, nothing is found and everything compiles as before
(tests/test_class_code.py says so). Only the ``navi`` command installs them
(`navi_trio.__main__`); `start_up_over` saves what start-up compiled.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import re
import sys
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from types import CodeType
from typing import Any

# attrs' __hash__ source has the class's constant alone on the line after "hash((".
_HASH_OPENS = "hash((\n"
_HASH_CONSTANT = re.compile(r"[ ]+-?[0-9]+,")
_ATTRS_SOURCE = "<attrs generated"
# The name dataclasses' source gets from `exec` (its code objects carry it).
_EXEC_SOURCE = "<string>"
# More entries than this (old versions' classes): a save keeps only this process's.
MOST = 4000


def default_path() -> Path:
    """The file beside navi's bytecode, one per Python bytecode version."""
    return Path(__file__).parent / "__pycache__" / f"attrs-code.{MAGIC_NUMBER.hex()}.marshal"


def _key(source: str, filename: str) -> bytes:
    plain = source
    at = source.find(_HASH_OPENS)  # (a find, not a regex over every line: 4x less CPU)
    if at >= 0:
        start = at + len(_HASH_OPENS)
        end = source.find("\n", start)
        if end >= 0 and _HASH_CONSTANT.fullmatch(source, start, end):
            plain = source[:start] + source[end:]
    return hashlib.blake2b(f"{filename}\0{plain}".encode(), digest_size=20).digest()


def _read(path: Path) -> dict[bytes, CodeType]:
    """The kept code objects; none when the file is missing, damaged, or not trusted
    (another user's, or writable by others)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
            return {}
        try:  # whole: marshal.load(f) reads a file object in small pieces, ~4x the CPU
            data = marshal.loads(f.read())
        except (EOFError, ValueError, TypeError):
            return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, bytes) and isinstance(v, CodeType)}


class ClassCode:
    """Generated code by source: the kept file's, and what this process compiled."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.codes = _read(path)
        self.used: set[bytes] = set()
        self.compiled = 0  # sources not found, since the last save
        self.found = 0

    def compile(self, source: Any, filename: Any, mode: str, *args: Any, **kw: Any) -> Any:
        """`compile`, answered from the kept code for attrs' generated methods."""
        if not isinstance(filename, str) or not filename.startswith(_ATTRS_SOURCE):
            return compile(source, filename, mode, *args, **kw)
        return self.generated(source, filename, mode, *args, **kw)

    def generated(self, source: Any, filename: Any, mode: str, *args: Any, **kw: Any) -> Any:
        """`compile`, answered from the kept code: for a generator all of whose compiles
        are generated code (cattrs' structuring functions)."""
        if args or kw or mode != "exec" or not isinstance(source, str):
            return compile(source, filename, mode, *args, **kw)
        if not isinstance(filename, str):
            return compile(source, filename, mode)
        key = _key(source, filename)
        self.used.add(key)
        code = self.codes.get(key)
        if code is None:
            code = self.codes[key] = compile(source, filename, mode)
            self.compiled += 1
        else:
            self.found += 1
        return code

    def exec(self, source: Any, globals: Any = None, locals: Any = None, /) -> None:
        """`exec`, its source's code answered from the kept code (dataclasses' methods)."""
        if isinstance(source, str):
            source = self.generated(source, _EXEC_SOURCE, "exec")
        if globals is None:  # the caller's namespaces, as `exec` called there takes
            caller = sys._getframe(1)
            globals, locals = caller.f_globals, caller.f_locals if locals is None else locals
        exec(source, globals, locals)

    def save(self) -> None:
        """Write the file when something was compiled (atomically; nothing on failure)."""
        if not self.compiled or sys.dont_write_bytecode:
            return
        codes = dict(self.codes)  # (a thread may be making a class meanwhile)
        if len(codes) > MOST:
            codes = {k: v for k, v in codes.items() if k in self.used}
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                marshal.dump(codes, f)
            os.replace(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        self.compiled = 0


_installed: ClassCode | None = None


def install(path: Path | None = None) -> ClassCode:
    """attrs' and dataclasses' classes and cattrs' functions from here on compiled
    through `ClassCode` (once per process)."""
    global _installed
    if _installed is None:
        _installed = ClassCode(default_path() if path is None else path)
        hook(_installed)
    return _installed


def hook(codes: ClassCode) -> None:
    """The generators' `compile` and `exec` names set to `codes`' (once imported)."""
    import dataclasses

    import attr._make
    import cattrs.gen
    import cattrs.gen.typeddicts

    attr._make.compile = codes.compile  # type: ignore[attr-defined]
    cattrs.gen.compile = codes.generated  # type: ignore[attr-defined]
    cattrs.gen.typeddicts.compile = codes.generated  # type: ignore[attr-defined]
    dataclasses.exec = codes.exec  # type: ignore[attr-defined]


def save() -> None:
    """Keep what was compiled so far, when `install` was called."""
    if _installed is not None:
        _installed.save()
