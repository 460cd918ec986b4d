"""`dumps_with`: json.dumps's text and errors for the same options, its encoder made once."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from navi_trio.jsonenc import dumps_with

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)  # lone surrogates, line separators, quotes and escapes included
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
# The option sets navi uses (frames, store rows, chat bodies, token counts) and the defaults.
_OPTIONS: list[dict[str, Any]] = [
    {},
    {"ensure_ascii": False, "separators": (",", ":")},
    {"ensure_ascii": True, "separators": (",", ":"), "allow_nan": False},
    {"ensure_ascii": False, "allow_nan": False},
    {"sort_keys": True, "ensure_ascii": False, "default": str},
]


def _outcome(dumps: Any, value: Any) -> tuple[str, str]:
    try:
        return "text", dumps(value)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("options", _OPTIONS)
@given(value=_VALUES | st.sets(st.integers(), max_size=2) | st.complex_numbers())
def test_the_text_and_the_error_are_json_dumps(options: dict[str, Any], value: Any) -> None:
    assert _outcome(dumps_with(**options), value) == _outcome(
        lambda v: json.dumps(v, **options), value
    )


@pytest.mark.parametrize("options", _OPTIONS)
def test_a_circular_value_is_refused_as_json_dumps_refuses_it(options: dict[str, Any]) -> None:
    loop: list[Any] = [1]
    loop.append({"again": loop})
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_with(**options)(loop)


def test_the_encoder_is_made_once(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []
    real = getattr(json.encoder, "c_make_encoder", None)
    assert real is not None

    def counting(*args: Any) -> Any:
        made.append(args)
        return real(*args)

    monkeypatch.setattr(json.encoder, "c_make_encoder", counting)
    dumps = dumps_with(ensure_ascii=False, separators=(",", ":"))
    before = len(made)
    assert [dumps({"n": i}) for i in range(3)] == ['{"n":0}', '{"n":1}', '{"n":2}']
    assert len(made) == before  # none made by the calls


@pytest.mark.parametrize("options", _OPTIONS)
def test_an_encoder_that_does_not_make_json_dumps_text_is_not_used(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    """Should the C encoder's (undocumented) arguments come to mean something else, the
    made encoder writes other text: the probe tells, and json.dumps is used instead."""
    real = getattr(json.encoder, "c_make_encoder", None)
    assert real is not None

    def skewed(markers: Any, *args: Any) -> Any:
        encoder = real(markers, *args)
        if markers is not None:  # json.dumps's own use (it looks for circular values)
            return encoder
        return lambda value, level: [text.replace(":", "=") for text in encoder(value, level)]

    monkeypatch.setattr(json.encoder, "c_make_encoder", skewed)
    dumps = dumps_with(**options)
    value = {"a": [1, "b"], "c": None}
    assert dumps(value) == json.dumps(value, **options)
