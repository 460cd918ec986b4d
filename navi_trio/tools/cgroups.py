"""Kernel limits per session: each session's tool processes in a cgroup of their own.

Where the daemon may write cgroups (root, or systemd ``Delegate=yes``), every command a
tool starts runs in a leaf ``navi-<owner>/session-<id>/cmd-<n>`` below the daemon's own
cgroup. `<owner>` names the daemon, so a daemon starting on a data folder clears the
trees a dead daemon of that folder left (`clear_stale`) and leaves a live one's alone.
The limits (``memory.max``, ``pids.max``, ``cpu.max``) are the session's; a kill is one
command's leaf, so stopping one command leaves the session's others running.

cgroup v2 kills where it has ``cgroup.kill`` (kernel 5.14+) and limits with the
controllers it has; a writable v1 hierarchy fills in a missing controller, and the v1
freezer kills without ``cgroup.kill``.

A process is in its leaf before it runs anything of the command (it starts as bash
waiting on a pipe until its pid is written into the leaves), so whatever it forks —
double forks, ``setsid`` daemons, a fork bomb held by ``pids.max`` — dies with the
leaf. Where cgroups cannot be used (`status` says why), the process group and the /proc
scan of `procs.kill_group` are all there is.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import itertools
import logging
import os
import re
import shutil
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs
import trio

from navi_trio.profiles import ProcessLimits
from navi_trio.tools.proctree import Strays, start_time

log = logging.getLogger("navi_trio.tools.cgroups")

LIMITED = ("memory", "pids", "cpu")  # the controllers whose limits a profile sets
CPU_PERIOD_US = 100_000
KILL_ROUNDS = 8  # a v1 freeze may miss a process being forked: look again, at most this
KILL_WAIT_SEC = 5.0  # for the processes of one round to die
MB = 1 << 20
_ENTRY = 'read -r -u {fd} _ || exit 125; exec {fd}<&-; exec "$@"'
_SELF_ENTRY = 'for p in "${{@:1:{n}}}"; do echo $$ > "$p" || exit 125; done; shift {n}; exec "$@"'
_SAFE = re.compile(r"[A-Za-z0-9_.-]{1,80}\Z")


class CgroupsUnavailable(Exception):
    """Cgroups cannot be used here; the message says why."""


def own_cgroups(text: str) -> dict[str, str]:
    """/proc/self/cgroup as {controller: path}; the key "" is the cgroup v2 hierarchy."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        if parts[0] == "0" and not parts[1]:
            out[""] = parts[2]
            continue
        for name in parts[1].split(","):
            if name:
                out.setdefault(name, parts[2])
    return out


def cgroup_mounts(text: str) -> dict[str, Path]:
    """/proc/self/mounts as {controller: mount point}; "" is the cgroup v2 mount."""
    out: dict[str, Path] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point = Path(fields[1].replace("\\040", " "))
        if fields[2] == "cgroup2":
            out.setdefault("", point)
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                if option in (*LIMITED, "freezer"):
                    out.setdefault(option, point)
    return out


@attrs.frozen
class Plan:
    """The cgroup this process runs in, in each hierarchy that may serve: v2, and the
    v1 ones of the limited controllers and the freezer."""

    v2: Path | None
    v1: Mapping[str, Path]


def plan(mounts: str, cgroups: str) -> Plan:
    """Where this process's cgroups are, from the texts of /proc/self/mounts and
    /proc/self/cgroup (a cgroup path is relative to its hierarchy's mount)."""
    points, own = cgroup_mounts(mounts), own_cgroups(cgroups)

    def place(key: str) -> Path | None:
        if key not in points or key not in own:
            return None
        return points[key] / own[key].lstrip("/")

    v1 = {c: p for c in (*LIMITED, "freezer") if c and (p := place(c)) is not None}
    return Plan(place(""), v1)


def tree_name(owner: str) -> str:
    """The folder of one daemon's cgroups (`owner`: `procs.tag_owner`)."""
    return f"navi-{owner}"


def stale_owner(name: str, digest: str) -> bool:
    """Whether the folder `name` is a tree of a daemon of the data folder `digest` that
    is no longer alive (its pid gone, or now another process's)."""
    if not name.startswith(f"navi-{digest}."):
        return False
    rest = name.removeprefix(f"navi-{digest}.").split(".")
    if len(rest) != 2 or not all(p.isdigit() for p in rest):
        return False
    return start_time(int(rest[0])) != int(rest[1])


