"""The todo tool and the plain functions the agent loop uses on the same list.

The list lives in the kv table (scope ``"todo"``, key = session id) as a JSON list of
``{"text", "status", "validation"}``; a step's index is its 1-based position. With
``profile.step_validation_enabled`` a step cannot be marked ``done`` without a
``validation`` saying what proved it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import trio

from navi_trio.errors import ToolInputError
from navi_trio.events import TodoStep, TodoUpdated
from navi_trio.tools.args import NoArgs, Strings, action_schema, arg, parse_action
from navi_trio.tools.base import KVStore, ToolContext, ToolResult, input_errors_fail

SCOPE = "todo"
STATUSES = ("pending", "in_progress", "done", "failed")
MAX_STEPS = 50
MAX_TEXT = 500
_MARKS = {"pending": "[ ]", "in_progress": "[~]", "done": "[x]", "failed": "[!]"}


def _renumber(steps: Sequence[TodoStep]) -> list[TodoStep]:
    return [attrs.evolve(s, index=i) for i, s in enumerate(steps, start=1)]


async def load_todo(kv: KVStore, session_id: str) -> list[TodoStep]:
    """The session's todo list (empty when none); malformed stored items are skipped."""
    raw = await kv.kv_get(SCOPE, session_id)
    steps: list[TodoStep] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            continue
        status = item.get("status")
        validation = item.get("validation")
        steps.append(
            TodoStep(
                index=0,
                text=item["text"],
                status=status if status in STATUSES else "pending",
                validation=validation if isinstance(validation, str) else None,
            )
        )
    return _renumber(steps)


async def save_todo(kv: KVStore, session_id: str, steps: Sequence[TodoStep]) -> None:
    value = [{"text": s.text, "status": s.status, "validation": s.validation} for s in steps]
    await kv.kv_set(SCOPE, session_id, value)


async def fill_from_plan(kv: KVStore, session_id: str, texts: Sequence[str]) -> list[TodoStep]:
    """Replace the list with one pending step per non-empty plan step text."""
    steps = _renumber(
        [TodoStep(index=0, text=t.strip()[:MAX_TEXT]) for t in texts if t.strip()][:MAX_STEPS]
    )
    await save_todo(kv, session_id, steps)
    return steps


def format_todo(steps: Sequence[TodoStep]) -> str:
    """The list as the model and the user read it."""
    if not steps:
        return "(the todo list is empty)"
    lines = []
    for s in steps:
        line = f"{s.index}. {_MARKS.get(s.status, '[?]')} {s.text} ({s.status})"
        if s.validation:
            line += f" — validated: {s.validation}"
        lines.append(line)
    return "\n".join(lines)


def failed_indexes(steps: Sequence[TodoStep]) -> set[int]:
    return {s.index for s in steps if s.status == "failed"}


def _step_text(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ToolInputError(f"argument '{key}' must be a non-empty string")
    if len(value) > MAX_TEXT:
        raise ToolInputError(f"argument '{key}' is longer than {MAX_TEXT} characters")
    return value.strip()


_TEXT = "add: the step; update: new wording"
_INDEX = "update / remove: step number"
_STEP_NUMBER = "a step number (1, 2 …)"


@attrs.frozen
class Add:
    text: str = arg(_TEXT)


@attrs.frozen(kw_only=True)
class Update:
    index: int = arg(_INDEX, expected=_STEP_NUMBER)
    status: str | None = arg(default=None, choices=STATUSES)
    validation: str | None = arg("what proved the step is done", default=None)
    text: str | None = arg(_TEXT, default=None)


@attrs.frozen
class Remove:
    index: int = arg(_INDEX, expected=_STEP_NUMBER)


@attrs.frozen
class Replace:
    texts: Strings = arg("replace", expected="a non-empty list of step texts", nonempty=True)


ACTIONS: dict[str, type] = {
    "list": NoArgs,
    "add": Add,
    "update": Update,
    "remove": Remove,
    "clear": NoArgs,
    "replace": Replace,
}


def _index(value: int, steps: Sequence[TodoStep]) -> int:
    if not 1 <= value <= len(steps):
        raise ToolInputError(
            f"argument 'index' is {value} but the list has {len(steps)} steps (1-{len(steps)})"
            if steps
            else f"argument 'index' is {value} but the todo list is empty"
        )
    return value


class TodoTool:
    name = "todo"
    description = (
        "Your todo list for this session: steps with status pending / in_progress / done / "
        "failed. Actions: list, add, update (status, validation, text), remove, clear, "
        "replace. Keep exactly one step in_progress. Manual: read `manual:todo` with the "
        "filesystem tool."
    )
    parameters = action_schema(ACTIONS)

    def __init__(self) -> None:
        self._lock = trio.Lock()  # read-modify-write of parallel calls must not interleave

    @input_errors_fail
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        action, parsed = parse_action(ACTIONS, args)
        async with self._lock:
            steps = await load_todo(ctx.kv, ctx.session_id)
            if action == "list":
                return ToolResult.success(format_todo(steps))
            new_steps, summary = self._change(parsed, steps, ctx)
            new_steps = _renumber(new_steps)
            await save_todo(ctx.kv, ctx.session_id, new_steps)
        ctx.publish(TodoUpdated(steps=tuple(new_steps)))
        return ToolResult.success(f"{summary}\n{format_todo(new_steps)}")

    def _change(
        self, args: Any, steps: list[TodoStep], ctx: ToolContext
    ) -> tuple[list[TodoStep], str]:
        if isinstance(args, Add):
            if len(steps) >= MAX_STEPS:
                raise ToolInputError(f"the todo list is full ({MAX_STEPS} steps)")
            text = _step_text(args.text, "text")
            return [*steps, TodoStep(index=0, text=text)], f"added step {len(steps) + 1}"
        if isinstance(args, Replace):
            if len(args.texts) > MAX_STEPS:
                raise ToolInputError(f"argument 'texts' has more than {MAX_STEPS} steps")
            new = [TodoStep(index=0, text=_step_text(t, "texts")) for t in args.texts]
            return new, f"replaced the list with {len(new)} steps"
        if isinstance(args, Remove):
            index = _index(args.index, steps)
            return [s for s in steps if s.index != index], f"removed step {index}"
        if isinstance(args, Update):
            return self._update(_index(args.index, steps), args, steps, ctx)
        return [], "cleared the todo list"

    def _update(
        self, index: int, args: Update, steps: list[TodoStep], ctx: ToolContext
    ) -> tuple[list[TodoStep], str]:
        step = steps[index - 1]
        status = step.status if args.status is None else args.status
        validation = args.validation
        if validation is not None and not validation.strip():
            validation = None
        text = step.text if args.text is None else _step_text(args.text, "text")
        if args.status is None and validation is None and args.text is None:
            raise ToolInputError("update needs at least one of 'status', 'validation', 'text'")
        validation = validation.strip() if validation else step.validation
        if status == "done" and not validation and ctx.profile.step_validation_enabled:
            raise ToolInputError(
                f"step {index} cannot be marked done without 'validation': add what proved "
                "it is done (a test that passed, output you checked, a file you read back)"
            )
        steps[index - 1] = attrs.evolve(step, status=status, validation=validation, text=text)
        return steps, f"step {index} is now {status}"
