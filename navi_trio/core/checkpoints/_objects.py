"""The content-addressed objects: file contents and folder listings, by SHA-256.

``objects/ab/cdef…`` holds the bytes whose digest is ``abcdef…``: a file's content as it
was, or a folder's listing (JSON, one row per entry). Every object is written to
``tmp/`` and renamed into place, so a reader sees it whole or not at all;
`ObjectStore.clean_tmp` removes what a killed writer left. Nothing is fsynced: the
guarantee is against the daemon dying, not the machine losing power (a restore then
fails with `CheckpointDamagedError`, naming what is missing).

Namespaces: an object stored once for everyone would let ``new_bytes`` confirm a guess
of another user's file. So each user's objects have their own addresses: the store seen
`within(tag)` addresses ``sha256(prefix(tag) + content)`` and names it ``tag:digest`` (a
ref); nothing is shared across users. A ref without a tag is a plain SHA-256
(checkpoints taken before namespaces).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import fcntl
import hashlib
import json
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from navi_trio.core.checkpoints._fsops import write_all
from navi_trio.core.checkpoints._model import CheckpointDamagedError, FileTooLargeError
from navi_trio.core.checkpoints._packs import PACKED_MAX, Packs, PackWriter

CHUNK = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_SMALL = 1 << 20  # files up to this are read whole, hashed, then written only if new


@attrs.frozen
class Row:
    """One entry of a folder listing.

    `kind`: ``f`` file, ``l`` symlink, ``d`` folder, ``x`` left out (too large, a pipe,
    unreadable: a restore leaves that path as it finds it). `ref`: the content's digest
    (``f``), the link's text (``l``), the folder's listing digest (``d``), why it was
    left out (``x``). `mode`: the permission bits (``st_mode & 0o7777``; 0 for a link).
    """

    name: str
    kind: str
    mode: int
    ref: str
    size: int


def tree_bytes(rows: list[Row]) -> bytes:
    """A folder listing's canonical bytes (rows sorted by name)."""
    body = [[r.name, r.kind, r.mode, r.ref, r.size] for r in sorted(rows, key=lambda r: r.name)]
    return json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode()


def namespace_tag(name: str) -> str:
    """The tag of a namespace (a user id): 16 hex digits, no ":"."""
    raw = b"navi checkpoint namespace\0" + name.encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()[:16]


def prefix_of(tag: str | None) -> bytes:
    """What is hashed before an object's content in the namespace `tag`."""
    return b"" if tag is None else f"navi-ns {tag}\n".encode()


def split_ref(ref: str) -> tuple[str | None, str]:
    """(the namespace tag or None, the digest: the object's name in the store)."""
    tag, sep, digest = ref.rpartition(":")
    return (tag if sep else None), digest


def ref_tag(ref: str) -> str | None:
    return split_ref(ref)[0]


def key_of(ref: str) -> str:
    return split_ref(ref)[1]


