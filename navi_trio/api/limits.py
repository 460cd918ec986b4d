"""Per-connection and per-user limits of the daemon."""

from __future__ import annotations

import collections
import itertools
import logging

import trio

log = logging.getLogger(__name__)


class TokenBucket:
    """`rate` tokens per second up to `burst`; `take()` spends one or says no.

    Time is trio's clock, so a test with MockClock controls it."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._at: float | None = None

    def take(self) -> bool:
        now = trio.current_time()
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class Pending:
    """The connections that have not said hello yet: at most `total`, at most
    `per_address` from one address.

    A new connection past either bound closes the oldest one (of its own address, else
    of all) rather than being refused: a client on its way to its hello is there for
    milliseconds, a connection that stalls is the oldest, so holding the slots does not
    lock anybody out; to push a client out an attacker must open more connections than
    the bound within that client's handshake. Closing is cancelling the connection's
    scope (it goes at once: no close handshake with a peer that stalls).
    """

    def __init__(self, total: int, per_address: int) -> None:
        self.total = max(1, total)
        self.per_address = max(1, per_address)
        self._all: collections.OrderedDict[int, tuple[str, trio.CancelScope]] = (
            collections.OrderedDict()
        )
        self._by_address: dict[str, collections.OrderedDict[int, None]] = {}
        self._keys = itertools.count()
        self.closed = 0  # connections closed to make room

    def __len__(self) -> int:
        return len(self._all)

    def enter(self, address: str, scope: trio.CancelScope) -> int:
        """Count a new connection from `address` (cancelled through `scope` to make room
        later); its key, for `leave`."""
        mine = self._by_address.get(address)
        if mine is not None and len(mine) >= self.per_address:
            self._close(next(iter(mine)), "NAVI_WS_PENDING_PER_ADDRESS", self.per_address)
        elif len(self._all) >= self.total:
            self._close(next(iter(self._all)), "NAVI_WS_PENDING_MAX", self.total)
        key = next(self._keys)
        self._all[key] = (address, scope)
        self._by_address.setdefault(address, collections.OrderedDict())[key] = None
        return key

    def leave(self, key: int) -> None:
        """The connection said hello, or is gone (again: nothing)."""
        found = self._all.pop(key, None)
        if found is None:
            return
        mine = self._by_address[found[0]]
        del mine[key]
        if not mine:
            del self._by_address[found[0]]

    def _close(self, key: int, setting: str, bound: int) -> None:
        address, scope = self._all[key]
        self.leave(key)
        scope.cancel()
        self.closed += 1
        if self.closed == 1 or self.closed % 1000 == 0:  # a flood is not a log flood
            log.warning(
                "closed the oldest connection without a hello (from %s): %d wait for one "
                "(%s=%d); %d closed so far",
                address,
                bound,
                setting,
                bound,
                self.closed,
            )
