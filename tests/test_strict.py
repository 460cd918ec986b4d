"""Strict JSON has one owner: the same hook refuses a wrong scalar in a file and in a
client's frame, each said in its reader's terms; long numbers stay bounded."""

from __future__ import annotations

import json
from typing import Any

import attrs
import cattrs
import pytest

from navi_trio.api.protocol import parse_frame
from navi_trio.errors import ProtocolError
from navi_trio.strict import (
    NUMBER_MAX_DIGITS,
    LongNumber,
    WrongTypeError,
    describe,
    json_kind,
    parse_int,
    strict_converter,
)


@attrs.frozen
class Fields:
    text: str = ""
    count: int = 0
    flag: bool = False
    ratio: float = 0.0


# A field of each type in a client frame: (frame type, field).
FRAME_FIELDS = {
    "count": ("subscribe", "last_seq"),
    "text": ("subscribe", "session_id"),
    "flag": ("fork", "files"),
}


@pytest.mark.parametrize(
    ("field", "value", "file_words", "frame_words"),
    [
        (
            "count",
            "5",
            "expected int (a whole number), got '5'",
            "must be a whole number, not a string",
        ),
        (
            "count",
            True,
            "expected int (a whole number), got True",
            "must be a whole number, not true or false",
        ),
        ("count", 1.5, "expected int (a whole number), got 1.5", "must be a whole number, not 1.5"),
        ("text", 7, "expected str (a string), got 7", "must be a string, not a number"),
        ("flag", 1, "expected bool (true or false), got 1", "must be true or false, not a number"),
        (
            "flag",
            None,
            "expected bool (true or false), got None",
            "must be true or false, not null",
        ),
    ],
)
def test_one_hook_says_a_wrong_scalar_in_a_files_and_in_a_frames_terms(
    field: str, value: Any, file_words: str, frame_words: str
) -> None:
    with pytest.raises(cattrs.ClassValidationError) as caught:
        strict_converter().structure({field: value}, Fields)
    assert describe(caught.value) == f"{file_words} @ $.{field}"
    # A frame field of the same type, refused by the same hook, in the client's terms.
    kind, frame_field = FRAME_FIELDS[field]
    raw = json.dumps({"type": kind, "session_id": "s", frame_field: value})
    with pytest.raises(ProtocolError, match=f"field '{frame_field}' {frame_words}"):
        parse_frame(raw, max_bytes=1_000_000)


def test_the_hook_carries_what_was_wanted_and_what_came() -> None:
    with pytest.raises(cattrs.ClassValidationError) as caught:
        strict_converter().structure({"ratio": float("inf")}, Fields)
    [leaf] = caught.value.exceptions
    assert isinstance(leaf, WrongTypeError)
    assert (leaf.typ, leaf.wanted, leaf.value) == (float, "a finite number", float("inf"))


def test_a_number_longer_than_any_field_takes_stays_a_long_number() -> None:
    assert parse_int("9" * NUMBER_MAX_DIGITS) == int("9" * NUMBER_MAX_DIGITS)
    long = parse_int("-" + "9" * (NUMBER_MAX_DIGITS + 1))
    assert isinstance(long, LongNumber) and long.digits == NUMBER_MAX_DIGITS + 1
    assert json_kind(long) == "a number"


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "null"),
        (False, "true or false"),
        (3, "a number"),
        (2.5, "a number"),
        ("x", "a string"),
        ([], "a list"),
        ({}, "an object"),
    ],
)
def test_json_kind_names_a_value_in_jsons_words(value: Any, kind: str) -> None:
    assert json_kind(value) == kind
