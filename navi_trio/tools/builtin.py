"""The core tools, one instance each (spawn_agent and tasks are added by the core)."""

from __future__ import annotations

from navi_trio.settings import Settings
from navi_trio.tools.base import Tool
from navi_trio.tools.code_exec import CodeExecTool
from navi_trio.tools.filesystem import FilesystemTool
from navi_trio.tools.memory import MemoryTool
from navi_trio.tools.scratchpad import ScratchpadTool
from navi_trio.tools.ssh_exec import SshExecTool
from navi_trio.tools.switch_profile import SwitchProfileTool
from navi_trio.tools.terminal import TerminalTool
from navi_trio.tools.todo import TodoTool


def builtin_tools(settings: Settings) -> list[Tool]:
    return [
        FilesystemTool(),
        TerminalTool(settings),
        CodeExecTool(settings),
        TodoTool(),
        ScratchpadTool(),
        MemoryTool(),
        SwitchProfileTool(),
        SshExecTool(settings),
    ]
