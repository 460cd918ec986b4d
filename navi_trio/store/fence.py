"""The fencing token that every write of a session's owner carries.

A lease (store/base.py `LeaseRow`) has a `generation`: it goes up by one each time
another owner takes the session over. The owner's runtime holds its lease inside
``with fenced(Fence(session_id, owner, generation)):`` (core/turn/lease.py does it), and
every write to that session made inside the block, in that task or any task it starts,
carries the fence: the store checks, in the write's own transaction, that the lease row
still names this owner with this generation, and refuses the write with
`LeaseLostError` when it does not. So a daemon that was paused (SIGSTOP, a long GC, a
partition) past its lease, and whose session another daemon has taken over since, can
never append to the history it no longer owns, even though it has not noticed yet.

The same fence guards the run's other writes: a kv write (todo, scratchpad, memory,
task notes) made inside any `fenced` block carries it too (`current_fence`), whatever
its scope and key, and is refused the same way. Work that outlives the run and belongs
to the daemon (a background job, its note) runs `unfenced`.

The fence travels in a ContextVar rather than as an argument: the writes come from deep
inside a run (the turn's saves, compression, a profile switch) and the store protocol
stays the same for every caller. Writes made outside any `fenced` block (creating a
session, `navi sessions delete`, tests) carry none and are not checked.

A released lease keeps its row (expired, same owner and generation): a fence of the
last owner still matches, since nobody wrote in between; a takeover bumps the generation.

The takeover rule (`takeover`) is here too, one rule for both engines: a claim wins
when there is no row, the row is the claimer's own, the row has expired, or the row's
process is gone (same host, pid no longer alive, `pid_alive`): a crashed process never
blocks a session for longer than one lease, and on its own host not even that.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs

from navi_trio.errors import LeaseLostError

if TYPE_CHECKING:
    from navi_trio.store.base import LeaseRow  # base imports Fence from here


@attrs.frozen
class Fence:
    session_id: str
    owner: str
    generation: int


_current: contextvars.ContextVar[Fence | None] = contextvars.ContextVar(
    "navi_lease_fence", default=None
)


@contextmanager
def fenced(fence: Fence) -> Iterator[None]:
    """Writes to `fence.session_id` inside the block carry `fence` (see the module)."""
    token = _current.set(fence)
    try:
        yield
    finally:
        _current.reset(token)


@contextmanager
def unfenced() -> Iterator[None]:
    """Writes inside the block carry no fence: work of the daemon's own (a background
    job) that a task of a fenced run started, and that outlives the run."""
    token = _current.set(None)
    try:
        yield
    finally:
        _current.reset(token)


def current_fence() -> Fence | None:
    """The fence of the run this task belongs to, if any (a kv write carries it)."""
    return _current.get()


def fence_for(session_id: str) -> Fence | None:
    """The fence a write to `session_id` carries here, if any."""
    fence = _current.get()
    return fence if fence is not None and fence.session_id == session_id else None


def lost(fence: Fence, holder: tuple[str, int] | None) -> LeaseLostError:
    """The refusal of a write whose fence no longer matches the lease row."""
    now = "nobody" if holder is None else f"{holder[0]} (generation {holder[1]})"
    return LeaseLostError(
        f"session {fence.session_id!r} was taken over by another daemon while this one "
        f"was not answering: its lease is now held by {now}, not by {fence.owner} "
        f"(generation {fence.generation}); this write was refused and nothing of it stored"
    )


def takeover(holder: LeaseRow | None, owner: str, host: str, now: float) -> int | None:
    """The generation a claim by `owner` (on `host`) writes, or None when `holder` keeps
    the lease: someone else's, not expired at `now`, its process not known dead. Our own
    row keeps its generation; a takeover is the next one."""
    if holder is None:
        return 1
    dead = holder.host == host and not pid_alive(holder.pid)
    if holder.owner != owner and holder.expires_at > now and not dead:
        return None
    return holder.generation + (0 if holder.owner == owner else 1)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (signal 0 probes only)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    except OSError:
        return False
    try:  # a zombie is dead too (in a container, PID 1 may never reap it)
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False  # gone since the probe
    except (OSError, IndexError):
        return True  # no /proc: trust the signal probe
    return state not in ("Z", "X")
