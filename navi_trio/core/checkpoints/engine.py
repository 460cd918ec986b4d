"""`CheckpointEngine`: the async face of the checkpoint store (see the package docstring).

Every method runs its blocking work in one `trio.to_thread.run_sync` call
(``abandon_on_cancel=False``: the thread is never left running behind the caller's
back). Locks, from the outside in:

- a trio lock per root (this process: two snapshots of one folder take turns; roots in
  sorted order, so two callers never wait on each other crosswise);
- ``roots/KEY.lock``, an flock per root (other daemons on the same data folder);
- ``lock``, the store's flock: shared by snapshots, previews and restores, exclusive
  for garbage collection (which must not remove what a snapshot is writing).

Garbage collection keeps what any record, any pending journal and this process's
cached scans refer to, then bumps the number in ``gc``; a cached scan made under an
older number (another process collected) is dropped before it is trusted again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from navi_trio.core.checkpoints._apply import Exported, Journal, export_root, needed, refused
from navi_trio.core.checkpoints._diffs import ChangedFile, changed_paths, file_then_and_now
from navi_trio.core.checkpoints._fsops import (
    Folders,
    RootUnusableError,
    hold_root,
    open_root,
    parent_of,
)
from navi_trio.core.checkpoints._gc import collect
from navi_trio.core.checkpoints._locks import RootLocks, hold_files
from navi_trio.core.checkpoints._marks import Ledger, Marks, drain, stamps_of
from navi_trio.core.checkpoints._model import (
    CheckpointChangedError,
    CheckpointDamagedError,
    CheckpointError,
    CheckpointInfo,
    Outcome,
    Preview,
    Restored,
    RootChanges,
    RootTree,
    Scope,
    Skipped,
)
from navi_trio.core.checkpoints._objects import FileLock, ObjectStore, namespace_tag, ref_tag
from navi_trio.core.checkpoints._plan import Only, Op, changed_parts, plan_root
from navi_trio.core.checkpoints._records import Records
from navi_trio.core.checkpoints._result import ScanResult
from navi_trio.core.checkpoints._snapshots import Snapshots, abandon, finish
from navi_trio.core.checkpoints._state import OverLimit, Room, RootState
from navi_trio.errors import RootChangedError
from navi_trio.settings import Settings
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import run_as

log = logging.getLogger(__name__)
T = TypeVar("T")
Held = dict[Path, Root]  # the folders of a checkpoint that exist now, held open


def _check_roots(roots: Sequence[Path | Root]) -> list[Path]:
    out = []
    for root in roots:
        path = root.path if isinstance(root, Root) else Path(root)
        if not path.is_absolute() or Path(os.path.normpath(path)) != path:
            raise CheckpointError(f"{root}: a checkpoint root must be an absolute real path")
        out.append(path)
    if len(set(out)) != len(out) or not out:
        raise CheckpointError("checkpoint roots must be one or more distinct folders")
    return out


class CheckpointEngine:
    """Snapshots of folders, their restore, and their keeping. Open it with
    `open_checkpoints` (which completes what a killed restore left)."""

    def __init__(
        self,
        settings: Settings,
        *,
        folder: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        watch: bool = True,
    ) -> None:
        self.settings = settings
        self.folder = folder if folder is not None else settings.data_dir / "checkpoints"
        self.objects = ObjectStore(self.folder)
        self.records = Records(self.folder)
        # A root daemon's snapshots and restores act with the tool user's rights too.
        self.who = run_as(settings.tool_user)
        self.journal = Journal(self.folder / "journal", self.who)
        self.ledger = Ledger(self.records.folder_of, self.records.latest_id)
        self._clock = clock
        self._wall = wall
        self._locks = RootLocks()
        self._snaps = Snapshots(
            settings,
            self.folder,
            self.objects,
            self.records,
            self._locks,
            self.ledger,
            clock,
            wall,
            watch=watch,
            who=self.who,
        )

    async def recover(self) -> list[str]:
        """Prepare the folders; complete every restore a killed process left; the
        journals completed."""
        return await self._thread(self._recover_sync)

    def close(self) -> None:
        self._snaps.close()
        self.objects.close()

    async def snapshot(
        self,
        owner: str,
        roots: Sequence[Path | Root],
        *,
        private: PrivatePaths,
        label: str = "",
        room: Room | None = None,
        namespace: str | None = None,
    ) -> Outcome:
        """Snapshot `roots` (the session folder, the run's cwd: folders the caller holds,
        or absolute real paths, opened without following a symlink) for `owner`, adding at
        most `room` (a total's bound) of new content. Its objects are stored in
        `namespace` (the user it is charged to; default: the owner), shared with no other
        (see `_objects`). Over a bound, unreadable or switched off: `Skipped`, never an
        error."""
        started = self._clock()
        if not self.settings.checkpoints:
            return Skipped("off", "checkpoints are switched off (NAVI_CHECKPOINTS=false)", 0.0)
        paths = _check_roots(roots)
        held = {r.path: r for r in roots if isinstance(r, Root)}
        tag = namespace_tag(owner if namespace is None else namespace)
        async with self._locks.hold(paths):
            states = [self._snaps.state(p, paths, private, tag) for p in paths]
            job = functools.partial(
                self._snaps.take, owner, paths, states, private, label, started, held, room, tag
            )
            return await self._thread(job)

    @asynccontextmanager
    async def calling(
        self, owner: str, roots: Sequence[Root], *, private: PrivatePaths
    ) -> AsyncIterator[None]:
        """While one of `owner`'s writing calls runs on `roots` (the run's held
        folders): what changes there meanwhile counts as the owner's (`_marks`). What
        the folders' watches queued before is read first, as it was (someone else's
        when no call of the owner ran)."""
        if not self.settings.checkpoints or not roots:
            yield
            return
        await self._boundary(owner, roots, private, begin=True)
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                await self._boundary(owner, roots, private, begin=False)

    async def _boundary(
        self, owner: str, roots: Sequence[Root], private: PrivatePaths, *, begin: bool
    ) -> None:
        paths = [r.path for r in roots]
        async with self._locks.hold(paths):
            job = functools.partial(self._boundary_sync, owner, roots, private, begin)
            await self._thread(job)

    def _boundary_sync(
        self, owner: str, roots: Sequence[Root], private: PrivatePaths, begin: bool
    ) -> None:
        for root in roots:
            self._drain(self._snaps.states_of(root.path), root, private, None)
        (self.ledger.begin if begin else self.ledger.end)(owner, [r.path for r in roots])

    def _drain(
        self, states: list[RootState], root: Root | Path, private: PrivatePaths, forced: str | None
    ) -> None:
        """Drain the watches of one folder's cached scans (`forced`: as that owner's)."""
        if not states:
            return
        try:
            fd: int | None = open_root(root, private)
        except RootUnusableError:
            fd = None  # new folders are not walked: the marks say everything
        try:
            for state in states:
                drain(state, fd, self._snaps.names, forced)
        finally:
            if fd is not None:
                os.close(fd)

    async def stored_bytes(self, owners: Sequence[str] | None = None) -> int:
        """The new content the kept checkpoints of `owners` (None: of everyone) added
        to the store: what the totals bound."""
        return await self._thread(functools.partial(self.records.stored_bytes, owners))

    async def checkpoints(self, owner: str) -> list[CheckpointInfo]:
        """The owner's checkpoints, oldest first."""
        return await self._thread(functools.partial(self.records.of, owner))

    async def get(self, owner: str, checkpoint_id: str) -> CheckpointInfo:
        """One checkpoint (`UnknownCheckpointError` when the owner has no such one)."""
        return await self._thread(functools.partial(self.records.get, owner, checkpoint_id))

    async def prune(self, owner: str) -> list[str]:
        """Drop the owner's checkpoints beyond NAVI_CHECKPOINT_KEEP (newest kept) and
        older than NAVI_CHECKPOINT_MAX_AGE_SEC, then collect garbage; the ids dropped."""
        return await self._thread(functools.partial(self._prune_sync, owner))

    def _prune_sync(self, owner: str) -> list[str]:
        infos = self.records.of(owner)
        keep = self.settings.checkpoint_keep
        now = self._wall()
        old = infos[:-keep] if len(infos) > keep else []
        old += [
            i for i in infos[len(old) :] if now - i.created > self.settings.checkpoint_max_age_sec
        ]
        ids = [i.id for i in old]
        if ids:
            self.records.delete(owner, ids)
            kept = self.records.ids(owner)
            self.ledger.compact(owner, kept[0] if kept else "~")  # "~": after every id
            self._gc_sync()
        return ids

    async def delete_all(self, owner: str) -> int:
        """Delete every checkpoint of `owner` (its session is deleted) and the objects
        no other checkpoint shares; how many checkpoints."""
        return await self._thread(functools.partial(self._delete_all_sync, owner))

    def _delete_all_sync(self, owner: str) -> int:
        self.ledger.forget(owner)
        count = self.records.delete_owner(owner)
        self._gc_sync()
        return count

    def _gc_sync(self) -> int:
        states = self._snaps.states()
        removed, generation = collect(self.folder, self.objects, self.records, self.journal, states)
        self._snaps.collected(generation)
        return removed

    async def preview(
        self,
        owner: str,
        checkpoint_id: str,
        *,
        private: PrivatePaths,
        scope: Scope | None = None,
    ) -> Preview:
        """What restoring the checkpoint would change, before anything is applied. It
        takes a checkpoint of the folders as they are (`Preview.undo`). With `scope`,
        only the owner's own changes since, in the folders it names (a rewind)."""

        def work(info: CheckpointInfo, states: list[RootState], held: Held) -> Preview:
            return self._plan(owner, info, states, private, held, scope)[0]

        return await self._held_work(owner, checkpoint_id, private, scope, work)

    async def restore(
        self,
        owner: str,
        checkpoint_id: str,
        *,
        private: PrivatePaths,
        confirm: str | None = None,
        scope: Scope | None = None,
    ) -> Restored:
        """Restore the checkpoint's roots to exactly its tree (see the package docstring
        for what is left as it is), or with `scope` only the owner's own changes since
        (a rewind). With `confirm` (a preview's token) a folder that changed since that
        preview is refused (`CheckpointChangedError`). Once it starts writing it is not
        cancellable: a cancel waits for it to finish. What it writes is marked as the
        owner's (a later restore of its undo puts it back)."""
        started = self._clock()

        def work(
            info: CheckpointInfo, states: list[RootState], held: Held
        ) -> tuple[Preview, list[Any]]:
            preview, plans = self._plan(owner, info, states, private, held, scope)
            if confirm is not None and confirm != preview.token:
                raise CheckpointChangedError(
                    "the folders changed after the preview: look at a new preview first"
                )
            missing = [d for _, ops in plans for d in needed(ops) if not self.objects.has(d)]
            if missing:
                raise CheckpointDamagedError(
                    f"checkpoint {info.id} lacks {len(missing)} stored file(s); nothing was changed"
                )
            if not any(ops for _, ops in plans):
                return preview, []
            after = preview.undo or ""
            failed = self.journal.run(
                self.objects, plans, info.id, private, held, owner=owner, after=after
            )
            self._restored(owner, plans, states, info, private, held)
            return preview, failed

        preview, failed = await self._held_work(owner, checkpoint_id, private, scope, work)
        return Restored(preview, tuple(failed), self._clock() - started)

    async def _held_work(
        self,
        owner: str,
        checkpoint_id: str,
        private: PrivatePaths,
        scope: Scope | None,
        work: Callable[[CheckpointInfo, list[RootState], Held], T],
    ) -> T:
        """`work(info, states, held)` in a thread, the checkpoint's folders locked and
        the existing ones held open (`_held`)."""
        info = _scoped(await self.get(owner, checkpoint_id), scope)
        async with self._locks.hold(info.paths):
            tag = _tag(info)
            states = [self._snaps.state(p, list(info.paths), private, tag) for p in info.paths]

            def job() -> T:
                with hold_files(self.folder, list(info.paths)), _held(info.paths) as held:
                    return work(info, states, held)

            return await self._thread(job)

    def _restored(
        self,
        owner: str,
        plans: list[tuple[Path, list[Op]]],
        states: list[RootState],
        info: CheckpointInfo,
        private: PrivatePaths,
        held: Mapping[Path, Root],
    ) -> None:
        """Mark what the restore wrote as the owner's: its watches' events (the
        folders' other owners see someone else's change) and every path it wrote."""
        by_path = dict(zip(info.paths, states, strict=True))
        for path, ops in plans:
            if not ops:
                continue
            root: Root | Path = held.get(path, path)
            self._drain([by_path[path]], root, private, owner)
            rels = _written(ops)
            try:
                fd = open_root(root, private)
            except RootUnusableError:
                stamps = {}
            else:
                try:
                    stamps = stamps_of(fd, rels)
                finally:
                    os.close(fd)
            self.ledger.mark(owner, path, rels, stamps)

    def _plan(
        self,
        owner: str,
        info: CheckpointInfo,
        states: list[RootState],
        private: PrivatePaths,
        held: Mapping[Path, Root],
        scope: Scope | None = None,
        *,
        look: bool = False,
    ) -> tuple[Preview, list[tuple[Path, list[Op]]]]:
        """What restoring `info` changes in each of its folders, as `held` (the ones
        that exist) are now: scanned, planned and later restored through those fds.
        With `scope`, only what the owner's calls changed since (`_marks`). `look`:
        only to see what changed (`changes`): nothing is stored, no undo is taken."""
        check = self._snaps.checker(None, 0.0)
        self.ledger.register(owner, list(info.paths))
        pairs = list(zip(info.roots, states, strict=True))
        present = [(rt, state) for rt, state in pairs if rt.path in held]
        missing = [rt for rt, _ in pairs if rt.path not in held]
        roots = [rt.path for rt, _ in present]
        undo, skipped = None, ""
        results: list[ScanResult] = []
        # The folders as they are, in the checkpoint's namespace.
        scan = functools.partial(
            self._snaps.scan_all, roots, [s for _, s in present], private, check, held=held
        )
        try:
            try:
                results = scan(store=not look, tag=_tag(info))
                if look:
                    skipped = "only looked"
            except OverLimit as over:
                if over.code != "too_large":
                    raise CheckpointError(
                        f"the folders cannot be compared: {over.reason}"
                    ) from None
                skipped = over.reason
                results = scan(store=False, tag=_tag(info))
            except RootUnusableError as exc:
                raise CheckpointError(str(exc)) from None
            if not skipped and results:
                trees = tuple(
                    RootTree(r, res.tree, res.mode) for r, res in zip(roots, results, strict=True)
                )
                latest = self.records.latest(owner)
                # Reused only when nothing was marked since: the undo's own marks must
                # be what came after it.
                if (
                    latest is not None
                    and latest.roots == trees
                    and not self.ledger.any_since(owner, latest.id)
                ):
                    finish(results)
                    undo = latest.id
                else:
                    before = self._snaps.info(owner, f"before restoring {info.id}", trees, results)
                    finish(results)
                    self.records.write(before)
                    self.ledger.recorded(owner, before.id)
                    undo = before.id
            marks = self.ledger.since(owner, info.id) if scope is not None else {}
            plans: list[tuple[Path, list[Op]]] = []
            changes: list[RootChanges] = []
            found = zip([rt for rt, _ in present], results, strict=True)
            for rt, res in [*found, *((rt, None) for rt in missing)]:
                only = _only(scope, marks, rt.path)
                ops, summary = self._plan_root(rt, res, private, held.get(rt.path), only)
                plans.append((rt.path, ops))
                changes.append(summary)
        except BaseException:
            abandon(results)
            raise
        if skipped:
            abandon(results)
        else:
            self._snaps.commit(results, [s for _, s in present])
        # The token names the folders as they are (their listings' digests) and what
        # the restore would do: a file edited after the preview changes it even where
        # the plan would be the same (a deletion is one whatever the file holds).
        now = [[res.tree, res.mode] for res in results]
        token = hashlib.sha256(
            json.dumps([info.id, now, [[str(r), ops] for r, ops in plans]]).encode()
        ).hexdigest()
        return Preview(info.id, tuple(changes), undo, skipped, token), plans

    def _plan_root(
        self,
        rt: RootTree,
        result: ScanResult | None,
        private: PrivatePaths,
        root: Root | None,
        only: Only | None = None,
    ) -> tuple[list[Op], RootChanges]:
        if result is None or root is None:  # the root folder is gone: everything is made again
            return _plan_new(self.objects, rt, rt.path, only)
        current, sealed, target = changed_parts(self.objects, rt.tree, rt.mode, result.folder)
        fd = open_root(root, private)
        fds = Folders(fd)
        try:
            unseen = functools.partial(_exists, fds)
            return plan_root(
                rt.path,
                current,
                result.mode,
                sealed,
                target,
                self.objects,
                unseen,
                only,
                functools.partial(refused, fd, who=self.who),
            )
        finally:
            fds.close()
            os.close(fd)

    async def changes(
        self,
        owner: str,
        checkpoint_id: str,
        *,
        private: PrivatePaths,
        scope: Scope,
        max_files: int,
        max_file_bytes: int,
    ) -> tuple[list[ChangedFile], int]:
        """The files the owner's calls changed since the checkpoint (what a rewind to it
        with `scope` would put back), each with its content then and now, read up to
        `max_file_bytes` (past it: `too_large`, neither read). At most `max_files`, and
        how many more there are. Nothing is stored and no undo is taken: it only looks."""

        def work(
            info: CheckpointInfo, states: list[RootState], held: Held
        ) -> tuple[list[ChangedFile], int]:
            _, plans = self._plan(owner, info, states, private, held, scope, look=True)
            found: list[ChangedFile] = []
            more = 0
            for path, ops in plans:
                for rel, before in changed_paths(ops).items():
                    if len(found) >= max_files:
                        more += 1
                        continue
                    root = held.get(path)
                    then_now = file_then_and_now(
                        self.objects, path, rel, before, root, private, max_file_bytes
                    )
                    found.append(then_now)
            return found, more

        return await self._held_work(owner, checkpoint_id, private, scope, work)

    async def export(
        self,
        owner: str,
        checkpoint_id: str,
        root: Path,
        into: Root,
        name: str,
        *,
        uid: tuple[int, int] | None = None,
    ) -> Exported:
        """Copy `root` as the checkpoint holds it into the new folder `name` of the held
        folder `into` (a fork's copy). The new folder is made empty first and complete
        at the end, in one rename; what could not be written is in the answer. A root
        daemon's copy of a session folder is `uid`'s (uid, gid), made in navi's own
        data; any other copy is the owner of `into`'s, made only where the tool user may
        make a folder (a CheckpointError naming it)."""
        info = await self.get(owner, checkpoint_id)
        tree = next((r for r in info.roots if r.path == root), None)
        if tree is None:
            raise CheckpointError(f"checkpoint {checkpoint_id} holds no folder {root}")
        return await self._thread(functools.partial(self._export_sync, tree, into, name, uid))

    def _export_sync(
        self, tree: RootTree, into: Root, name: str, uid: tuple[int, int] | None
    ) -> Exported:
        dest = into.path / name
        with hold_files(self.folder, []):
            ops, _ = _plan_new(self.objects, tree, dest)
            try:
                who = self.who if uid is None else None
                return export_root(self.objects, ops, into, name, uid, who)
            except FileExistsError:
                raise CheckpointError(f"{dest} already exists") from None
            except PermissionError:
                raise CheckpointError(
                    f"{dest} cannot be made: the tool user may not make a folder in {into.path}"
                ) from None
            except RootChangedError as exc:
                raise CheckpointError(str(exc)) from None

    async def _thread(self, job: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(job, abandon_on_cancel=False)

    def _recover_sync(self) -> list[str]:
        for folder in (self.folder, self.folder / "roots"):
            folder.mkdir(parents=True, exist_ok=True)
        self.objects.prepare()
        self.records.prepare()
        self.journal.prepare()
        self._snaps.real_folder = Path(os.path.realpath(self.folder))
        lock = FileLock(self.folder / "lock")
        if lock.acquire(exclusive=True, wait=False):
            try:
                self.objects.clean_tmp()  # no writer anywhere: what is there is dead
                self.journal.clean_stale()
            finally:
                lock.release()
        with hold_files(self.folder, []):
            done = self.journal.recover(self.objects, self._recovered)
        for jid, failed in done:
            if failed:
                log.warning(
                    "checkpoints: the restore %s, completed after a crash, left %d path(s)"
                    " as they were: %s",
                    jid,
                    len(failed),
                    "; ".join(f"{k.path} ({k.why})" for k in failed[:5]),
                )
        return [jid for jid, _ in done]

    def _recovered(self, journal: dict[str, Any]) -> None:
        """A restore completed from its journal: what it wrote is its owner's."""
        owner = journal.get("owner")
        if not isinstance(owner, str) or not owner:
            return
        after = str(journal.get("after", ""))
        for root in journal.get("roots", []):
            if rels := _written(root["ops"]):
                self.ledger.mark(owner, Path(root["path"]), rels, {}, after=after)


@contextmanager
def _held(paths: Sequence[Path]) -> Iterator[dict[Path, Root]]:
    """The folders of a checkpoint that exist now, held open for one preview or restore
    (by path -> root): the scan, the plan and the writes all go through these fds. A
    path that leads through a symlink now (a folder swapped after the checkpoint) is a
    `CheckpointError` naming it: nothing is read or changed through it."""
    with ExitStack() as stack:
        try:  # a missing one is made again (`_plan_new`)
            roots = {p: stack.enter_context(hold_root(p)) for p in paths if os.path.lexists(p)}
        except RootUnusableError as exc:
            raise CheckpointError(f"the files cannot be restored: {exc}") from None
        yield roots


def _written(ops: Sequence[Sequence[Any]]) -> list[str]:
    """The paths a restore's ops write, sorted."""
    return sorted({op[1] for op in ops if op[0] != "unlock"})


def _tag(info: CheckpointInfo) -> str | None:
    """The namespace a checkpoint's objects are in (None: taken before namespaces)."""
    return ref_tag(info.roots[0].tree) if info.roots else None


def _plan_new(
    objects: ObjectStore, tree: RootTree, root: Path, only: Only | None = None
) -> tuple[list[Op], RootChanges]:
    """The plan that makes the whole tree where nothing is."""
    _, _, target = changed_parts(objects, tree.tree, tree.mode, lambda rel: None)
    return plan_root(root, {}, -1, set(), target, objects, lambda rel: False, only)


def _scoped(info: CheckpointInfo, scope: Scope | None) -> CheckpointInfo:
    """`info` with only the folders `scope` names (all without one)."""
    if scope is None or scope.roots is None:
        return info
    return attrs.evolve(info, roots=tuple(r for r in info.roots if r.path in scope.roots))


def _only(scope: Scope | None, marks: Mapping[Path, Marks], root: Path) -> Only | None:
    if scope is None:
        return None
    return Only(marks.get(root, Marks()), scope.conflicts == "restore")


def _exists(fds: Folders, rel: str) -> bool:
    up, name = parent_of(rel)
    try:
        os.stat(name, dir_fd=fds.get(up), follow_symlinks=False)
    except OSError:
        return False
    return True


@asynccontextmanager
async def open_checkpoints(
    settings: Settings,
    *,
    folder: Path | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    watch: bool = True,
) -> AsyncIterator[CheckpointEngine]:
    """The engine on ``DATA/checkpoints`` (or `folder`), restores left half done by a
    killed process completed first; its inotify watches closed on the way out."""
    engine = CheckpointEngine(settings, folder=folder, clock=clock, wall=wall, watch=watch)
    await engine.recover()
    try:
        yield engine
    finally:
        engine.close()
