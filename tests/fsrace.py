"""The symlink race of issue 17, for the tests: a folder and a symlink swapped with
``renameat2(RENAME_EXCHANGE)`` in a loop by another process, while a tool works on
paths through the folder.

`exchange(a, b)` swaps two names once; `skip_reason(tmp)` says why this machine cannot
(no renameat2 in libc, or the filesystem refuses the flag); `swapping(a, b)` runs
``python -I -S tests/fsrace.py A B SECONDS`` (this file) for the length of an ``async with``:
it swaps as fast as it can and stops by itself after SECONDS or MAX_SWAPS, whichever
comes first, and is killed when the block ends. A process, not a thread: it must run
truly beside the tool's worker thread, not take turns with it for the GIL.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

AT_FDCWD = -100
RENAME_EXCHANGE = 2
MAX_SWAPS = 50_000_000
READY = b"swapping\n"


def _swapper(a: Path, b: Path) -> Callable[[], None]:
    """A function swapping `a` and `b` once (OSError when the kernel or fs refuses)."""
    func = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc >= 2.28
    if func is None:
        raise OSError("renameat2 is not in this libc")
    first, second = os.fsencode(a), os.fsencode(b)

    def swap() -> None:
        if func(AT_FDCWD, first, AT_FDCWD, second, RENAME_EXCHANGE) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return swap


def exchange(a: Path, b: Path) -> None:
    """Swap the names `a` and `b` atomically."""
    _swapper(a, b)()


def skip_reason(tmp: Path) -> str | None:
    """Why RENAME_EXCHANGE cannot be used under `tmp`, or None when it can."""
    probe = tmp / "rename-exchange-probe"
    probe.mkdir(parents=True)
    (probe / "dir").mkdir()
    (probe / "link").symlink_to("/")
    try:
        exchange(probe / "dir", probe / "link")
    except OSError as exc:
        return f"renameat2(RENAME_EXCHANGE) is not available here: {exc}"
    finally:
        shutil.rmtree(probe)
    return None


@asynccontextmanager
async def swapping(a: Path, b: Path, seconds: float = 60.0) -> AsyncIterator[None]:
    """`a` and `b` swapped in a loop by another process while the block runs (it has
    swapped once when the block starts). The swapper imports nothing beyond the standard
    library and starts without site-packages (``-I -S``): a few hundredths of a second,
    where importing trio as well took over a second on a busy machine."""
    import trio

    proc = await trio.lowlevel.open_process(
        [sys.executable, "-I", "-S", __file__, str(a), str(b), str(seconds)],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        with trio.fail_after(30):
            got = b""
            while not got.endswith(READY):
                chunk = await proc.stdout.receive_some(64)
                assert chunk, "the swapper ended before it swapped"
                got += chunk
        yield
    finally:
        proc.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await proc.wait()


def _main(a: str, b: str, seconds: str) -> None:
    end = time.monotonic() + float(seconds)
    swap = _swapper(Path(a), Path(b))
    swap()
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    for n in range(MAX_SWAPS):
        swap()
        if n % 4096 == 0 and time.monotonic() > end:
            return


if __name__ == "__main__":
    _main(*sys.argv[1:4])
