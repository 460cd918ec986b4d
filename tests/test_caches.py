"""navi's small caches are emptied when full (navi_trio.caches)."""

from __future__ import annotations

from navi_trio.caches import remember


def test_a_cache_keeps_what_it_is_given_until_it_is_full_then_starts_again() -> None:
    cache: dict[str, int] = {}
    assert [remember(cache, k, i, 3) for i, k in enumerate("abc")] == [0, 1, 2]
    assert cache == {"a": 0, "b": 1, "c": 2}
    assert remember(cache, "d", 3, 3) == 3
    assert cache == {"d": 3}


def test_a_key_given_again_replaces_its_value() -> None:
    cache = {"a": 0}
    remember(cache, "a", 1, 3)
    assert cache == {"a": 1}
