"""Taking snapshots: the cached scans of recent roots, the bounds, the record.

`Snapshots.take` runs in a worker thread with the roots' trio locks held by its caller;
it takes the file locks itself. Scans of the last `MAX_STATES` roots stay cached (with
their inotify watches); a cached scan made before another process collected garbage is
dropped first (`_gc`).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import trio

from navi_trio.core.checkpoints._fsops import RootUnusableError, identities, open_root
from navi_trio.core.checkpoints._gc import gc_number
from navi_trio.core.checkpoints._ignore import NameList
from navi_trio.core.checkpoints._locks import RootLocks, hold_files
from navi_trio.core.checkpoints._marks import Ledger
from navi_trio.core.checkpoints._model import (
    CheckpointInfo,
    Created,
    LeftOut,
    Outcome,
    RootTree,
    Skipped,
)
from navi_trio.core.checkpoints._objects import ObjectStore
from navi_trio.core.checkpoints._records import Records, new_checkpoint_id
from navi_trio.core.checkpoints._result import ScanResult
from navi_trio.core.checkpoints._scan import Scan
from navi_trio.core.checkpoints._state import Limits, OverLimit, Room, RootState
from navi_trio.settings import Settings
from navi_trio.tools.private import PrivatePaths, within
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs

MAX_STATES = 16  # roots whose scan (and inotify watches) stay cached
LEFT_OUT_LISTED = 50


class Snapshots:
    def __init__(
        self,
        settings: Settings,
        folder: Path,
        objects: ObjectStore,
        records: Records,
        locks: RootLocks,
        ledger: Ledger,
        clock: Callable[[], float],
        wall: Callable[[], float],
        *,
        watch: bool,
        who: RunAs | None = None,
    ) -> None:
        self.settings = settings
        self.who = who  # the tool user of a root daemon: it reads with their rights too
        self.folder = folder
        self.real_folder = folder
        self.objects = objects
        self.records = records
        self._locks = locks
        self.ledger = ledger
        self._clock = clock
        self._wall = wall
        self._watch = watch
        self.names = NameList(settings.checkpoint_ignore)
        self._cache: OrderedDict[tuple[Path, frozenset[str], str | None], RootState] = OrderedDict()
        self._generation: dict[int, int] = {}  # id(state) -> gc number it was made under

    def states(self) -> list[RootState]:
        return list(self._cache.values())

    def states_of(self, root: Path) -> list[RootState]:
        """The cached scans of the folder `root` (one per set of folders left out)."""
        return [state for key, state in self._cache.items() if key[0] == root]

    def collected(self, generation: int) -> None:
        """Garbage was collected keeping what the cached scans trust."""
        for state in self._cache.values():
            self._generation[id(state)] = generation

    def close(self) -> None:
        for state in self._cache.values():
            state.close()
        self._cache.clear()

    def take(
        self,
        owner: str,
        roots: list[Path],
        states: list[RootState],
        private: PrivatePaths,
        label: str,
        started: float,
        held: Mapping[Path, Root],
        room: Room | None = None,
        tag: str | None = None,
    ) -> Outcome:
        max_sec = self.settings.checkpoint_max_sec
        check = self.checker(started + max_sec, max_sec)
        with hold_files(self.folder, roots):
            self.ledger.register(owner, roots)
            results: list[ScanResult] = []
            try:
                results = self.scan_all(
                    roots, states, private, check, store=True, held=held, room=room, tag=tag
                )
                trees = tuple(
                    RootTree(r, res.tree, res.mode) for r, res in zip(roots, results, strict=True)
                )
                latest = self.records.latest(owner)
                if latest is not None and latest.roots == trees:
                    finish(results)  # before the cache trusts what it stored
                    self.commit(results, states)
                    return Created(latest, True, self._clock() - started)
                info = self.info(owner, label, trees, results)
                check()  # the last moment a cancel or the clock may still abandon it
                finish(results)
                self.records.write(info)
                self.ledger.recorded(owner, info.id)
            except OverLimit as over:
                abandon(results)
                return Skipped(over.code, over.reason, self._clock() - started)
            except RootUnusableError as exc:
                abandon(results)
                return Skipped("unreadable", str(exc), self._clock() - started)
            except BaseException:
                abandon(results)
                raise
            self.commit(results, states)
            return Created(info, False, self._clock() - started)

    def scan_all(
        self,
        roots: list[Path],
        states: list[RootState],
        private: PrivatePaths,
        check: Callable[[], None],
        *,
        store: bool,
        held: Mapping[Path, Root],
        room: Room | None = None,
        tag: str | None = None,
    ) -> list[ScanResult]:
        """Scan each of `roots`, hashing (and with `store` storing) in the namespace
        `tag`: through its `held` root when there is one (the run's own, or the
        preview's), else the folder at its path opened now."""
        s = self.settings
        limits = Limits(s.checkpoint_max_bytes, s.checkpoint_max_file_bytes, s.checkpoint_max_files)
        if room is not None and room.bytes < limits.max_bytes:  # a total leaves less
            limits = attrs.evolve(
                limits, max_bytes=max(room.bytes, 0), bytes_code=room.code, bytes_name=room.name
            )
        hidden = self.hidden(private)
        generation = gc_number(self.folder)
        self.objects.sync(generation)
        writer = self.objects.writer() if store else None
        objects = self.objects.within(tag)
        results: list[ScanResult] = []
        try:
            for root, state in zip(roots, states, strict=True):
                if self._generation.get(id(state)) != generation:
                    # Objects it trusts may have been collected meanwhile; the folder
                    # is the same, so its watch (and what it queued) stays.
                    state.reset(keep_watch=True)
                fd = open_root(held.get(root, root), private)
                try:
                    scan = Scan(
                        state,
                        fd,
                        objects,
                        names=self.names,
                        hidden=hidden,
                        limits=limits,
                        check=check,
                        store=store,
                        writer=writer,
                        who=self.who,
                    )
                    results.append(ScanResult(scan))
                finally:
                    os.close(fd)
        except BaseException:
            abandon(results)
            if writer is not None:
                writer.abort()
            raise
        return results

    def commit(self, results: list[ScanResult], states: list[RootState]) -> None:
        generation = gc_number(self.folder)
        for result, state in zip(results, states, strict=True):
            result.commit()
            self._generation[id(state)] = generation

    def info(
        self, owner: str, label: str, trees: tuple[RootTree, ...], results: list[ScanResult]
    ) -> CheckpointInfo:
        sums = [0, 0, 0]
        left_out: list[LeftOut] = []
        for res in results:
            _, files, dirs, size = res.scan.totals()
            sums = [sums[0] + files, sums[1] + dirs, sums[2] + size]
            left_out += res.scan.left_out(LEFT_OUT_LISTED - len(left_out))
        return CheckpointInfo(
            id=new_checkpoint_id(),
            owner=owner,
            created=self._wall(),
            label=label,
            roots=trees,
            files=sums[0],
            dirs=sums[1],
            bytes=sums[2],
            new_bytes=sum(r.scan.new_bytes for r in results),
            changed=sum(r.scan.changed for r in results),
            left_out=tuple(left_out),
        )

    def state(
        self, root: Path, roots: Sequence[Path], private: PrivatePaths, tag: str | None = None
    ) -> RootState:
        """The cached scan of `root` in the namespace `tag` (each namespace's refs its own)."""
        excluded = {str(h.relative_to(root)) for h in private.inside(root) if h != root}
        excluded |= {str(o.relative_to(root)) for o in roots if o != root and within(o, root)}
        if within(self.real_folder, root) and self.real_folder != root:
            excluded.add(str(self.real_folder.relative_to(root)))
        key = (root, frozenset(excluded), tag)
        state = self._cache.get(key)
        if state is None:
            state = RootState(root, key[1], watch=self._watch, notes=self.ledger)
            self._cache[key] = state
        self._cache.move_to_end(key)
        for old_key in list(self._cache)[: max(0, len(self._cache) - MAX_STATES)]:
            if not self._locks.busy(old_key[0]):
                self._generation.pop(id(self._cache[old_key]), None)
                self._cache.pop(old_key).close()
        return state

    def hidden(self, private: PrivatePaths) -> frozenset[tuple[int, int]]:
        """Identities of navi's own data, this store's folder among them."""
        return identities((*private.hidden, self.real_folder))

    def checker(self, deadline: float | None, max_sec: float) -> Callable[[], None]:
        clock = self._clock

        def check() -> None:
            if deadline is not None and clock() > deadline:
                raise OverLimit(
                    "too_slow", f"it took longer than NAVI_CHECKPOINT_MAX_SEC={max_sec:g} s"
                )
            trio.from_thread.check_cancelled()

        return check


def finish(results: list[ScanResult]) -> None:
    for result in results:
        result.finish()


def abandon(results: list[ScanResult]) -> None:
    for result in results:
        result.abandon()
