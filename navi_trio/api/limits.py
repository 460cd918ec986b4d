"""Per-connection and per-user limits of the daemon."""

from __future__ import annotations

import trio


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
