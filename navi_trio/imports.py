"""Start-up's imports: fewer garbage collections while they run, and dependencies
imported without the optional modules they would pull in for nothing.

Start-up time is mostly imports (`navi run` to the first LLM request).

Importing makes ~100,000 objects that live as long as the process (modules, classes,
functions). At Python's threshold of 700 allocations the collector walks them in ~145
passes (~130 young, ~12 middle, one full), ~45 ms of a ~450 ms start-up on a loaded
machine, and frees only what the imports dropped on the way. `start_up_collections`
raises the young threshold for the `navi` command (`navi_trio.__main__.main`, the
console script, before the cli's own imports; cli `main` for a caller of it), so the
same garbage is found in a few passes over the young objects and the full pass is not
reached; `start_up_over` ends it (the runtime, once it has frozen
start-up's objects out of every later collection), and so does the end of the block:
both put back the thresholds the block found (Python's 700, or the process's own).
A command that opens no runtime (a client of a daemon) keeps it: a young collection
every 20,000 allocations, the older generations by Python's rules.

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
"""

from __future__ import annotations

import gc
import importlib
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType

import attrs

START_UP_GC_THRESHOLD = 20_000  # young-generation allocations between collections


@attrs.define
class _StartUp:
    """The outermost `start_up_collections` block's state: the thresholds it found on
    entry (None when no block is open), and whether `start_up_over` has put them back."""

    found: tuple[int, int, int] | None = None
    over: bool = False


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


def start_up_over() -> None:
    """The thresholds the open `start_up_collections` block found, once; nothing
    without one (a threshold the process set itself stays)."""
    with _lock:
        if _start_up.found is not None and not _start_up.over:
            gc.set_threshold(*_start_up.found)
            _start_up.over = True


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


SQLITE_UTILS_HIDDEN = ("numpy", "pandas")
HTTPX_HIDDEN = ("httpx._main",)
