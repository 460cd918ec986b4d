"""The environment table (docs/pages/configuration.md) and `Settings` say the same,
both ways.

Every environment variable a `Settings` field reads (its ``metadata["env"]``) has a row,
named in full (no ``NAVI_WS_*``); every variable in the table is one of them or one of
the few navi reads elsewhere (`NOT_SETTINGS`); and where a row states a default in
code (`` `120` ``, `` `true` ``, "empty"), it is the field's default. A default the
table gives in words (a path under the data folder, "the shipped ...") must belong to
a field whose default is computed (a factory) or absent (None).
"""

from __future__ import annotations

import re
from typing import Any

import attrs
from doc_examples import PAGES, section

from navi_trio.settings import Settings

PAGE = PAGES / "configuration.md"
# Read by navi, but not through Settings: what reads each.
NOT_SETTINGS = {
    "XDG_DATA_HOME": "the base of the data folder's default (settings.py)",
    "NAVI_TOKEN": "the token `navi` commands present to the daemon (api/auth.py)",
    "NAVI_DEBUG": "a failing command's traceback (cli/__init__.py)",
    "NAVI_DAEMON_USERS": "the accounts a client trusts with its token (api/listener.py)",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "where `navi serve` exports its traces (api/tracing.py)",
    "NAVI_OTEL_CONTENT": "whether traces carry message content (api/tracing.py)",
}


@attrs.frozen
class Row:
    names: tuple[str, ...]
    default: str


def table() -> list[Row]:
    rows = []
    for line in section(PAGE, "### Environment").splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, f"a row of the environment table is not 3 cells: {line!r}"
        rows.append(Row(tuple(re.findall(r"`([^`]+)`", cells[0])), cells[1]))
    assert len(rows) > 40, "the environment table was not found"
    return rows


def fields_by_env() -> dict[str, list[attrs.Attribute[Any]]]:
    out: dict[str, list[attrs.Attribute[Any]]] = {}
    for field in attrs.fields(Settings):
        out.setdefault(field.metadata["env"], []).append(field)
    return out


def _computed(default: Any) -> bool:
    """A default made when Settings is (a factory), or none at all."""
    return default is None or hasattr(default, "factory")  # an attrs.Factory


def as_env(value: Any) -> str:
    """A default as one would write it in the environment."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def test_every_setting_has_a_row_of_its_own() -> None:
    named = {name for row in table() for name in row.names}
    missing = sorted(set(fields_by_env()) - named)
    assert missing == [], f"variables of Settings the environment table lacks: {missing}"


def test_every_variable_in_the_table_is_read_by_navi() -> None:
    named = {n for row in table() for n in row.names}
    extra = sorted(named - set(fields_by_env()) - set(NOT_SETTINGS))
    assert extra == [], f"variables in the environment table that navi does not read: {extra}"
    assert sorted(set(NOT_SETTINGS) - named) == []  # and the others navi reads are there


def test_the_tables_defaults_are_the_settings_defaults() -> None:
    fields = fields_by_env()
    wrong = []
    for row in table():
        ours = [n for n in row.names if n in fields]
        if not ours:
            continue
        given = re.findall(r"`([^`]*)`", row.default)
        defaults = [[f.default for f in fields[n]] for n in ours]
        computed = [any(_computed(d) for d in ds) for ds in defaults]
        if row.default == "empty":
            shown = [""] * len(ours)
        elif len(given) == len(ours):
            shown = given
        else:
            if not all(computed):
                wrong.append(f"{row.names}: no default per variable in {row.default!r}")
            continue
        for name, ds, is_computed, text in zip(ours, defaults, computed, shown, strict=True):
            if not is_computed and text not in {as_env(d) for d in ds}:
                wrong.append(f"{name}: the table says {text!r}, Settings {as_env(ds[0])!r}")
    assert wrong == []
