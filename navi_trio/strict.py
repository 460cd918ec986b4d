"""Strict JSON: what a value is in JSON's words, and one strict cattrs converter.

cattrs would coerce "5" to 5 and 1 to True; a file or a frame with the wrong type is a
mistake to report, not to guess at. The same converter structures the files people
write by hand (config, scripts) and the frames clients send. Its scalar hooks raise an
`WrongTypeError` that carries what was wanted and what came: a file's error says it in
our words with cattrs' key path (``expected int (a whole number), got '5' @
$.profiles['coder'].max_iterations``), the protocol in a client's terms. `parse_int`
bounds the whole numbers `json.loads` builds (a `LongNumber` past 18 digits).
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import cattrs
from cattrs.v import format_exception

T = TypeVar("T")

NUMBER_MAX_DIGITS = 18  # a whole number read with `parse_int` (a frame's last_seq, id)


class LongNumber:
    """A whole number with more digits than any field takes: `json.loads` would build
    it (or refuse past Python's 4300-digit limit, in Python's words); we refuse it."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def parse_int(text: str) -> int | LongNumber:
    """`json.loads`' ``parse_int``: a number too long for any field stays a LongNumber."""
    digits = len(text.lstrip("-"))
    return LongNumber(digits) if digits > NUMBER_MAX_DIGITS else int(text)


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float | LongNumber):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class ExpectedError(TypeError):
    """Raised by strict hooks; its message already says what was expected."""


class WrongTypeError(ExpectedError):
    """A scalar of the wrong type: `typ` and `wanted` say what was expected, in Python's
    and JSON's words, `value` what came; the message is a file's wording."""

    def __init__(self, message: str, typ: type, wanted: str, value: Any) -> None:
        super().__init__(message)
        self.typ = typ
        self.wanted = wanted
        self.value = value


_WANTED: dict[type, str] = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "a string",
}


def _scalar_hook(typ: type) -> Any:
    wanted = _WANTED[typ]

    def hook(value: Any, _: Any) -> Any:
        ok = isinstance(value, typ) and not (typ is not bool and isinstance(value, bool))
        if typ is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            message = f"expected {typ.__name__} ({wanted}), got {value!r}"
            raise WrongTypeError(message, typ, wanted, value)
        if typ is float and not math.isfinite(value):
            # json.loads reads NaN and Infinity; no setting of ours can use them.
            wanted_finite = "a finite number"
            raise WrongTypeError(
                f"expected {wanted_finite}, got {value!r}", typ, wanted_finite, value
            )
        return float(value) if typ is float else value

    return hook


def strict_converter() -> cattrs.Converter:
    """A converter that refuses unknown keys and never coerces scalars."""
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for typ in _WANTED:
        converter.register_structure_hook(typ, _scalar_hook(typ))
    return converter


class QuickFirst:
    """Structures with cattrs' plain code first, and with `detailed` only when that fails.

    A class's first structure generates and compiles its structuring code, most of that
    call's cost; the detailed code (a ``try`` and an error list per field) compiles in
    about twice the time of the plain one. Valid input takes the plain path, with the
    same hooks and the same result; input the plain path refuses is structured again by
    `detailed`, whose result or error is the answer, so every error text is the detailed
    converter's. The hooks are copied at the first `structure`: register them all before.
    """

    def __init__(self, detailed: cattrs.Converter) -> None:
        self.detailed = detailed
        self._quick: cattrs.Converter | None = None

    def structure(self, data: Any, typ: type[T]) -> T:
        if self._quick is None:
            self._quick = self.detailed.copy(detailed_validation=False)
        try:
            return self._quick.structure(data, typ)
        except Exception:  # the detailed converter says what is wrong, in its words
            return self.detailed.structure(data, typ)


def _explain(exc: BaseException, typ: Any) -> str:
    # Our hooks and attrs validators word their own messages; cattrs' generic one
    # ("invalid value for type") says less.
    if isinstance(exc, ExpectedError) or (
        isinstance(exc, ValueError | TypeError) and str(exc) and typ is None
    ):
        return str(exc)
    return format_exception(exc, typ)


def describe(exc: cattrs.BaseValidationError) -> str:
    """Every problem in `exc`, each with its key path, on one line."""
    return "; ".join(cattrs.transform_error(exc, path="$", format_exception=_explain))
