"""The one backoff rule: doubling from `base`, capped, optional jitter that never
waits past the cap; bad parameters are refused with a message naming them."""

from __future__ import annotations

import random

import pytest

from navi_trio.backoff import backoff_delay


def test_each_retry_waits_factor_times_longer_up_to_the_cap() -> None:
    delays = [backoff_delay(n, base=0.5, cap=30.0) for n in range(1, 10)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert [backoff_delay(n, base=1.0, cap=100.0, factor=3.0) for n in (1, 2, 3, 4, 5)] == [
        1.0,
        3.0,
        9.0,
        27.0,
        81.0,
    ]


def test_a_long_run_of_failures_stays_at_the_cap_without_overflowing() -> None:
    assert backoff_delay(5000, base=0.5, cap=30.0) == 30.0
    assert backoff_delay(10**9, base=1.0, cap=60.0, factor=10.0) == 60.0


def test_a_zero_base_never_waits() -> None:
    assert backoff_delay(1, base=0.0, cap=8.0) == 0.0
    assert backoff_delay(5000, base=0.0, cap=8.0) == 0.0


def test_jitter_draws_below_the_delay_and_never_past_the_cap() -> None:
    rng = random.Random(7)
    drawn = [backoff_delay(n, base=1.0, cap=4.0, jitter=0.5, rng=rng) for n in range(1, 200)]
    plain = [backoff_delay(n, base=1.0, cap=4.0) for n in range(1, 200)]
    assert all(d * 0.5 <= j <= d for j, d in zip(drawn, plain, strict=True))
    assert len(set(drawn)) > 100  # it does spread them
    # The same seed gives the same waits.
    again = random.Random(7)
    assert drawn == [
        backoff_delay(n, base=1.0, cap=4.0, jitter=0.5, rng=again) for n in range(1, 200)
    ]


@pytest.mark.parametrize(
    ("attempt", "kwargs", "words"),
    [
        (0, {}, "attempt counts from 1"),
        (1, {"base": -1.0}, "base >= 0"),
        (1, {"factor": 0.5}, "factor >= 1"),
        (1, {"jitter": 1.5}, "jitter is a fraction"),
    ],
)
def test_bad_parameters_are_refused_by_name(
    attempt: int, kwargs: dict[str, float], words: str
) -> None:
    base = kwargs.get("base", 1.0)
    factor = kwargs.get("factor", 2.0)
    jitter = kwargs.get("jitter", 0.0)
    with pytest.raises(ValueError, match=words):
        backoff_delay(attempt, base=base, cap=4.0, factor=factor, jitter=jitter)
