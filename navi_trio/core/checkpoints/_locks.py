"""The locks a checkpoint operation holds (see `engine`'s docstring for the order)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path

import trio

from navi_trio.core.checkpoints._objects import FileLock


class RootLocks:
    """A trio lock per root path, kept only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[Path, tuple[trio.Lock, int]] = {}

    def busy(self, root: Path) -> bool:
        return root in self._locks

    @asynccontextmanager
    async def hold(self, roots: Sequence[Path]) -> AsyncIterator[None]:
        keys = sorted(set(roots))
        for key in keys:
            lock, users = self._locks.get(key, (trio.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        acquired: list[trio.Lock] = []
        try:
            for key in keys:
                lock = self._locks[key][0]
                await lock.acquire()
                acquired.append(lock)
            yield
        finally:
            for lock in acquired:
                lock.release()
            for key in keys:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


@contextmanager
def hold_files(folder: Path, roots: Sequence[Path]) -> Iterator[None]:
    """The store's flock (shared) and each root's flock (exclusive), in this thread."""
    with ExitStack() as stack:
        store = FileLock(folder / "lock")
        store.acquire(exclusive=False)
        stack.callback(store.release)
        for root in sorted(roots):
            key = hashlib.sha256(str(root).encode("utf-8", "surrogatepass")).hexdigest()[:32]
            lock = FileLock(folder / "roots" / f"{key}.lock")
            lock.acquire(exclusive=True)
            stack.callback(lock.release)
        yield
