"""Tool arguments declared once: an `attrs.frozen` class per tool action.

Each field is declared with `arg`. `schema` and `action_schema` give the JSON schema
the model sees; `parse` and `parse_action` turn the model's arguments into an instance
through one strict cattrs converter (a string refuses a number, a number refuses true),
each problem worded as ``argument 'x' ...`` in a `ToolInputError`. Unknown keys are
ignored (the executor's ``background`` goes by), and ``null`` counts as left out.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs
import cattrs

from navi_trio.errors import ToolInputError
from navi_trio.text import clip

T = TypeVar("T")
Strings = tuple[str, ...]  # a JSON list of strings

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_EXPECTED: dict[Any, str] = {
    str: "a string",
    int: "a whole number",
    float: "a number",
    bool: "true or false",
    Strings: "a list of strings",
}


class _WrongType(TypeError):
    """A value of the wrong JSON type; the field's metadata words the message."""


def _strict_str(value: Any, _: Any) -> str:
    if not isinstance(value, str):
        raise _WrongType
    return value


def _strict_int(value: Any, _: Any) -> int:
    # A whole float (5.0) is a whole number: models write numbers either way.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _WrongType
    return value


def _strict_float(value: Any, _: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _WrongType
    return float(value)


def _strict_bool(value: Any, _: Any) -> bool:
    if not isinstance(value, bool):
        raise _WrongType
    return value


def _strings(value: Any, _: Any) -> Strings:
    # cattrs would read the string "ab" as ("a", "b"): a JSON list is required.
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _WrongType
    return tuple(value)


_converter = cattrs.Converter()
_converter.register_structure_hook(str, _strict_str)
_converter.register_structure_hook(int, _strict_int)
_converter.register_structure_hook(float, _strict_float)
_converter.register_structure_hook(bool, _strict_bool)
_converter.register_structure_hook_func(lambda type_: type_ == Strings, _strings)


def _base_type(type_: Any) -> Any:
    """`X` of an ``X | None`` field, else the type itself."""
    args = [a for a in typing.get_args(type_) if a is not type(None)]
    return args[0] if typing.get_origin(type_) is not tuple and len(args) == 1 else type_


def _number(value: float) -> str:
    return "zero" if value == 0 else f"{value:g}"


def _bounds_problem(meta: Mapping[str, Any], value: float, whole: bool) -> str | None:
    low, high, above = meta.get("minimum"), meta.get("maximum"), meta.get("above")
    unit = f" {meta['unit']}" if meta.get("unit") else ""
    if above is not None and value <= above:
        return f"must be a positive number{' of' + unit if unit else ''}"
    if low is not None and high is not None and not low <= value <= high:
        return f"must be between {low:g} and {high:g}{unit}"
    if low is not None and high is None and value < low:
        return (
            f"must be a whole number of {low} or more"
            if whole
            else f"must be {_number(low)} or more{unit}"
        )
    return None


def _check(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """The checks beyond the type: choices, non-empty, length and bounds."""
    meta = attribute.metadata
    if value is None:
        return
    name = attribute.name
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ToolInputError(_choice_problem(name, choices, value))
    if _nonempty(attribute) and not value:
        raise ToolInputError(_type_problem(attribute))
    longest = meta.get("max_chars")
    if longest is not None and len(value) > longest:
        raise ToolInputError(f"argument '{name}' is longer than {longest} characters")
    if isinstance(value, int | float) and not isinstance(value, bool):
        problem = _bounds_problem(meta, value, _base_type(attribute.type) is int)
        if problem:
            raise ToolInputError(f"argument '{name}' {problem}")


def arg(
    description: str = "",
    *,
    default: Any = attrs.NOTHING,
    choices: Sequence[str] = (),
    expected: str = "",
    nonempty: bool | None = None,
    max_chars: int | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    unit: str = "",
    extra: Mapping[str, Any] | None = None,
) -> Any:
    """A field of an arguments class.

    `expected` words what the value must be where the type's words are not enough;
    `nonempty` refuses "" and []; `unit` follows a bound in its message; `extra` adds
    schema keys the tool applies itself. `above`, an exclusive lower bound, is not shown
    in the schema (grammars built from schemas often refuse ``exclusiveMinimum``)."""
    metadata = {
        "description": description,
        "choices": tuple(choices),
        "expected": expected,
        "nonempty": nonempty,
        "max_chars": max_chars,
        "minimum": minimum,
        "maximum": maximum,
        "above": above,
        "unit": unit,
        "extra": dict(extra or {}),
    }
    return attrs.field(default=default, metadata=metadata, validator=_check)


def _required(attribute: attrs.Attribute[Any]) -> bool:
    return attribute.default is attrs.NOTHING


def _nonempty(attribute: attrs.Attribute[Any]) -> bool:
    """Whether "" (or []) is refused: as asked, else for a required string."""
    asked = attribute.metadata["nonempty"]
    if asked is not None:
        return bool(asked)
    return _required(attribute) and _base_type(attribute.type) is str


def _choice_problem(name: str, choices: Sequence[str], value: Any) -> str:
    # Cut: the model may send anything, of any size, where a choice belongs.
    got = clip(json.dumps(value, default=str))
    return f"argument '{name}' must be one of {', '.join(choices)} (got {got})"


def _type_problem(attribute: attrs.Attribute[Any]) -> str:
    meta = attribute.metadata
    base = _base_type(attribute.type)
    expected = meta.get("expected") or _EXPECTED.get(base, "a valid value")
    if base is str and _nonempty(attribute):
        expected = meta.get("expected") or "a non-empty string"
    required = "is required and " if _required(attribute) else ""
    return f"argument '{attribute.name}' {required}must be {expected}"


def _field_schema(attribute: attrs.Attribute[Any]) -> dict[str, Any]:
    meta = attribute.metadata
    base = _base_type(attribute.type)
    if base == Strings:
        out: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
    else:
        out = {"type": _JSON_TYPES[base]}
    if meta["description"]:
        out["description"] = meta["description"]
    if meta["choices"]:
        out["enum"] = list(meta["choices"])
    for key, schema_key in (
        ("max_chars", "maxLength"),
        ("minimum", "minimum"),
        ("maximum", "maximum"),
    ):
        if meta[key] is not None:
            out[schema_key] = meta[key]
    out.update(meta["extra"])
    return out


def _fields(cls: type) -> tuple[attrs.Attribute[Any], ...]:
    return tuple(attrs.fields(attrs.resolve_types(cls)))


def schema(cls: type) -> dict[str, Any]:
    """The JSON schema of the arguments `cls` declares."""
    fields = _fields(cls)
    return {
        "type": "object",
        "properties": {f.name: _field_schema(f) for f in fields},
        "required": [f.name for f in fields if _required(f)],
    }


def action_schema(actions: Mapping[str, type]) -> dict[str, Any]:
    """The schema of a tool whose ``action`` picks one of `actions`: an ``action`` enum,
    then every action's properties (a property several share must be declared alike),
    required where every action requires it."""
    properties: dict[str, Any] = {"action": {"type": "string", "enum": list(actions)}}
    required = ["action"]
    per_action = [schema(cls) for cls in actions.values()]
    for each in per_action:
        for name, prop in each["properties"].items():
            if properties.setdefault(name, prop) != prop:
                raise TypeError(f"argument {name!r} is declared two ways: {prop}")
    for name in properties:
        if per_action and all(name in each["required"] for each in per_action):
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


def _problem(cls: type, exc: cattrs.ClassValidationError, args: Mapping[str, Any]) -> str:
    """The first problem in field order, in the model's terms."""
    noted, other = exc.group_exceptions()
    for error in other:  # a check of `arg`, run by the class's __init__
        if isinstance(error, ToolInputError):
            return str(error)
    failed = {note.name for _, note in noted}
    for attribute in _fields(cls):
        if attribute.name in failed:
            choices = attribute.metadata["choices"]
            if choices:
                return _choice_problem(attribute.name, choices, args.get(attribute.name))
            return _type_problem(attribute)
    return str(exc)


def parse(cls: type[T], args: Mapping[str, Any]) -> T:
    """`args` as an instance of `cls`, or a `ToolInputError` naming the argument."""
    present = {k: v for k, v in args.items() if v is not None}
    try:
        return _converter.structure(present, cls)
    except cattrs.ClassValidationError as exc:
        raise ToolInputError(_problem(cls, exc, present)) from None


def action_of(actions: Mapping[str, type], args: Mapping[str, Any]) -> str:
    """The action `args` names, one of `actions`, or a `ToolInputError` listing them."""
    action = args.get("action")
    if not isinstance(action, str) or action not in actions:
        raise ToolInputError(_choice_problem("action", list(actions), action))
    return action


def parse_action(actions: Mapping[str, type], args: Mapping[str, Any]) -> tuple[str, Any]:
    """The action `args` names and its arguments parsed by that action's class."""
    action = action_of(actions, args)
    return action, parse(actions[action], args)


@attrs.frozen
class NoArgs:
    """An action that takes no arguments beyond ``action``."""


def schema_problem(schema: Mapping[str, Any], args: Mapping[str, Any]) -> str | None:
    """What is wrong with `args` for a tool's JSON schema (its ``parameters``), in
    words, or None: arguments that did not come from the model (a hook's) are checked
    against what the model was offered before the tool parses them."""
    import jsonschema  # type: ignore[import-untyped]  # only when a hook changes a call

    errors = sorted(jsonschema.Draft202012Validator(dict(schema)).iter_errors(dict(args)), key=str)
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(p) for p in first.absolute_path)
    return f"argument '{where}': {first.message}" if where else first.message
