"""Start-up's imports: fewer garbage collections while they run, and dependencies
imported without the optional modules they would pull in for nothing.

Start-up time is mostly imports (`navi run` to the first LLM request).

Importing makes ~100,000 objects that live as long as the process (modules, classes,
functions). At Python's threshold of 700 allocations the collector walks them in ~145
passes (~130 young, ~12 middle, one full), ~45 ms of a ~450 ms start-up on a loaded
machine, and frees only what the imports dropped on the way. `start_up_collections`
raises the young threshold for the `navi` command (`navi_trio.__main__.main`, the
console script, before the cli's own imports; cli `main` for a caller of it) above
what a start-up allocates, so no collection runs while it imports; `start_up_over`
ends it (the runtime, once it has frozen start-up's objects out of every later
collection; a client, once its connection to a daemon is open), and so does the end
of the block: each puts back the thresholds the block found (Python's 700, or the
process's own). What the imports dropped in cycles
(~10,000 objects, ~3 MB: mostly the classes attrs replaces with slotted ones) is
frozen with the rest and stays for the life of the process: a walk to free it costs
as much as the ~4 passes it took at 20,000 allocations (~8% of the start-up). A
command that neither opens a runtime nor connects keeps the threshold to its end.
This module imports nothing beyond the standard library (and `class_code`, which
imports only that), so that the block opens before attrs is imported.

Two dependencies import heavy optional modules at import time that navi never uses:

- sqlite-utils imports numpy and pandas when they are installed (numpy is, with the
  `local` extra) only to map their scalar types to column types: navi stores no numpy
  values. numpy alone is ~50 ms.
- httpx imports its command-line client (`httpx._main`: click, rich, pygments, ~30 ms)
  to export ``httpx.main``; navi never calls it.

`import_hiding` imports such a module while those names look absent (``None`` in
`sys.modules`, which makes their import raise ImportError, which both libraries catch),
then makes them importable again: llama-cpp-python still gets numpy when the local
backend loads. A hidden module that is already imported is left alone. Meant for import
time (store/__init__.py, llm/__init__.py): another thread importing a hidden module at
that very moment would find it "not installed".

One imports a heavy module for one small answer: trio-websocket asks
``importlib.metadata.version("trio")`` at import (to tell a trio older than 0.22
apart), and importlib.metadata with its csv, zipfile and resource modules, and the
search of every installed distribution for trio's, is ~40% of trio-websocket's import
(~8 ms of a quiet `navi run`). `import_standing_in` imports it while a stand-in module
answers those names (trio's own ``__version__``, the version its distribution states);
should it ask the stand-in for anything else, it is imported again with the real
module (api/_trio_websocket.py).

And one runs a program for an answer the C library already has: trio, to name its worker
threads, asks ``ctypes.util.find_library("pthread")``, which on Linux forks and execs
``/sbin/ldconfig -p`` and reads its whole cache (2-14 ms of wall time at every start).
On glibc the answer is always glibc's own soname, ``libpthread.so.0`` (the library
before glibc 2.34, a stub that loads from libc since; `dlopen` finds it without the
cache). `import_answering_pthread` imports trio while `find_library` gives that answer
for "pthread" and asks the real one for any other name (the `navi` command,
`navi_trio.__main__`). Elsewhere (musl, macOS) nothing changes.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from navi_trio import class_code

# Young-generation allocations between collections: above a start-up's (`navi run`
# ~100,000 up to its runtime's freeze).
START_UP_GC_THRESHOLD = 200_000


class _StartUp:
    """The outermost `start_up_collections` block's state: the thresholds it found on
    entry (None when no block is open), and whether `start_up_over` has put them back."""

    __slots__ = ("found", "over")

    def __init__(self) -> None:
        self.found: tuple[int, int, int] | None = None
        self.over = False


# The collector's thresholds are the process's, so the block that changed them is too:
# one record, not an object passed around.
_start_up = _StartUp()
_lock = threading.Lock()


@contextmanager
def start_up_collections() -> Iterator[None]:
    """Young collections every `START_UP_GC_THRESHOLD` allocations for the block (or
    until `start_up_over`), then exactly the thresholds it found. Within a block of its
    own it changes nothing: the outer block owns the start-up."""
    with _lock:
        found = None if _start_up.found is not None else gc.get_threshold()
        if found is not None:
            _start_up.found, _start_up.over = found, False
            gc.set_threshold(START_UP_GC_THRESHOLD, *found[1:])
    try:
        yield
    finally:
        if found is not None:
            with _lock:
                if not _start_up.over:
                    gc.set_threshold(*found)
                _start_up.found = None
            class_code.save()


def start_up_over() -> None:
    """The thresholds the open `start_up_collections` block found, once; nothing
    without one (a threshold the process set itself stays). The code attrs compiled
    for start-up's classes is kept for the next process (`class_code`, when the
    command installed it)."""
    with _lock:
        if _start_up.found is not None and not _start_up.over:
            gc.set_threshold(*_start_up.found)
            _start_up.over = True
        else:
            return
    class_code.save()


def import_hiding(name: str, hidden: Iterable[str]) -> ModuleType:
    """Import `name` (once) with the modules in `hidden` absent to it; returns `name`."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    hiding = [h for h in hidden if h not in sys.modules]
    for h in hiding:
        sys.modules[h] = None  # type: ignore[assignment]  # "not installed" to `import`
    try:
        return importlib.import_module(name)
    finally:
        for h in hiding:
            if h in sys.modules and sys.modules[h] is None:
                del sys.modules[h]


def import_standing_in(name: str, module: str, **names: Any) -> ModuleType:
    """Import `name` (once) while `module` is a stand-in holding `names` (when it is not
    imported yet); imported as it is, with the real `module`, when the stand-in does
    not serve it. Meant for import time, as `import_hiding`."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    if module not in sys.modules:
        stand_in = ModuleType(module)
        stand_in.__dict__.update(names)
        sys.modules[module] = stand_in
        try:
            return importlib.import_module(name)
        except (ImportError, AttributeError):
            pass  # it wants more of `module` than the stand-in has: the real one, below
        finally:
            if sys.modules.get(module) is stand_in:
                del sys.modules[module]
    return importlib.import_module(name)


SQLITE_UTILS_HIDDEN = ("numpy", "pandas")
HTTPX_HIDDEN = ("httpx._main",)


# What `ctypes.util.find_library("pthread")` answers on glibc (its `ldconfig -p` cache).
GLIBC_PTHREAD = "libpthread.so.0"


def _glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):  # not a name here, or not glibc
        return False


def import_answering_pthread(name: str) -> ModuleType:
    """Import `name` (once) while, on glibc, ``ctypes.util.find_library("pthread")``
    answers glibc's soname without running ``ldconfig -p``; any other name is asked of
    the real one. Meant for import time, as `import_hiding`."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    if not sys.platform.startswith("linux") or not _glibc():
        return importlib.import_module(name)
    import ctypes.util

    real = ctypes.util.find_library

    def find_library(library: str) -> str | None:
        return GLIBC_PTHREAD if library == "pthread" else real(library)

    ctypes.util.find_library = find_library  # type: ignore[assignment]  # (its parameter's name)
    try:
        return importlib.import_module(name)
    finally:
        if ctypes.util.find_library is find_library:
            ctypes.util.find_library = real
