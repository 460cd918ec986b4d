"""The code_exec tool: run a Python snippet in a fresh, isolated interpreter.

The code goes into an anonymous in-memory file (``memfd_create``) run as
``sys.executable -I -u /proc/self/fd/N``, with the terminal's timeout, streaming and
kill rules. Nothing is written to disk, so there is no file for anyone to swap or read.
With ``ctx.sandbox`` set it runs under bwrap, or is refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from navi_trio.errors import ToolInputError
from navi_trio.settings import Settings
from navi_trio.tools.args import arg, parse, schema
from navi_trio.tools.base import ToolContext, ToolResult, input_errors_fail
from navi_trio.tools.procs import memory_file, python_argv
from navi_trio.tools.terminal import (
    command_folder,
    command_result,
    read_timeout,
    run_in,
    timeout_arg,
)


@attrs.frozen(kw_only=True)
class CodeArgs:
    code: str = arg("a complete Python 3 program")
    timeout: float | None = timeout_arg("seconds before it is killed")


@contextmanager
def _snippet(code: str) -> Iterator[int]:
    """An fd of an in-memory file holding `code` (closed on the way out)."""
    try:
        data = code.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolInputError(
            "argument 'code' holds characters that cannot be written as UTF-8 "
            "(an unpaired surrogate)"
        ) from None
    fd = memory_file(data, "navi-snippet")
    try:
        yield fd
    finally:
        os.close(fd)


class CodeExecTool:
    name = "code_exec"
    parameters = schema(CodeArgs)

    def __init__(self, settings: Settings | None = None) -> None:
        default = (settings or Settings()).terminal_timeout_sec
        self.description = (
            "Run a Python 3 program in a fresh interpreter and get its printed output and "
            f"exit code (timeout default and maximum {default:g} s). Print what you need "
            "to see. Manual: read `manual:code_exec` with the filesystem tool."
        )

    @input_errors_fail
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            parsed = parse(CodeArgs, args)
            timeout, note = read_timeout(parsed.timeout, ctx.settings)
            async with command_folder(ctx, None) as place:
                with _snippet(parsed.code) as fd:
                    script = python_argv(Path(f"/proc/self/fd/{fd}"))
                    result = await run_in(ctx, place, script, timeout, pass_fds=(fd,))
        except OSError as exc:
            return ToolResult.fail(f"cannot start Python: {exc.strerror or exc}")
        return command_result(result, note)