class ObjectStore:
    """The objects under `folder` (``DATA/checkpoints``).

    Its folders are held open (``tmp/`` and each ``objects/ab/``) and every object is
    written, renamed and looked up by name relative to them: with 10,000 small files
    the first snapshot is mostly these calls, and resolving whole paths (and building
    `Path` objects) for each doubled its time.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.objects = folder / "objects"
        self.tmp = folder / "tmp"
        self._fds: dict[str, int] = {}  # "tmp", "objects" and each two-digit prefix
        self._opening = threading.Lock()
        self.packs = Packs(folder / "packs", self.tmp)
        self._gc_seen: int | None = None
        self.tag: str | None = None  # the namespace new objects are addressed in

    def within(self, tag: str | None) -> ObjectStore:
        """This store, addressing what it stores and hashes in the namespace `tag` (its
        folders, packs and locks shared)."""
        view = copy.copy(self)
        view.tag = tag
        return view

    def _hasher(self) -> hashlib._Hash:
        return hashlib.sha256(prefix_of(self.tag))

    def _ref(self, digest: str) -> str:
        return digest if self.tag is None else f"{self.tag}:{digest}"

    def prepare(self) -> None:
        self.objects.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.packs.prepare()

    def sync(self, gc_number: int) -> None:
        """Reload the packs' index when garbage was collected since it was read."""
        if gc_number != self._gc_seen:
            self.packs.reload()
            self._gc_seen = gc_number

    def writer(self) -> PackWriter:
        return PackWriter(self.packs)

    def close(self) -> None:
        with self._opening:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def _dir(self, key: str, *, create: bool = True) -> int | None:
        fd = self._fds.get(key)
        if fd is not None:
            return fd
        with self._opening:
            fd = self._fds.get(key)
            if fd is not None:
                return fd
            if key in ("tmp", "objects"):
                path = self.tmp if key == "tmp" else self.objects
                fd = os.open(path, _DIR)
            else:
                top = self._fds.get("objects")
                if top is None:
                    top = os.open(self.objects, _DIR)
                    self._fds["objects"] = top
                try:
                    fd = os.open(key, _DIR, dir_fd=top)
                except FileNotFoundError:
                    if not create:
                        return None
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(key, 0o700, dir_fd=top)
                    fd = os.open(key, _DIR, dir_fd=top)
            self._fds[key] = fd
            return fd

    def path(self, ref: str) -> Path:
        digest = key_of(ref)
        return self.objects / digest[:2] / digest[2:]

    def has(self, ref: str) -> bool:
        digest = key_of(ref)
        if self.packs.find(digest, refresh=True) is not None:
            return True
        return self._loose(digest)

    def _loose(self, digest: str) -> bool:
        folder = self._dir(digest[:2], create=False)
        if folder is None:
            return False
        try:
            os.stat(digest[2:], dir_fd=folder)
        except FileNotFoundError:
            return False
        return True

    def _tmp_fd(self) -> tuple[int, str]:
        name = secrets.token_hex(8)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        return os.open(name, flags, 0o600, dir_fd=self._dir("tmp")), name

    def _publish(self, tmp: str, digest: str) -> None:
        os.rename(tmp, digest[2:], src_dir_fd=self._dir("tmp"), dst_dir_fd=self._dir(digest[:2]))

    def _drop_tmp(self, tmp: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=self._dir("tmp"))

    def put_bytes(self, data: bytes, writer: PackWriter | None = None) -> tuple[str, int]:
        """Store `data` (packed by `writer` when small); (its ref, bytes newly written: 0
        when it was there)."""
        digest = self._digest(data)
        return self._ref(digest), self._put_known(digest, data, writer)

    def _digest(self, data: bytes) -> str:
        sha = self._hasher()
        sha.update(data)
        return str(sha.hexdigest())

    def _put_known(self, digest: str, data: bytes, writer: PackWriter | None) -> int:
        if writer is not None and len(data) <= PACKED_MAX:
            return writer.add(digest, data)
        if self._loose(digest):
            return 0
        fd, tmp = self._tmp_fd()
        try:
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
            self._publish(tmp, digest)
        except BaseException:
            self._drop_tmp(tmp)
            raise
        return len(data)

    def put_file(
        self,
        fd: int,
        limit: int,
        check: Callable[[], None],
        *,
        store: bool = True,
        writer: PackWriter | None = None,
    ) -> tuple[str, int, int]:
        """Store the content of the open file `fd`: (ref, bytes newly written, size).

        More than `limit` bytes: `FileTooLargeError` (the file grew after it was
        measured). `check()` runs between chunks (deadline, cancel). Without `store`
        the content is only hashed (a preview of a folder over its bounds).
        """
        sha = self._hasher()
        chunks: list[bytes] = []
        total = 0
        out: int | None = None
        tmp: str | None = None
        try:
            while chunk := os.read(fd, CHUNK):
                total += len(chunk)
                if total > limit:
                    raise FileTooLargeError(total)
                check()
                sha.update(chunk)
                if not store:
                    continue
                if out is None and total <= _SMALL:
                    chunks.append(chunk)
                    continue
                if out is None:  # a large file: stream it to a temp file
                    out, tmp = self._tmp_fd()
                    for held in chunks:
                        write_all(out, held)
                    chunks = []
                write_all(out, chunk)
            digest = str(sha.hexdigest())
            ref = self._ref(digest)
            if not store:
                return ref, 0, total
            if out is None:
                return ref, self._put_known(digest, b"".join(chunks), writer), total
            os.close(out)
            out = None
            assert tmp is not None
            if self._loose(digest):
                self._drop_tmp(tmp)
                tmp = None
                return ref, 0, total
            self._publish(tmp, digest)
            tmp = None
            return ref, total, total
        finally:
            if out is not None:
                os.close(out)
            if tmp is not None:
                self._drop_tmp(tmp)

    def put_tree(
        self, rows: list[Row], *, store: bool = True, writer: PackWriter | None = None
    ) -> tuple[str, int]:
        data = tree_bytes(rows)
        if not store:
            return self._ref(self._digest(data)), 0
        return self.put_bytes(data, writer)

    def read(self, ref: str) -> bytes:
        """The object `ref`, whole (`CheckpointDamagedError` when missing)."""
        tag, digest = split_ref(ref)
        packed = self.packs.read(digest, prefix_of(tag))
        if packed is not None:
            return packed
        fd = self._open_loose(digest)
        try:
            return _read_all(fd)
        finally:
            os.close(fd)

    def read_at_most(self, ref: str, limit: int) -> bytes | None:
        """The object `ref` when it is at most `limit` bytes, else None (not read)."""
        tag, digest = split_ref(ref)
        packed = self.packs.read(digest, prefix_of(tag))
        if packed is not None:
            return packed if len(packed) <= limit else None
        fd = self._open_loose(digest)
        try:
            if os.fstat(fd).st_size > limit:
                return None
            return _read_all(fd)
        finally:
            os.close(fd)

    def copy_into(self, ref: str, dst: int) -> None:
        """Write the object `ref` to the open file `dst`."""
        tag, digest = split_ref(ref)
        packed = self.packs.read(digest, prefix_of(tag))
        if packed is not None:
            write_all(dst, packed)
            return
        fd = self._open_loose(digest)
        try:
            while chunk := os.read(fd, CHUNK):
                write_all(dst, chunk)
        finally:
            os.close(fd)

    def _open_loose(self, digest: str) -> int:
        folder = self._dir(digest[:2], create=False) if len(digest) > 2 else None
        try:
            if folder is None:
                raise FileNotFoundError(digest)
            return os.open(digest[2:], os.O_RDONLY | os.O_CLOEXEC, dir_fd=folder)
        except FileNotFoundError:
            raise CheckpointDamagedError(f"the stored copy {digest[:12]} is missing") from None

    def tree(self, ref: str) -> list[Row]:
        raw = self.read(ref)
        try:
            return [
                Row(str(n), str(k), int(m), str(r), int(s)) for n, k, m, r, s in json.loads(raw)
            ]
        except (ValueError, TypeError) as exc:
            name = key_of(ref)[:12]
            raise CheckpointDamagedError(f"the folder listing {name} is damaged") from exc

    def digests(self) -> Iterator[tuple[str, Path]]:
        """Every loose object: (digest, path)."""
        try:
            folders = list(os.scandir(self.objects))
        except FileNotFoundError:
            return
        for folder in folders:
            if len(folder.name) != 2 or not folder.is_dir(follow_symlinks=False):
                continue
            with os.scandir(folder.path) as it:
                for entry in it:
                    yield folder.name + entry.name, Path(entry.path)

    def count(self) -> int:
        """How many objects are stored (loose and packed)."""
        return sum(1 for _ in self.digests()) + self.packs.count()

    def clean_tmp(self) -> int:
        """Remove what killed writers left in ``tmp/``; how many files."""
        removed = 0
        try:
            entries = list(os.scandir(self.tmp))
        except FileNotFoundError:
            return 0
        for entry in entries:
            _unlink_quietly(Path(entry.path))
            removed += 1
        return removed


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def write_atomic(path: Path, data: bytes, *, sync: bool = False) -> None:
    """Write `path` whole or not at all (a temp file next to it, renamed over it)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if sync:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class FileLock:
    """An flock on `path` (shared or exclusive), held from `acquire` to `release`.

    flock locks an open file description, so two of these in one process exclude each
    other as two processes would; the kernel drops the lock of a killed holder.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, *, exclusive: bool, wait: bool = True) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the description drops the lock
            self._fd = None