def session_name(session_id: str) -> str:
    """A session's folder name: its id when it is a plain name, else a digest of it."""
    return _folder_name("session-", session_id)


def server_name(name: str) -> str:
    """The folder of a stdio MCP server's processes (`name`: its config entry's)."""
    return _folder_name("mcp-", name)


def _folder_name(prefix: str, ident: str) -> str:
    if _SAFE.fullmatch(ident) and ident not in (".", ".."):
        return prefix + ident
    return prefix + hashlib.sha256(ident.encode("utf-8", "replace")).hexdigest()[:32]


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _pids(folder: Path) -> set[int]:
    """The processes of `folder` and of every cgroup below it."""
    found: set[int] = set()
    for dirpath, _, _ in os.walk(folder):
        found |= {int(p) for p in _read(Path(dirpath) / "cgroup.procs").split()}
    return found


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _rmtree(folder: Path) -> bool:
    """Remove `folder` and the cgroups below it (deepest first); whether it is gone."""
    if not folder.is_dir():
        return True
    for dirpath, _, _ in sorted(os.walk(folder), key=lambda d: -d[0].count("/")):
        try:
            os.rmdir(dirpath)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.debug("cannot remove cgroup %s: %s", dirpath, exc.strerror)
                return False
    return True


@attrs.frozen
class Group:
    """One place in each hierarchy used: `v2` (killed with ``cgroup.kill``), `v1` by
    controller (the ``freezer`` one kills when there is no `v2`)."""

    v2: Path | None
    v1: Mapping[str, Path]

    def folders(self) -> list[Path]:
        return ([self.v2] if self.v2 is not None else []) + list(self.v1.values())

    def pids(self) -> set[int]:
        """Every process in the group (and below it), in every hierarchy."""
        found: set[int] = set()
        for folder in self.folders():
            found |= _pids(folder)
        return found

    def _freezer(self, state: str) -> None:
        freezer = self.v1.get("freezer")
        if self.v2 is None and freezer is not None:
            with contextlib.suppress(OSError):  # removed meanwhile: nothing left to freeze
                _write(freezer / "freezer.state", state)

    async def kill(self) -> set[int]:
        """SIGKILL everything in the group, however it forked; returns after they died
        (or `KILL_WAIT_SEC` a round). The pids killed."""
        killed: set[int] = set()
        for _ in range(KILL_ROUNDS):
            self._freezer("FROZEN")  # no fork while we read and signal
            # Read and held before the kill: a process cgroup.kill struck may have left
            # the group already when it is read after (a CPU free for it to die on).
            pids = self.pids()
            if not pids:
                self._freezer("THAWED")
                break
            strays = Strays(pids)
            try:
                if self.v2 is not None:
                    with contextlib.suppress(OSError):  # removed meanwhile
                        _write(self.v2 / "cgroup.kill", "1")
                strays.signal(signal.SIGKILL)
                self._freezer("THAWED")  # a frozen process dies once thawed
                with trio.move_on_after(KILL_WAIT_SEC):
                    await strays.wait()
                killed |= set(strays.fds)
            finally:
                strays.close()
        return killed

    def remove(self) -> None:
        for folder in self.folders():
            _rmtree(folder)


