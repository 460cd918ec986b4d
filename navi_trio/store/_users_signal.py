"""The users marker: how a change of the users table reaches a daemon on the same SQLite file.

    signal_users_changed(users_marker(db_path))                   # a writer, once committed
    await nursery.start(watch_users_marker, marker, changed)      # the daemon

Why a file beside the database: `navi users` changes the users table from a process of
its own, often with no daemon running, never with the daemon's address or an admin
token, but always with the database's path. SQLite tells another connection nothing
(``PRAGMA data_version`` moves, but only a poll would see it), and a watch on the
database or its WAL would wake on every write of the daemon itself. So the writer, once
its transaction is committed, rewrites ``<database>-users``; the daemon watches the
folder with inotify (through ctypes: no thread and no poll, trio waits on the inotify
descriptor) and `changed()` is called when that name is written. Where inotify is
missing (not Linux) the daemon looks at the marker every `POLL_SEC` instead.

The marker says only "look again": what changed is read from the users table. A writer
killed between its commit and the rewrite leaves the change to be seen at the next one.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

import trio

log = logging.getLogger(__name__)

POLL_SEC = 1.0  # without inotify: how often the marker is looked at
_IN_CLOSE_WRITE, _IN_MOVED_TO = 0x8, 0x80
_IN_Q_OVERFLOW, _IN_IGNORED = 0x4000, 0x8000
# A rewrite is closed once written (one event per change); a marker renamed into place
# counts too.
_MASK = _IN_CLOSE_WRITE | _IN_MOVED_TO
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
_READ_MAX = 64 * 1024


def users_marker(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + "-users")


def signal_users_changed(marker: Path) -> None:
    """Rewrite the marker (a committed change of the users table); never raises."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, f"{time.time_ns()}\n".encode())
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning(
            "the users changed, but %s could not be written (%s): a daemon on this database "
            "closes the connections of a revoked token at the next change",
            marker,
            exc,
        )


async def watch_users_marker(
    marker: Path,
    changed: Callable[[], None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Call `changed()` each time the marker is written, until cancelled (see the module).
    Started once the watch is in place: a change after that is never missed."""
    fd = _inotify(marker.parent)
    if fd is None:
        log.warning(
            "no inotify here: the users marker %s is looked at every %g s", marker, POLL_SEC
        )
        await _poll(marker, changed, task_status)
        return
    try:
        task_status.started()
        while True:
            await trio.lowlevel.wait_readable(fd)
            try:
                data = os.read(fd, _READ_MAX)
            except BlockingIOError:
                continue
            names, lost = _names(data)
            if lost:  # the folder went away: the watch with it
                log.warning(
                    "the folder of %s is gone: its marker is looked at every %g s", marker, POLL_SEC
                )
                break
            if marker.name in names or "*" in names:
                changed()
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)
    await _poll(marker, changed, trio.TASK_STATUS_IGNORED)


def _inotify(folder: Path) -> int | None:
    """An inotify descriptor watching `folder` (non-blocking), or None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init = libc.inotify_init1
        add = libc.inotify_add_watch
    except (OSError, AttributeError):
        return None
    add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
    fd = int(init(os.O_NONBLOCK | os.O_CLOEXEC))
    if fd < 0:
        return None
    if int(add(fd, os.fsencode(folder), _MASK)) < 0:
        log.warning("inotify cannot watch %s: %s", folder, os.strerror(ctypes.get_errno()))
        os.close(fd)
        return None
    return fd


def _names(data: bytes) -> tuple[set[str], bool]:
    """The file names in a read of inotify events, and whether the watch was lost. An
    overflow (events were dropped, the marker's maybe) is the name "*"."""
    names: set[str] = set()
    offset = 0
    while offset + _EVENT.size <= len(data):
        _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        offset += _EVENT.size
        raw = data[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        if mask & _IN_IGNORED:
            return names, True
        names.add("*" if mask & _IN_Q_OVERFLOW else os.fsdecode(raw))
    return names, False


def _stamp(marker: Path) -> tuple[int, int, int] | None:
    try:
        st = marker.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


async def _poll(
    marker: Path, changed: Callable[[], None], task_status: trio.TaskStatus[None]
) -> None:
    last = _stamp(marker)
    task_status.started()
    while True:
        await trio.sleep(POLL_SEC)
        now = _stamp(marker)
        if now != last:
            last = now
            changed()
