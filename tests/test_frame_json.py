"""A frame's JSON text and a token's frame, made the fast way, are exactly what the
general way made: the same keys in the same order, the same bytes on the wire."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from navi_trio.api import protocol
from navi_trio.api.protocol import SHOWN_AS_IS, EventFrame, encode, event_frame, for_user
from navi_trio.events import TextDelta, ThinkingDelta, event_to_dict
from navi_trio.text import clean_json, has_lone_surrogate

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _dumps_as_before(frame: dict[str, Any]) -> str:
    text = json.dumps(frame, ensure_ascii=False, separators=(",", ":"))
    if has_lone_surrogate(text):
        text = json.dumps(clean_json(frame), ensure_ascii=False, separators=(",", ":"))
    return text


@given(st.dictionaries(st.text(max_size=8), _VALUES, max_size=6))
def test_a_frame_is_encoded_as_json_dumps_encodes_it(frame: dict[str, Any]) -> None:
    assert encode(frame) == _dumps_as_before(frame)


@given(
    st.sampled_from([TextDelta, ThinkingDelta]),
    st.text(max_size=30),
    st.booleans(),
    st.none() | st.text(max_size=8),
    st.text(min_size=1, max_size=12),
    st.none() | st.integers(min_value=0),
    st.none() | st.text(max_size=8),
)
def test_a_tokens_frame_is_the_frame_the_general_way_makes(
    kind: type[TextDelta | ThinkingDelta],
    text: str,
    is_subagent: bool,
    agent_id: str | None,
    session_id: str,
    seq: int | None,
    epoch: str | None,
) -> None:
    event = kind(text, is_subagent=is_subagent, agent_id=agent_id)
    frame = event_frame(event, session_id, seq, epoch)
    want: dict[str, Any] = {"type": kind.type, "session_id": session_id, "seq": seq}
    if epoch is not None:
        want["epoch"] = epoch
    want.update({k: v for k, v in event_to_dict(event).items() if k != "type"})
    assert isinstance(frame, EventFrame)
    assert list(frame.items()) == list(want.items())
    assert encode(frame) == _dumps_as_before(want)


_ADDRESSES = st.sampled_from(["http://user:pw@10.0.0.5:11434/api", "10.0.0.5:11434", "x"])


@given(
    st.sampled_from(sorted(SHOWN_AS_IS)),
    st.dictionaries(
        st.sampled_from(["message", "error", "output", "result_excerpt", "ok", "text", "task"]),
        _ADDRESSES | _VALUES | st.dictionaries(st.sampled_from(["error", "result"]), _ADDRESSES),
        max_size=5,
    ),
    st.booleans(),
)
def test_the_frames_a_connection_sends_as_they_are_are_those_for_user_leaves_alone(
    kind: str, fields: dict[str, Any], admin: bool
) -> None:
    # A connection skips `for_user` for these types (a token's frame): it must be a no-op.
    frame = {**fields, "type": kind}
    assert for_user(frame, admin=admin) is frame


# Lone surrogates (the general path cleans them), escapes and line separators.
_AWKWARD = st.lists(
    st.sampled_from(["a", " ", "é", "\u2028", '"', "\\", "\x00", "\ud800", "\udfff", "😀"]),
    max_size=6,
).map("".join)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([TextDelta, ThinkingDelta]),
            _AWKWARD,
            st.booleans(),
            st.none() | _AWKWARD,
            st.sampled_from(["s1", "s2", "\ud800"]),
            st.none() | st.integers(min_value=0),
            st.none() | st.sampled_from(["e1", "e2"]),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_a_tokens_json_from_its_sources_template_is_the_general_encoders(
    frames: list[
        tuple[type[TextDelta | ThinkingDelta], str, bool, str | None, str, int | None, str | None]
    ],
) -> None:
    # Several deltas of few sources: each source's template is made once, then reused.
    for kind, text, is_subagent, agent_id, session_id, seq, epoch in frames:
        frame = event_frame(
            kind(text, is_subagent=is_subagent, agent_id=agent_id), session_id, seq, epoch
        )
        assert encode(frame) == _dumps_as_before(dict(frame))


def test_the_token_templates_are_bounded() -> None:
    for i in range(protocol.TOKEN_PARTS_MAX + 10):
        frame = event_frame(TextDelta(f"t{i}"), f"session{i}", i, "e")
        assert encode(frame) == _dumps_as_before(dict(frame))
        assert len(protocol._TOKEN_PARTS) <= protocol.TOKEN_PARTS_MAX
