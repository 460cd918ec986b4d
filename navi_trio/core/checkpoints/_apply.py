"""Applying a restore so that a crash leaves the roots before or after it, never between.

A root cannot be swapped whole (other programs hold it open, it may be a mount point),
so a restore is a **journal rolled forward**: the whole plan (every digest it needs
checked present) is written to ``journal/ID.json`` and fsynced under an flock, with the
owner it restores for; the operations run in order, each by fd and idempotent (a file
or a folder is made under a temp name in its folder and renamed to its path, so it
appears whole and with its owner); the journal is removed. Killed in between, the next
`CheckpointEngine` to open runs the journal again from the start (`recover`), which
completes it; the flock keeps a recovery away from a restore still running in another
process.

When the daemon runs as root, a restore acts with the tool user's rights too (`who`):
it passes, makes, replaces or removes an entry only where that user may (the sticky bit
honoured) and changes a mode only of what that user owns; any other path is reported as
not restored. What it makes takes the owner of the folder it is made in, and set-user-ID
and set-group-ID bits are never restored: a root daemon would otherwise write, in a
user's folder, what that user could not.

An operation that fails for a reason that stays (a read-only folder, a full disk) is
reported with its path and the rest goes on; the journal is then removed, since running
it again would fail the same way (the preview's undo checkpoint brings back the state
before).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from navi_trio.core.checkpoints._fsops import (
    DIR,
    Folders,
    chmod_at,
    make_folder,
    make_root,
    open_root,
    parent_of,
)
from navi_trio.core.checkpoints._model import Kept
from navi_trio.core.checkpoints._objects import FileLock, ObjectStore, write_atomic
from navi_trio.core.checkpoints._plan import Op
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs, denied, give, inherit, may, may_chmod, may_remove

# O_NONBLOCK: a FIFO planted at the temp name fails (ENXIO) instead of hanging.
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_NO_PRIVATE = PrivatePaths(hidden=())
# A file comes back with its bits but never set-user-ID or set-group-ID: a restore
# writes as the daemon, and a program of the user's made setuid to the daemon's
# account (root's, in a container) would hand that account to whoever runs it.
FILE_BITS = 0o7777 & ~(stat.S_ISUID | stat.S_ISGID)


def new_id() -> str:
    return secrets.token_hex(8)


def needed(ops: list[Op]) -> set[str]:
    return {op[2] for op in ops if op[0] == "put"}


class Journal:
    """The journals of restores under ``DATA/checkpoints/journal``; `who`: whose rights
    a restore has besides the daemon's (the tool user of a root daemon, else None)."""

    def __init__(self, folder: Path, who: RunAs | None = None) -> None:
        self.folder = folder
        self.who = who

    def prepare(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def pending(self) -> list[str]:
        try:
            return sorted(p.stem for p in self.folder.glob("*.json"))
        except FileNotFoundError:
            return []

    def clean_stale(self) -> int:
        """With no restore anywhere (the store's lock held exclusive): remove what killed
        restores left besides their journals, the temp file of a journal being written
        and the lock of a restore that died before its journal was written (or after it
        was removed); how many files."""
        try:
            entries = list(os.scandir(self.folder))
        except FileNotFoundError:
            return 0
        removed = 0
        for entry in entries:
            name = entry.name
            stale_tmp = name.startswith(".") and name.endswith(".tmp")
            stale_lock = name.endswith(".lock") and not os.path.exists(
                self.folder / f"{name.removesuffix('.lock')}.json"
            )
            if stale_tmp or stale_lock:
                Path(entry.path).unlink(missing_ok=True)
                removed += 1
        return removed

    def read(self, jid: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.folder / f"{jid}.json").read_bytes())
        except FileNotFoundError:
            return None
        return data if isinstance(data, dict) else None

    def digests(self) -> set[str]:
        """Every digest a pending journal needs (kept by garbage collection)."""
        out: set[str] = set()
        for jid in self.pending():
            data = self.read(jid) or {}
            for root in data.get("roots", []):
                out |= needed(root["ops"])
        return out

    def run(
        self,
        objects: ObjectStore,
        roots: list[tuple[Path, list[Op]]],
        checkpoint: str,
        private: PrivatePaths,
        held: Mapping[Path, Root],
        *,
        owner: str = "",
        after: str = "",
    ) -> list[Kept]:
        """Journal and apply `roots`' operations (through the `held` roots where there
        are: the folders the plan was made on) for `owner` (`after`: its checkpoint
        the changes come after); the paths that failed."""
        jid = new_id()
        lock = FileLock(self.folder / f"{jid}.lock")
        lock.acquire(exclusive=True)
        try:
            body = {
                "v": 1,
                "id": jid,
                "checkpoint": checkpoint,
                "owner": owner,
                "after": after,
                "roots": [{"path": str(r), "ops": ops} for r, ops in roots],
            }
            write_atomic(self.folder / f"{jid}.json", json.dumps(body).encode(), sync=True)
            failed = _apply_all(objects, jid, roots, private, held, recovering=False, who=self.who)
            self._finish(jid)
            return failed
        finally:
            lock.release()

    def recover(
        self, objects: ObjectStore, completed: Callable[[dict[str, Any]], None] | None = None
    ) -> list[tuple[str, list[Kept]]]:
        """Complete every restore a dead process left half done: (journal, failures);
        `completed(journal)` hears each one."""
        done = []
        for jid in self.pending():
            lock = FileLock(self.folder / f"{jid}.lock")
            if not lock.acquire(exclusive=True, wait=False):
                continue  # a live restore, in another process
            try:
                data = self.read(jid)
                if data is None:
                    continue
                roots = [(Path(r["path"]), list(r["ops"])) for r in data["roots"]]
                # The plan was checked against navi's data when it was made.
                failed = _apply_all(
                    objects, jid, roots, _NO_PRIVATE, {}, recovering=True, who=self.who
                )
                if completed is not None:
                    completed(data)
                self._finish(jid)
                done.append((jid, failed))
            finally:
                lock.release()
        return done

    def _finish(self, jid: str) -> None:
        (self.folder / f"{jid}.json").unlink(missing_ok=True)
        (self.folder / f"{jid}.lock").unlink(missing_ok=True)


