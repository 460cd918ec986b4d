"""The `skill` tool: a skill's instructions when the model uses it, by name.

With `file`, a file of the skill's folder instead, read-only and bounded: the folder is
opened again from ``/`` without following a symlink, and the file beneath it as the
filesystem tool opens one. Nothing is run here.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs
import trio

from navi_trio.errors import RootChangedError, ToolInputError
from navi_trio.project.files import NotReadable, Reader, utf8_prefix
from navi_trio.project.skills import Skill, Skills, body_text
from navi_trio.tools._beneath import Beneath
from navi_trio.tools.args import arg, parse, schema
from navi_trio.tools.base import ToolContext, ToolResult, cap_text, input_errors_fail
from navi_trio.tools.private import PrivatePaths, private_paths, within
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import run_as


@attrs.frozen(kw_only=True)
class SkillArgs:
    name: str = arg("the skill's name, as listed under Skills")
    file: str | None = arg(
        "a file of the skill's folder to read instead, e.g. references/guide.md", default=None
    )


class SkillTool:
    name = "skill"
    description = (
        "Load the instructions of a skill listed in the system message under Skills, by "
        "name; with `file`, read a file of that skill's folder (references/…). Manual: "
        "read `manual:skills` with the filesystem tool."
    )
    parameters = schema(SkillArgs)

    @input_errors_fail
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        parsed = parse(SkillArgs, args)
        found = ctx.skills.found if isinstance(ctx.skills, Skills) else ()
        skill = next((s for s in found if s.name == parsed.name), None)
        if skill is None:
            names = ", ".join(s.name for s in found) or "none"
            raise ToolInputError(f"no skill named {parsed.name!r}; skills: {names}")
        cap = ctx.settings.tool_output_max_chars
        if parsed.file is None:
            return ToolResult.success(body_text(skill, cap), skill=skill.name)
        text = await trio.to_thread.run_sync(_read_file, skill, parsed.file, ctx)
        return ToolResult.success(cap_text(text, cap), skill=skill.name)


def _read_file(skill: Skill, raw: str, ctx: ToolContext) -> str:
    rel = Path(os.path.normpath(raw))
    path = Path(os.path.normpath(skill.folder / rel))
    if "\x00" in raw or rel.is_absolute() or not within(path, skill.folder):
        raise ToolInputError(f"file {raw!r} is not inside the skill's folder")
    project = skill.origin == "project"
    private = private_paths(ctx.settings, ctx.session_dir) if project else PrivatePaths(())
    who = run_as(ctx.settings.tool_user) if project else None
    cap = ctx.settings.tool_output_max_chars * 4
    with ExitStack() as stack:
        try:
            root = stack.enter_context(Root.open(skill.folder, f"the folder of skill {skill.name}"))
        except RootChangedError as exc:
            raise ToolInputError(str(exc)) from None
        try:
            got = Reader().read(Beneath([root], private, stack, who), path, cap)
        except NotReadable as exc:
            raise ToolInputError(f"{raw}: {exc}") from None
    if got is None:
        raise ToolInputError(f"the skill {skill.name!r} has no file {raw!r}")
    data, size = got
    if b"\x00" in data[:8192]:
        raise ToolInputError(f"{raw} looks like a binary file ({size} bytes); not shown")
    text = utf8_prefix(data, cap)
    return text if size <= cap else text + f"\n[… cut here: the file is {size} bytes]"
