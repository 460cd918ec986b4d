"""One strict cattrs converter for every file people write by hand (config, scripts).

cattrs would coerce "5" to 5 and 1 to True; a file with the wrong type is a mistake to
report, not to guess at. Errors keep our own wording ("expected int (a whole number),
got '5'") and carry cattrs' key path (``@ $.profiles['coder'].max_iterations``).
"""

from __future__ import annotations

import math
from typing import Any

import cattrs
from cattrs.v import format_exception


class ExpectedError(TypeError):
    """Raised by strict hooks; its message already says what was expected."""


_SCALARS: dict[type, str] = {
    bool: "bool (true or false)",
    int: "int (a whole number)",
    float: "float (a number)",
    str: "str (a string)",
}


def _scalar_hook(typ: type) -> Any:
    def hook(value: Any, _: Any) -> Any:
        ok = isinstance(value, typ) and not (typ is not bool and isinstance(value, bool))
        if typ is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            raise ExpectedError(f"expected {_SCALARS[typ]}, got {value!r}")
        if typ is float and not math.isfinite(value):
            # json.loads reads NaN and Infinity; no setting of ours can use them.
            raise ExpectedError(f"expected a finite number, got {value!r}")
        return float(value) if typ is float else value

    return hook


def strict_converter() -> cattrs.Converter:
    """A converter that refuses unknown keys and never coerces scalars."""
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for typ in _SCALARS:
        converter.register_structure_hook(typ, _scalar_hook(typ))
    return converter


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