def _apply_all(
    objects: ObjectStore,
    jid: str,
    roots: list[tuple[Path, list[Op]]],
    private: PrivatePaths,
    held: Mapping[Path, Root],
    *,
    recovering: bool,
    who: RunAs | None,
) -> list[Kept]:
    failed: list[Kept] = []
    for root, ops in roots:
        try:
            if root not in held:
                # A root that was gone is made again, walked like any other (no symlink).
                make_root(root, who)
            root_fd = open_root(held.get(root, root), private)
        except Exception as exc:  # noqa: BLE001 - reported with the root's name
            failed.append(Kept(str(root), _why(exc) if isinstance(exc, OSError) else str(exc)))
            continue
        try:
            failed += apply_ops(
                objects, root_fd, ops, jid, recovering=recovering, root=root, who=who
            )
        finally:
            os.close(root_fd)
    return failed


def apply_ops(
    objects: ObjectStore,
    root_fd: int,
    ops: list[Op],
    jid: str,
    *,
    recovering: bool,
    root: Path,
    who: RunAs | None = None,
) -> list[Kept]:
    """Run `ops` below the open root `root_fd` (with `who`'s rights too, when given);
    the paths that failed, with why."""
    fds = Folders(root_fd, who)
    failed: list[Kept] = []
    try:
        for index, op in enumerate(ops):
            try:
                _one(objects, fds, root_fd, op, f".navi-restore-{jid}-{index}", recovering)
            except OSError as exc:
                failed.append(Kept(str(root / op[1]) if op[1] else str(root), _why(exc)))
    finally:
        fds.close()
    return failed


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _one(
    objects: ObjectStore, fds: Folders, root_fd: int, op: Op, tmp: str, recovering: bool
) -> None:
    kind, rel = op[0], op[1]
    if kind in ("rm", "rmdir") and rel and _folder_gone(fds, rel):
        return  # what held it is gone, and so is it (a replay after an earlier rmdir)
    check_op(fds, op, recovering=recovering)
    if kind in ("unlock", "dirmode") and rel == "":
        os.fchmod(root_fd, op[2])
        return
    up, name = parent_of(rel)
    folder = fds.get(up)
    if kind in ("unlock", "dirmode"):
        chmod_at(folder, name, op[2])
    elif kind == "chmod":
        chmod_at(folder, name, op[2] & FILE_BITS)
    elif kind == "rm":
        try:
            os.unlink(name, dir_fd=folder)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            if not recovering:  # a folder now: it changed after the plan
                raise
    elif kind == "rmdir":
        fds.forget(rel)
        # gone, or already replaced by what the checkpoint has there
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.rmdir(name, dir_fd=folder)
    elif kind == "mkdir":
        make_folder(folder, name, tmp)
    elif kind == "put":
        dst = os.open(tmp, _WRITE, 0o600, dir_fd=folder)
        try:
            objects.copy_into(op[2], dst)
            os.fchmod(dst, op[3] & FILE_BITS)
            inherit(dst, folder)
        finally:
            os.close(dst)
        _rename_into(folder, tmp, name)
    elif kind == "link":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)
        os.symlink(op[2], tmp, dir_fd=folder)
        if os.geteuid() == 0:  # the link itself, never what it points to
            owner = os.fstat(folder)
            os.chown(tmp, owner.st_uid, owner.st_gid, dir_fd=folder, follow_symlinks=False)
        _rename_into(folder, tmp, name)
    else:
        raise OSError(errno.EINVAL, f"unknown restore step {kind!r}")


