"""The code_exec tool: run a Python snippet in a fresh, isolated interpreter.

The code goes to a temp file in the session folder and runs as
``sys.executable -I -u FILE`` in its own process group, in the run's cwd (else the
session folder), with the terminal's timeout rules; output lines stream through
``ctx.emit`` (coalesced, as the terminal's) and the group is killed on timeout or stop.
With ``ctx.sandbox`` set it runs under bwrap (see `sandbox`), or is refused.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import attrs
import trio

from navi_trio.errors import ToolInputError
from navi_trio.settings import Settings
from navi_trio.tools.base import ToolContext, ToolResult, require_str
from navi_trio.tools.filesystem import base_dir
from navi_trio.tools.procs import python_argv, run_command, tag_owner
from navi_trio.tools.terminal import command_env, command_result, output_progress, read_timeout

SNIPPET_DIR = ".code_exec"


def _write_snippet(ctx: ToolContext, code: str) -> tuple[Path, Path]:
    cwd = base_dir(ctx)
    folder = ctx.session_dir / SNIPPET_DIR
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / f"snippet_{secrets.token_hex(4)}.py"
    script.write_text(code, encoding="utf-8")
    return script, cwd


class CodeExecTool:
    name = "code_exec"
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "a complete Python 3 program"},
            "timeout": {"type": "number", "description": "seconds before it is killed"},
        },
        "required": ["code"],
    }

    def __init__(self, settings: Settings | None = None) -> None:
        default = (settings or Settings()).terminal_timeout_sec
        self.description = (
            "Run a Python 3 program in a fresh interpreter and get its printed output and "
            f"exit code (timeout default and maximum {default:g} s). Print what you need "
            "to see. Manual: read `manual:code_exec` with the filesystem tool."
        )

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            code = require_str(args, "code")
            timeout, note = read_timeout(args, ctx.settings)
        except ToolInputError as exc:
            return ToolResult.fail(str(exc))
        script, cwd = await trio.to_thread.run_sync(_write_snippet, ctx, code)
        sandbox = ctx.sandbox
        if sandbox is not None:  # the snippet must be visible even if its folder is not
            sandbox = attrs.evolve(sandbox, readable=(*sandbox.readable, script.parent))
        try:
            result = await run_command(
                python_argv(script),
                cwd=cwd,
                time_limit=timeout,
                progress=output_progress(ctx),
                max_chars=ctx.settings.tool_output_max_chars,
                sandbox=sandbox,
                bwrap_path=ctx.settings.bwrap_path,
                env=command_env(ctx),
                owner=tag_owner(ctx.settings.data_dir),
            )
        except OSError as exc:
            return ToolResult.fail(f"cannot start Python: {exc.strerror or exc}")
        except ToolInputError as exc:  # SandboxUnavailableError: refused, never unsandboxed
            return ToolResult.fail(str(exc))
        finally:
            script.unlink(missing_ok=True)
        return command_result(result, note)