@attrs.frozen
class CommandGroup:
    """The leaf of one command: `enter` puts its process in, `group.kill` kills all it
    became, `oom_kills` says whether the memory limit struck, `remove` at the end."""

    group: Group
    memory_mb: int | None  # the limit in force, when there is one
    memory_v2: bool  # the memory controller is the v2 one (else v1, or none)
    bash: str

    def entry_argv(self, argv: list[str], fd: int) -> list[str]:
        """`argv` started by bash waiting for a line on `fd` before it execs it: the
        process is in its leaf before the command runs."""
        return [self.bash, "-c", _ENTRY.format(fd=fd), "navi-cgroup", *argv]

    def enter(self, pid: int) -> None:
        for folder in self.group.folders():
            _write(folder / "cgroup.procs", str(pid))

    def self_entry_argv(self, argv: list[str]) -> list[str]:
        """`argv` started by bash that writes its own pid into the leaves, then execs it:
        for a process started by code that passes it no pipe (the MCP SDK's stdio
        client). It never runs outside its leaf: it exits 125 when it cannot enter."""
        procs = [str(folder / "cgroup.procs") for folder in self.group.folders()]
        script = _SELF_ENTRY.format(n=len(procs))
        return [self.bash, "-c", script, "navi-cgroup", *procs, *argv]

    def limit_hits(self) -> tuple[int, int]:
        """(OOM kills, forks refused by ``pids.max``) so far: compared before and after
        a call, they say whether a limit struck during it."""
        refused = 0
        pids = self.group.v2 if "pids" not in self.group.v1 else self.group.v1["pids"]
        if pids is not None:  # counted where the limit is (the parent), or in the leaf
            for folder in (pids, pids.parent):
                refused += _counter(_read(folder / "pids.events"), "max")
        return self.oom_kills(), refused

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed for the memory limit."""
        if self.memory_mb is None:
            return 0
        if self.memory_v2 and self.group.v2 is not None:
            return _counter(_read(self.group.v2 / "memory.events"), "oom_kill")
        memory = self.group.v1.get("memory")
        return 0 if memory is None else _counter(_read(memory / "memory.oom_control"), "oom_kill")

    def remove(self) -> None:
        """Remove the leaf, and its session's folder when no other command is in it."""
        for folder in self.group.folders():
            if _rmtree(folder):
                with contextlib.suppress(OSError):  # another command of the session runs on
                    os.rmdir(folder.parent)


@attrs.frozen
class SessionCgroup:
    """Where the commands of one session go: this daemon's tree, the session, the limits
    of its profile (written at each command, so a profile switch takes effect)."""

    tree: Tree
    session_id: str
    limits: ProcessLimits

    def command(self) -> CommandGroup:
        return self.tree.command(self.session_id, self.limits)


class Tree:
    """One daemon's cgroups (``navi-<owner>`` in each hierarchy used) and what they do."""

    def __init__(self, top: Group, v2_limits: frozenset[str], bash: str) -> None:
        self.top = top
        self.v2_limits = v2_limits  # the limited controllers the v2 hierarchy has
        self.bash = bash
        self._serial = itertools.count(1)

    def limited(self) -> list[str]:
        """The limits in force, each with its hierarchy ("memory (v1)")."""
        out = []
        for name in LIMITED:
            if name in self.v2_limits:
                out.append(f"{name} (v2)")
            elif name in self.top.v1:
                out.append(f"{name} (v1)")
        return out

    def describe(self) -> str:
        kill = "cgroup.kill (v2)" if self.top.v2 is not None else "the v1 freezer"
        limits = ", ".join(self.limited()) or "none (no writable memory, pids or cpu controller)"
        return f"each session's tool processes in a cgroup; kill: {kill}; limits: {limits}"

    def command(self, session_id: str, limits: ProcessLimits) -> CommandGroup:
        """A new leaf for one command of `session_id`, its session's `limits` written."""
        return self.open_leaf(session_name(session_id), limits)

    def server(self, name: str, limits: ProcessLimits) -> CommandGroup:
        """A new leaf for one start of the stdio MCP server `name`, under the limits of
        its entry: it is the daemon's, shared by every session whose profile names it."""
        return self.open_leaf(server_name(name), limits)

    def open_leaf(self, folder: str, limits: ProcessLimits) -> CommandGroup:
        """A new leaf below `folder` (a session's or a server's, made when missing),
        `limits` written on that folder."""
        leaf = f"cmd-{next(self._serial)}"
        made: list[Path] = []
        try:
            v2 = None
            if self.top.v2 is not None:
                v2 = self._leaf(self.top.v2, folder, leaf, limits, self.v2_limits, True, made)
            v1 = {
                name: self._leaf(top, folder, leaf, limits, {name}, False, made)
                for name, top in self.top.v1.items()
            }
        except OSError:
            for done in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(done)
            raise
        memory_v2 = "memory" in self.v2_limits
        memory = memory_v2 or "memory" in self.top.v1
        return CommandGroup(
            Group(v2, v1), limits.memory_mb if memory else None, memory_v2, self.bash
        )

    @staticmethod
    def _leaf(
        top: Path,
        session: str,
        leaf: str,
        limits: ProcessLimits,
        controllers: frozenset[str] | set[str],
        v2: bool,
        made: list[Path],
    ) -> Path:
        folder = top / session
        if not folder.is_dir():
            folder.mkdir()
            made.append(folder)
        if v2 and controllers:  # the leaf's own memory.events, for its OOM kills
            _write(folder / "cgroup.subtree_control", " ".join(f"+{c}" for c in controllers))
        for name in controllers:
            _set_limit(folder, name, limits, v2)
        (folder / leaf).mkdir()
        made.append(folder / leaf)
        return folder / leaf

    async def close(self) -> None:
        """Kill what is left in the tree and remove it (the daemon is stopping)."""
        await self.top.kill()
        self.top.remove()


