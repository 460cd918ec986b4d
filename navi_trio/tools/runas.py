"""Who a tool's processes run as: never root.

A daemon running as root would give every command root's rights over the host, whatever
the sandbox hides. So when our uid is 0, every tool process drops to ``NAVI_TOOL_USER``
(a name, or uid[:gid]), else ``nobody``, before it starts; root is refused as a setting.
A user namespace mapping alone is not enough: outside it the id the kernel checks the
host's files against stays 0.

A run's session folder belongs to that user, so its commands can write there; what the
daemon itself makes in a root takes the folder's owner (`inherit`).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from navi_trio.errors import ConfigError

NOBODY = 65534
SETTING = "NAVI_TOOL_USER"


@attrs.frozen
class RunAs:
    """An unprivileged account: its ids, its name (for USER and LOGNAME) and home."""

    uid: int
    gid: int
    name: str
    home: str = "/"

    def popen(self) -> dict[str, Any]:
        """What `subprocess.Popen` (and `trio.lowlevel.open_process`) take to start a
        process as this user, with no supplementary groups."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def env(self) -> dict[str, str]:
        return {"USER": self.name, "LOGNAME": self.name}


# Run as `python -I -c DROP UID GID -- COMMAND ARGS...`: what is not started through
# Popen's `user` (inside bwrap, an MCP server the MCP SDK starts) drops through this.
# Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec, so
# they are given back their defaults (``yes | head`` must end quietly).
DROP = (
    "import os, signal, sys; signal.signal(signal.SIGPIPE, signal.SIG_DFL); "
    "signal.signal(signal.SIGXFSZ, signal.SIG_DFL); os.setgroups([]); "
    "os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[1])); "
    "os.execvp(sys.argv[4], sys.argv[4:])"
)


def drop_argv(user: RunAs) -> list[str]:
    """The arguments of ``sys.executable`` that start the command after them as `user`."""
    return ["-I", "-c", DROP, str(user.uid), str(user.gid), "--"]


def parse(setting: str) -> RunAs:
    """The account `setting` names (``name``, ``uid`` or ``uid:gid``); `ConfigError`
    when it names nobody on this machine, or root."""
    text = setting.strip()
    uid_text, _, gid_text = text.partition(":")
    try:
        entry: pwd.struct_passwd | None
        if uid_text.isdigit():
            uid = int(uid_text)
            try:
                entry = pwd.getpwuid(uid)
            except KeyError:
                entry = None
            gid = int(gid_text) if gid_text else (entry.pw_gid if entry else uid)
        else:
            entry = pwd.getpwnam(uid_text)
            uid = entry.pw_uid
            gid = int(gid_text) if gid_text else entry.pw_gid
    except (KeyError, ValueError):
        raise ConfigError(
            f"{SETTING}={setting!r}: no such user here (a user name, or uid[:gid])"
        ) from None
    if uid == 0 or gid == 0:
        raise ConfigError(f"{SETTING}={setting!r}: tool processes never run as root")
    return _account(uid, gid, entry)


def _account(uid: int, gid: int, entry: pwd.struct_passwd | None) -> RunAs:
    if entry is None:
        return RunAs(uid, gid, str(uid))
    return RunAs(uid, gid, entry.pw_name, entry.pw_dir or "/")


def _nobody() -> RunAs:
    try:
        entry: pwd.struct_passwd | None = pwd.getpwuid(NOBODY)
    except KeyError:
        entry = None
    return _account(NOBODY, NOBODY, entry) if entry else RunAs(NOBODY, NOBODY, "nobody")


def run_as(setting: str) -> RunAs | None:
    """Whom a tool process runs as: None (as the daemon) unless the daemon is root;
    then the account `setting` (NAVI_TOOL_USER) names, else nobody. `ConfigError` for a
    setting that names no one here, or root."""
    if os.geteuid() != 0:
        return None
    return parse(setting) if setting.strip() else _nobody()


def session_owner(setting: str) -> tuple[int, int] | None:
    """(uid, gid) of whom a run's session folder belongs to: whom its commands run as
    (None: the daemon is not root, the folders stay its own)."""
    who = run_as(setting)
    return None if who is None else (who.uid, who.gid)


def may(st: os.stat_result, want: int, who: RunAs) -> bool:
    """Whether `who` has the `want` bits (``os.R_OK`` ...) on what `st` describes, by
    its owner, group and other bits (no ACLs; no supplementary groups, as tool
    processes have none): what the daemon, as root, checks for them."""
    if st.st_uid == who.uid:
        bits = st.st_mode >> 6
    elif st.st_gid == who.gid:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & want == want


def closed_to(
    program: str, who: RunAs, shown: Sequence[str] = (), *, run: bool = True
) -> str | None:
    """Why `who` cannot start the program at the path `program` (and what its links lead
    to, as the kernel follows them), or None when it can: the first folder on the way
    it may not pass, or (`run`) the program it may not execute (`may`). The way to a
    folder of `shown` (one the sandbox binds, and makes a way to) is not checked."""
    real = Path(os.path.realpath(program))
    for path in dict.fromkeys((Path(os.path.abspath(program)), real)):
        top = max((Path(s) for s in shown if path.is_relative_to(s)), key=_depth, default=None)
        for folder in reversed(path.parents):
            if top is None or folder.is_relative_to(top):
                why = _lacks(folder, os.X_OK, who, "closed to it")
                if why is not None:
                    return why
    return _lacks(real, os.X_OK, who, "not executable by it") if run else None


def _depth(path: Path) -> int:
    return len(path.parts)


def _lacks(path: Path, want: int, who: RunAs, said: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None  # nothing there: the start itself says so
    if may(st, want, who):
        return None
    return f"{path} is {said} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid})"


def may_remove(folder: os.stat_result, st: os.stat_result, who: RunAs) -> bool:
    """Whether `who` may remove (or rename over) the entry `st` of the folder `folder`:
    write and search there, and with the sticky bit own the entry or the folder."""
    if not may(folder, os.W_OK | os.X_OK, who):
        return False
    return not folder.st_mode & stat.S_ISVTX or who.uid in (folder.st_uid, st.st_uid)


def may_chmod(st: os.stat_result, who: RunAs) -> bool:
    """Whether `who` may change the mode of what `st` describes: only its owner may."""
    return st.st_uid == who.uid


def denied() -> PermissionError:
    """The error the kernel would give the tool user."""
    return PermissionError(errno.EACCES, os.strerror(errno.EACCES))


def inherit(fd: int, folder_fd: int) -> None:
    """When the daemon is root: the new file or folder open at `fd` takes the owner of
    the folder it was made in (`folder_fd`), so that the commands working there (which
    never run as root) may change it."""
    if os.geteuid() != 0:
        return
    up = os.fstat(folder_fd)
    give(fd, (up.st_uid, up.st_gid))


def give(fd: int, owner: tuple[int, int] | None) -> None:
    """When the daemon is root: what is open at `fd` given to `owner` (uid, gid), when
    it is not theirs yet (None: left as it is)."""
    if owner is None or os.geteuid() != 0:
        return
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != owner:
        os.chown(f"/proc/self/fd/{fd}", *owner, follow_symlinks=True)