def _folder_gone(fds: Folders, rel: str) -> bool:
    """Whether the folder that holds `rel` is gone (only that: a folder `who` may not
    pass, or one that is a file or a symlink now, still fails the step)."""
    try:
        fds.get(parent_of(rel)[0])
    except FileNotFoundError:
        return True
    return False


def check_op(fds: Folders, op: Op, *, recovering: bool = False) -> None:
    """PermissionError unless `fds.who` (None: no check) may do `op`, as the kernel
    would judge a process of theirs: a mode only on what they own; making, replacing or
    removing an entry with write and search in its folder (and with the folder's sticky
    bit, on an entry or in a folder of theirs). What is gone already needs nothing. A
    folder unlocked as its owner or made by the restore is theirs to change whole
    (`Folders.free`): the check runs before each step, and also alone (`refused`). A
    replay (`recovering`) counts a folder it finds where it makes one, with the owner a
    made one takes, as made by its first attempt."""
    who, kind, rel = fds.who, op[0], op[1]
    if who is None:
        return
    modes = kind in ("unlock", "dirmode", "chmod")
    up, name = parent_of(rel)
    if rel in fds.free or (not modes and not fds.checked(up)):
        if kind == "mkdir":
            fds.free.add(rel)
        return
    st: os.stat_result | None
    if rel == "":
        st = os.fstat(fds.get(""))
    else:
        try:
            st = os.stat(name, dir_fd=fds.get(up), follow_symlinks=False)
        except FileNotFoundError:
            st = None
    if modes:
        if st is not None and not may_chmod(st, who):
            raise denied()
        if kind == "unlock":
            fds.free.add(rel)  # theirs: what they unlock they may change
        return
    if st is None and kind in ("rm", "rmdir"):
        return
    folder = os.fstat(fds.get(up))
    if st is not None and kind == "mkdir" and stat.S_ISDIR(st.st_mode):
        made = (st.st_uid, st.st_gid) == (folder.st_uid, folder.st_gid)
        if recovering and made and may(folder, os.W_OK | os.X_OK, who):
            fds.free.add(rel)  # as the first attempt had it
        return  # there already: nothing to make
    if not (may(folder, os.W_OK | os.X_OK, who) if st is None else may_remove(folder, st, who)):
        raise denied()
    if kind == "mkdir":
        fds.free.add(rel)