def _set_limit(folder: Path, name: str, limits: ProcessLimits, v2: bool) -> None:
    if name == "memory":
        size = str(limits.memory_mb * MB)
        if v2:
            _write(folder / "memory.max", size)
            _try_write(folder / "memory.swap.max", "0")  # the limit is of memory, not swap
            return
        try:
            _write(folder / "memory.limit_in_bytes", size)
            _try_write(folder / "memory.memsw.limit_in_bytes", size)  # memory + swap
        except OSError:  # raised above memory + swap's limit: that one first
            _try_write(folder / "memory.memsw.limit_in_bytes", size)
            _write(folder / "memory.limit_in_bytes", size)
    elif name == "pids":
        _write(folder / "pids.max", str(limits.pids))
    elif name == "cpu":
        quota = (
            None if limits.cpu_cores is None else max(1000, int(limits.cpu_cores * CPU_PERIOD_US))
        )
        if v2:
            _write(folder / "cpu.max", f"{quota or 'max'} {CPU_PERIOD_US}")
        else:
            _write(folder / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(folder / "cpu.cfs_quota_us", str(quota or -1))


def _try_write(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):  # no such file here (no swap accounting)
        _write(path, text)


def _delegate_v2(own: Path) -> frozenset[str]:
    """Enable the limited controllers the v2 cgroup `own` has for the cgroups below it;
    those enabled. A cgroup with processes of its own cannot (the no-internal-process
    rule of v2: a systemd service's cgroup): this process moves to a leaf of its own
    (``navi-daemon``) first."""
    have = set(_read(own / "cgroup.controllers").split()) & set(LIMITED)
    if not have:
        return frozenset()
    wanted = " ".join(f"+{c}" for c in sorted(have))
    try:
        _write(own / "cgroup.subtree_control", wanted)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        daemon = own / "navi-daemon"
        daemon.mkdir(exist_ok=True)
        _write(daemon / "cgroup.procs", str(os.getpid()))
        _write(own / "cgroup.subtree_control", wanted)
    return frozenset(have)


def _system_plan() -> Plan:
    return plan(_read(Path("/proc/self/mounts")), _read(Path("/proc/self/cgroup")))


def has_kill(folder: Path, release: str | None = None) -> bool:
    """Whether the v2 cgroups at `folder` can be killed with ``cgroup.kill`` (Linux 5.14+;
    the root cgroup has no such file, its children do)."""
    if (folder / "cgroup.kill").exists():
        return True
    if (folder / "cgroup.type").exists():
        return False  # a non-root cgroup without it: an older kernel
    numbers = re.match(r"(\d+)\.(\d+)", release or os.uname().release)
    return numbers is not None and (int(numbers[1]), int(numbers[2])) >= (5, 14)


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK) and (folder / "cgroup.procs").exists()


def status(where: Plan | None = None) -> tuple[bool, str]:
    """Whether cgroups can be used here (without creating any), and how or why not."""
    where = where or _system_plan()
    if shutil.which("bash") is None:
        return False, "bash is not installed (it places each process in its cgroup)"
    if not hasattr(os, "pidfd_open"):
        return False, "no pidfd_open here (Linux 5.3+ is needed)"
    v2 = where.v2 if where.v2 is not None and _writable(where.v2) else None
    if v2 is not None and not has_kill(v2):
        v2 = None
    v2_limits = set(_read(v2 / "cgroup.controllers").split()) & set(LIMITED) if v2 else set()
    v1 = [c for c, p in where.v1.items() if c not in v2_limits and _writable(p)]
    if v2 is None and "freezer" not in v1:
        if where.v2 is None:
            why = "no cgroup v2 hierarchy is mounted"
        elif not _writable(where.v2):
            why = f"{where.v2} is not writable (run as root, or under systemd with Delegate=yes)"
        else:
            why = f"{where.v2} has no cgroup.kill (Linux 5.14+ is needed)"
        return False, why + ", and no writable cgroup v1 freezer"
    limits = [f"{c} (v2)" for c in LIMITED if c in v2_limits]
    limits += [f"{c} (v1)" for c in LIMITED if c in v1]
    kill = "cgroup.kill (v2)" if v2 is not None else "the v1 freezer"
    missing = [c for c in LIMITED if c not in v2_limits and c not in v1]
    text = f"kill: {kill}; limits: {', '.join(limits) or 'none'}"
    if missing:
        text += f" (no writable {', '.join(missing)} controller: those limits are not applied)"
    return True, text


