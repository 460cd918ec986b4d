"""The one retry-backoff rule: exponential, capped, with optional jitter.

Attempt 1 waits `base`, each further attempt `factor` times longer, never more than
`cap`. Jitter, a fraction in [0, 1], draws the wait uniformly from
``[delay * (1 - jitter), delay]``, so it spreads retries of many clients without ever
waiting past `cap`. Callers keep their own attempt count (and reset it when a try
succeeds); they pass their constants at each call, so a test can change them.
"""

from __future__ import annotations

import math
import random


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    factor: float = 2.0,
    jitter: float = 0.0,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry number `attempt` (1 for the first retry)."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    if base < 0 or cap < 0 or factor < 1:
        raise ValueError(f"need base >= 0, cap >= 0 and factor >= 1, got {base}, {cap}, {factor}")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError(f"jitter is a fraction in [0, 1], got {jitter}")
    try:
        grown = base * float(factor) ** (attempt - 1) if base else 0.0
    except OverflowError:  # a long run of failures: the cap holds anyway
        grown = math.inf
    delay = float(min(grown, cap))
    if jitter:
        delay *= 1.0 - jitter * (rng or random).random()
    return delay
