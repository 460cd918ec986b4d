"""Checking an MCP tool's input schema before the model sees it.

The model needs an object schema (its arguments are one JSON object). A schema over
`SCHEMA_MAX_CHARS` (serialised) would eat the context of every call: it is cut to a
minimal object schema that keeps the property names and types, with a warning.
"""

from __future__ import annotations

import json
from typing import Any

SCHEMA_MAX_CHARS = 16_000


class SchemaError(ValueError):
    """The server's schema cannot describe an arguments object."""


def check_schema(schema: Any, max_chars: int = SCHEMA_MAX_CHARS) -> tuple[dict[str, Any], str]:
    """(the schema to offer, a warning or ""); SchemaError when it is not an object schema."""
    if not isinstance(schema, dict):
        raise SchemaError(f"the input schema is {type(schema).__name__}, not a JSON object")
    kind = schema.get("type", "object")
    if kind != "object":
        raise SchemaError(f"the input schema has type {kind!r}; a tool takes an object")
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise SchemaError("the input schema's properties is not an object")
    size = len(json.dumps(schema, ensure_ascii=False))
    if size <= max_chars:
        return {"type": "object", **schema}, ""
    minimal: dict[str, Any] = {
        "type": "object",
        "properties": {
            name: {"type": p["type"]} if isinstance(p, dict) and "type" in p else {}
            for name, p in props.items()
        },
    }
    required = schema.get("required")
    if isinstance(required, list):
        minimal["required"] = [r for r in required if r in props]
    if len(json.dumps(minimal)) > max_chars:
        minimal = {"type": "object", "properties": {}, "additionalProperties": True}
    return minimal, (
        f"its input schema ({size} characters) was over {max_chars}: cut to names and types"
    )