def open_tree(owner: str, where: Plan | None = None) -> Tree:
    """Make this daemon's tree (`tree_name`) in each hierarchy that serves; raises
    `CgroupsUnavailable` with the reason when none can kill."""
    where = where or _system_plan()
    ok, why = status(where)
    if not ok:
        raise CgroupsUnavailable(why)
    bash = shutil.which("bash")
    assert bash is not None  # status checked it
    name = tree_name(owner)
    v2 = None
    v2_limits: frozenset[str] = frozenset()
    if where.v2 is not None and has_kill(where.v2) and _writable(where.v2):
        try:
            v2_limits = _delegate_v2(where.v2)
        except OSError as exc:
            log.warning("cgroup v2 controllers cannot be delegated at %s: %s", where.v2, exc)
        try:
            (where.v2 / name).mkdir(exist_ok=True)
            if v2_limits:
                _write(
                    where.v2 / name / "cgroup.subtree_control",
                    " ".join(f"+{c}" for c in sorted(v2_limits)),
                )
            v2 = where.v2 / name
        except OSError as exc:
            log.warning("cannot make cgroup %s: %s", where.v2 / name, exc.strerror)
            v2_limits = frozenset()
    v1: dict[str, Path] = {}
    for controller, base in where.v1.items():
        if controller in v2_limits or (controller == "freezer" and v2 is not None):
            continue
        try:
            (base / name).mkdir(exist_ok=True)
            v1[controller] = base / name
        except OSError as exc:
            log.warning("cannot make cgroup %s: %s", base / name, exc.strerror)
    if v2 is None and "freezer" not in v1:
        Group(None, v1).remove()
        raise CgroupsUnavailable("no cgroup could be made to kill with (see the log)")
    return Tree(Group(v2, v1), v2_limits, bash)


def _stale(where: Plan, digest: str) -> Iterator[Group]:
    """The trees dead daemons of the data folder `digest` left, one group per name."""
    names: set[str] = set()
    tops = ([where.v2] if where.v2 is not None else []) + list(where.v1.values())
    for top in tops:
        try:
            names |= {n for n in os.listdir(top) if stale_owner(n, digest)}
        except OSError:
            continue
    for name in sorted(names):
        v2 = where.v2 / name if where.v2 is not None and (where.v2 / name).is_dir() else None
        v1 = {c: p / name for c, p in where.v1.items() if (p / name).is_dir()}
        yield Group(v2, v1)


async def clear_stale(digest: str, where: Plan | None = None) -> list[int]:
    """Kill what the cgroup trees of dead daemons of the data folder `digest` hold, and
    remove them; the pids killed (for the log)."""
    where = where or _system_plan()
    killed: set[int] = set()
    for group in _stale(where, digest):
        killed |= await group.kill()
        group.remove()
    if killed:
        log.warning(
            "killed %d process(es) left in the cgroups of a previous daemon: %s",
            len(killed),
            " ".join(map(str, sorted(killed))),
        )
    return sorted(killed)


# Per process: the tree of each owner (None: cgroups cannot be used, said once).
_TREES: dict[str, Tree | None] = {}


def tree_for(owner: str) -> Tree | None:
    """This process's tree for `owner`, made at the first command; None where cgroups
    cannot be used (logged once, with the reason)."""
    if owner not in _TREES:
        try:
            tree: Tree | None = open_tree(owner)
        except CgroupsUnavailable as exc:
            log.info("cgroups are not used: %s", exc)
            tree = None
        _TREES[owner] = tree
        if tree is not None:
            atexit.register(tree.top.remove)  # empty by then, unless SIGKILLed
    return _TREES[owner]


async def close_trees() -> None:
    """Kill what is left in this process's trees and remove them (at shutdown)."""
    trees = [t for t in _TREES.values() if t is not None]
    _TREES.clear()
    for tree in trees:
        await tree.close()
