"""``json.dumps`` with its options fixed once: the encoder made once, not at every call.

``json.dumps`` with any option besides the defaults makes a `json.JSONEncoder`, and
that its C encoder, on every call: for the small values a round encodes (a message's
row, a chat body's message, a tool call, a frame) that is half the time the call takes.
`dumps_with` makes them once and gives a function whose text is ``json.dumps(value,
**options)``'s, and whose errors are its errors (a value JSON cannot hold: TypeError; a
NaN under ``allow_nan=False``: ValueError; a circular value: ValueError, found by
``json.dumps`` itself once the made encoder, which does not look for one, has run out of
stack). Without the C encoder, or should its (undocumented) signature change, the
function is ``json.dumps`` with the options.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Dumps = Callable[[Any], str]
# A value that holds each case the options change: non-ASCII text, a line separator,
# escapes, keys out of order, floats, NaN (when allowed) and a value only `default` takes.
_PROBE_KEYS = ("z", "\u00e9", "a")


def dumps_with(
    *,
    ensure_ascii: bool = True,
    separators: tuple[str, str] = (", ", ": "),
    sort_keys: bool = False,
    allow_nan: bool = True,
    default: Callable[[Any], Any] | None = None,
) -> Dumps:
    """``lambda value: json.dumps(value, **these options)``, each call without making
    an encoder (see the module)."""
    item_separator, key_separator = separators

    def slow(value: Any) -> str:
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            separators=separators,
            sort_keys=sort_keys,
            allow_nan=allow_nan,
            default=default,
        )

    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return slow
    quote = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    # (markers, default, string encoder, indent, key and item separators, sort_keys,
    # skipkeys, allow_nan): what JSONEncoder.iterencode passes for json.dumps's options.
    # No markers: no look for a circular value (see `fast`).
    try:
        encoder = make(
            None,
            default or json.JSONEncoder().default,
            quote,
            None,
            key_separator,
            item_separator,
            sort_keys,
            False,
            allow_nan,
        )
    except TypeError:
        return slow

    def fast(value: Any) -> str:
        try:
            return "".join(encoder(value, 0))
        except RecursionError:
            return slow(value)  # a circular value (or one too deep): json.dumps's error

    probe: dict[str, Any] = dict.fromkeys(_PROBE_KEYS, [1, 2.5, None, True, '\u2028"\\\t'])
    if allow_nan:
        probe["n"] = float("nan")
    if default is not None:
        probe["d"] = {1j}  # what only `default` can take (or refuses, as json.dumps does)
    try:
        same = fast(probe) == slow(probe)
    except (TypeError, ValueError):
        return slow
    return fast if same else slow