def refused(root_fd: int, ops: list[Op], who: RunAs | None) -> list[str]:
    """The paths of `ops` below the open root `root_fd` that `who` may not change (what
    a preview shows: the restore refuses them); what is gone or changed meanwhile is
    for the restore to report."""
    if who is None:
        return []
    fds = Folders(root_fd, who)
    out: list[str] = []
    try:
        for op in ops:
            try:
                check_op(fds, op)
            except PermissionError:
                out.append(op[1])
            except OSError:
                pass
    finally:
        fds.close()
    return out


def _rename_into(folder: int, tmp: str, name: str) -> None:
    try:
        os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise


@attrs.frozen
class Exported:
    """A folder an export made: the paths it could not write (`failed`) and the made
    folder's identity (device, inode), to know it again (`remove_beneath`)."""

    failed: list[Kept]
    ident: tuple[int, int]


def export_root(
    objects: ObjectStore,
    ops: list[Op],
    parent: Root,
    name: str,
    owner: tuple[int, int] | None = None,
    who: RunAs | None = None,
) -> Exported:
    """Build a tree into the new folder `name` of the held folder `parent` as a staged
    swap: the folder is claimed (made empty, FileExistsError when it exists), everything
    is made in a temp folder beside it, which is then renamed over it: the new folder is
    empty or complete. All of it happens beneath `parent`'s fd, verified first (moved or
    swapped since it was checked: RootChangedError naming it), so a parent swapped for a
    link meanwhile leads nowhere. A root daemon gives all of it to `owner` (uid, gid),
    else to `parent`'s owner: the commands that work there never run as root. With
    `who`, only where that user may make a folder (PermissionError)."""
    parent.verify()
    if who is not None and not may(os.fstat(parent.fd), os.W_OK | os.X_OK, who):
        raise denied()
    os.mkdir(name, 0o700, dir_fd=parent.fd)
    stage = f".{name}.navi-export-{new_id()}"
    try:
        os.mkdir(stage, 0o700, dir_fd=parent.fd)
        fd = os.open(stage, DIR, dir_fd=parent.fd)
        try:
            # What is made in it takes its owner (`inherit`).
            if owner is None:
                inherit(fd, parent.fd)
            else:
                give(fd, owner)
            st = os.fstat(fd)
            failed = apply_ops(
                objects, fd, ops, new_id(), recovering=False, root=parent.path / name
            )
        finally:
            os.close(fd)
        # Over the empty folder claimed above, in one step.
        os.rename(stage, name, src_dir_fd=parent.fd, dst_dir_fd=parent.fd)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True, dir_fd=parent.fd)
        os.rmdir(name, dir_fd=parent.fd)
        raise
    return Exported(failed, (st.st_dev, st.st_ino))


def remove_beneath(parent: Root, name: str, ident: tuple[int, int]) -> bool:
    """Remove the folder `name` of the held folder `parent`, when it is still the folder
    `ident` (device, inode) names, with all it holds: walked by fd from `parent`, never
    following a link, wherever `parent` was moved meanwhile. False when it is not there
    or is something else now (left alone)."""
    try:
        fd = os.open(name, DIR, dir_fd=parent.fd)
    except OSError:
        return False  # gone, a link now, or no folder
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != ident:
            return False
        for entry in os.listdir(fd):
            if stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                shutil.rmtree(entry, ignore_errors=True, dir_fd=fd)
            else:
                os.unlink(entry, dir_fd=fd)
    except OSError:
        return False
    finally:
        os.close(fd)
    try:
        # By name: only an empty folder goes, so a swap now removes nothing of another's.
        os.rmdir(name, dir_fd=parent.fd)
    except OSError:
        return False
    return True
