"""The tool schemas a turn offers: the same dicts round after round (their JSON is then
encoded once by the backend), new ones as soon as what is offered changes."""

from __future__ import annotations

from typing import Any

from navi_trio.core.turn.tool_executor import ToolExecutor
from navi_trio.settings import Settings
from navi_trio.tools.base import Tool, ToolRegistry
from navi_trio.tools.filesystem import FilesystemTool
from navi_trio.tools.terminal import TerminalTool


def _by_name(schemas: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["function"]["name"]: s for s in schemas}


def test_the_same_tools_get_the_same_schema_dicts_and_a_change_new_ones() -> None:
    settings = Settings(backgroundable_tools=("terminal",))
    executor = ToolExecutor(ToolRegistry([]), settings, None)
    tools: list[Tool] = [FilesystemTool(), TerminalTool()]
    denied: set[tuple[str, str]] = set()

    def offered() -> dict[str, dict[str, Any]]:
        return _by_name(executor.schemas(tools, hidden=lambda t, a: (t, a) in denied))

    first, again = offered(), offered()
    assert all(again[name] is first[name] for name in first)
    fs_actions = first["filesystem"]["function"]["parameters"]["properties"]["action"]["enum"]
    assert "delete" in fs_actions
    assert "background" in first["terminal"]["function"]["parameters"]["properties"]

    denied.add(("filesystem", "delete"))  # a rule now denies it: asked every round
    narrowed = offered()
    kept = narrowed["filesystem"]["function"]["parameters"]["properties"]["action"]["enum"]
    assert narrowed["filesystem"] is not first["filesystem"]
    assert kept == [a for a in fs_actions if a != "delete"]
    assert narrowed["terminal"] is first["terminal"]
    assert (
        fs_actions == first["filesystem"]["function"]["parameters"]["properties"]["action"]["enum"]
    )  # the schema sent before is not edited

    denied.clear()
    assert offered()["filesystem"] is first["filesystem"]
    denied.update(("filesystem", a) for a in fs_actions)
    assert "filesystem" not in offered()  # no action left: not offered at all
    # The tool's own schema is never changed.
    assert "background" not in TerminalTool().parameters["properties"]
