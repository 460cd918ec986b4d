"""The planning phase: analysis, optional review, execution plan (spec: agent-loop.md).

The model calls go through an injected `Complete`, so there is no HTTP here; reading
what the model wrote is `plan_text`'s. Bounds (`PlanLimits`): a phase cut by its output
cap ends planning with one ``plan_cut`` warning; what is carried into the next phase is
cut, and a prompt that cannot fit with room for its answer skips planning
(``plan_too_large``). The turn goes on without a plan in both cases.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from navi_trio.core.turn.llm_call import StreamedReply, output_cap
from navi_trio.core.turn.plan_text import MAX_MILESTONES as MAX_MILESTONES
from navi_trio.core.turn.plan_text import MAX_PLAN_STEPS as MAX_PLAN_STEPS
from navi_trio.core.turn.plan_text import REVIEW_SECTIONS as REVIEW_SECTIONS
from navi_trio.core.turn.plan_text import _strip_thinking
from navi_trio.core.turn.plan_text import is_casual as is_casual
from navi_trio.core.turn.plan_text import parse_analysis as parse_analysis
from navi_trio.core.turn.plan_text import parse_plan as parse_plan
from navi_trio.core.turn.plan_text import review_sections as review_sections
from navi_trio.core.turn.tokens import TokenCounter
from navi_trio.errors import ConfigError
from navi_trio.events import PlanCreated, PlanPhase, PlanStep, WarningEvent
from navi_trio.profiles import AgentProfile
from navi_trio.settings import Settings

# complete(messages, phase) -> the model's whole answer; phase is "analysis" | "review" |
# "plan". A `StreamedReply` also says why the model stopped (a cut phase is a failed one).
Complete = Callable[[list[dict[str, Any]], str], Awaitable[str | StreamedReply]]
OnPhase = Callable[[PlanPhase | WarningEvent], None]


_PROMPT_FILES = {
    "analysis": "planning_analysis.md",
    "review": "planning_review.md",
    "plan": "planning_plan.md",
}
# Without these the model would never see the request / the earlier phases' output.
_REQUIRED_PLACEHOLDERS = {
    "analysis": ("{request}",),
    "review": ("{request}", "{analysis}"),
    "plan": ("{request}", "{analysis}", "{review}"),
}
_PLACEHOLDER = re.compile(r"\{(request|analysis|review|tools|profiles|context)\}")


def fill_prompt(template: str, values: Mapping[str, str]) -> str:
    """Replace the known ``{name}`` placeholders in one pass: not `str.format`, since user
    text is full of braces, and a placeholder inside a substituted value stays as it is."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


@attrs.frozen
class PlanningPrompts:
    analysis: str
    review: str
    plan: str

    @classmethod
    def load(cls, prompts_dir: Path) -> PlanningPrompts:
        """Read the three prompt files from `prompts_dir` (ConfigError names a bad one)."""
        texts: dict[str, str] = {}
        for phase, name in _PROMPT_FILES.items():
            path = prompts_dir / name
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                raise ConfigError(f"planning prompt file not found: {path}") from None
            except OSError as exc:
                raise ConfigError(f"cannot read planning prompt {path}: {exc.strerror}") from None
            missing = [p for p in _REQUIRED_PLACEHOLDERS[phase] if p not in text]
            if missing:
                raise ConfigError(
                    f"{path}: the {phase} prompt lacks the placeholder(s) {', '.join(missing)}"
                )
            texts[phase] = text
        return cls(**texts)


@attrs.frozen
class PlanLimits:
    """How big the planning calls may get (see the module docstring)."""

    counter: TokenCounter
    num_ctx: int  # the model's window: prompt + answer must fit in it
    max_tokens: int  # each phase's output cap, as the request sends it
    carry_tokens: int  # the most of the analysis / review carried into the next phase

    @classmethod
    def of(cls, settings: Settings, profile: AgentProfile, counter: TokenCounter) -> PlanLimits:
        cap = output_cap(settings, profile, "plan")
        # The phase output is capped already; the window bound matters for small windows.
        carry = max(64, min(cap, settings.num_ctx // 8))
        return cls(counter=counter, num_ctx=settings.num_ctx, max_tokens=cap, carry_tokens=carry)


class _PlanningFailed(Exception):
    """A phase was cut or a prompt cannot fit: planning ends without a plan."""


def _carry(text: str, what: str, limits: PlanLimits | None) -> str:
    if limits is None:
        return text
    cut, n = limits.counter.truncate_middle(text, limits.carry_tokens)
    return cut if not n else f"{cut}\n[the {what} was cut to {limits.carry_tokens} tokens]"


@attrs.frozen
class PlanResult:
    direct: bool  # Phase 1 said DIRECT (and it was not suppressed): no plan
    analysis: str
    reflect: bool
    review: str | None  # Phase 2 text, when it ran
    text: str  # Phase 3 raw text ("" when direct)
    steps: tuple[PlanStep, ...] = ()
    milestones: tuple[str, ...] = ()
    complexity: str = ""  # simple | medium | complex | autonomous | ""
    failed: str = ""  # why planning ended without a plan (a cut phase, a prompt too big)

    @property
    def has_plan(self) -> bool:
        """True when there is a plan to follow (Phase 3 ran and yielded steps)."""
        return not self.direct and bool(self.steps)


def format_step(step: PlanStep) -> str:
    """One step as the model and the todo list see it: ``description — EXECUTOR``."""
    if step.executor in ("TOOL", "AGENT") and step.target:
        return f"{step.description} — {step.executor}: {step.target}"
    if step.executor == "AGENT":
        return f"{step.description} — AGENT"
    return f"{step.description} — SELF"


def plan_step_texts(result: PlanResult) -> tuple[str, ...]:
    """The todo list's step texts, in plan order."""
    return tuple(format_step(s) for s in result.steps)


def plan_context_message(result: PlanResult) -> str:
    """The assistant message that puts the plan into the context (compact, to follow)."""
    if not result.has_plan:
        raise ValueError("this planning result has no plan steps: there is no plan message")
    lines = ["## Plan"]
    if result.complexity:
        lines.append(f"Complexity: {result.complexity}")
    if result.milestones:
        lines.append("Milestones:")
        lines.extend(f"- {m}" for m in result.milestones)
    lines.append("Steps:")
    lines.extend(f"{s.index}. {format_step(s)}" for s in result.steps)
    return "\n".join(lines)


def plan_event(result: PlanResult) -> PlanCreated:
    """The `plan` event for clients."""
    return PlanCreated(
        text=plan_context_message(result),
        steps=result.steps,
        milestones=result.milestones,
        complexity=result.complexity,
    )


def should_plan(*, is_first_message: bool, profile: AgentProfile, message: str) -> bool:
    """The spec's rule: (first message or planning_enabled) and not casual; `planning_mandatory`
    counts as enabled, `planning_first_message: false` drops the first-message plan."""
    every_turn = profile.planning_enabled or profile.planning_mandatory
    first = is_first_message and profile.planning_first_message
    return (first or every_turn) and not is_casual(message)


def _review_block(review: str) -> str:
    sections = review_sections(review)
    head = "## Review of the analysis (apply every Plan Adjustment)\n\n"
    if not sections:  # the model ignored the format: hand over what it said
        return head + _strip_thinking(review).strip()
    body = "\n\n".join(f"### {name}\n{sections.get(name) or '- none'}" for name in REVIEW_SECTIONS)
    return head + body


def _bullets(items: Sequence[str], empty: str) -> str:
    return "\n".join(f"- {x}" for x in items) if items else empty


def _ask(template: str, values: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": fill_prompt(template, values)}]


_FORCED_NOTE = (
    "The analyst judged this a simple request (DIRECT), but a plan is required: "
    "write a short plan of 1-3 steps."
)


async def run_planning(
    message: str,
    *,
    profile: AgentProfile,
    complete: Complete,
    prompts: PlanningPrompts,
    tools: Sequence[str],
    profiles: Sequence[str],
    context_summary: str = "",
    on_phase: OnPhase = lambda e: None,
    limits: PlanLimits | None = None,
) -> PlanResult:
    """Run Phase 1, then (maybe) Phases 2 and 3. A phase cut at its output cap or a prompt that
    cannot fit ends planning with one warning and no plan (`failed` says why)."""
    if not message.strip():
        raise ValueError("planning needs a non-empty user message")
    run = _Phases(complete, on_phase, limits)
    try:
        return await run.all(message, profile, prompts, tools, profiles, context_summary)
    except _PlanningFailed as exc:
        return PlanResult(
            direct=False,
            analysis=run.analysis,
            reflect=False,
            review=None,
            text="",
            failed=str(exc),
        )


@attrs.define
class _Phases:
    complete: Complete
    on_phase: OnPhase
    limits: PlanLimits | None
    analysis: str = ""

    async def ask(self, phase: str, template: str, values: Mapping[str, str]) -> str:
        messages = _ask(template, values)
        lim = self.limits
        if lim is not None:
            need = lim.counter.estimate_messages(messages) + lim.max_tokens
            if need > lim.num_ctx:
                self.fail(
                    phase,
                    "too large",
                    "plan_too_large",
                    f"planning skipped: the {phase} prompt needs ~{need} tokens with room "
                    f"for its answer, more than the model's window ({lim.num_ctx}, "
                    "OLLAMA_NUM_CTX); going on without a plan",
                )
        answer = await self.complete(messages, phase)
        if isinstance(answer, str):
            return answer
        if answer.done is not None and answer.done.done_reason == "length":
            cap = f" of {lim.max_tokens} tokens" if lim is not None else ""
            self.fail(
                phase,
                "cut",
                "plan_cut",
                f"planning failed: the {phase} phase was cut at its output cap{cap} "
                "(NAVI_PLAN_MAX_TOKENS or the profile's plan_max_tokens); going on "
                "without a plan",
            )
        return answer.content

    def fail(self, phase: str, detail: str, code: str, message: str) -> None:
        self.on_phase(PlanPhase(phase=phase, status="failed", detail=detail))
        self.on_phase(WarningEvent(message=message, code=code))
        raise _PlanningFailed(message)

    async def all(
        self,
        message: str,
        profile: AgentProfile,
        prompts: PlanningPrompts,
        tools: Sequence[str],
        profiles: Sequence[str],
        context_summary: str,
    ) -> PlanResult:
        on_phase = self.on_phase
        values = {
            "request": message,
            "context": context_summary.strip() or "(no earlier conversation)",
            "tools": _bullets(tools, "(no tools)"),
            "profiles": _bullets(profiles, "(no sub-agent profiles)"),
            "analysis": "",
            "review": "",
        }

        on_phase(PlanPhase(phase="analysis", status="started"))
        analysis = self.analysis = await self.ask("analysis", prompts.analysis, values)
        direct, reflect = parse_analysis(analysis)
        on_phase(
            PlanPhase(phase="analysis", status="done", detail=_analysis_detail(direct, reflect))
        )
        if direct and not profile.planning_mandatory:
            on_phase(PlanPhase(phase="review", status="skipped", detail="direct"))
            on_phase(PlanPhase(phase="plan", status="skipped", detail="direct"))
            return PlanResult(direct=True, analysis=analysis, reflect=False, review=None, text="")
        carried = _strip_thinking(analysis).strip()
        values["analysis"] = _FORCED_NOTE if direct else _carry(carried, "analysis", self.limits)

        review: str | None = None
        if profile.planning_phase2_enabled and reflect:
            on_phase(PlanPhase(phase="review", status="started"))
            review = await self.ask("review", prompts.review, values)
            values["review"] = _carry(_review_block(review), "review", self.limits)
            on_phase(PlanPhase(phase="review", status="done"))
        else:
            why = "no reflection asked" if profile.planning_phase2_enabled else "phase 2 disabled"
            on_phase(PlanPhase(phase="review", status="skipped", detail=why))

        on_phase(PlanPhase(phase="plan", status="started"))
        text = await self.ask("plan", prompts.plan, values)
        steps, milestones, complexity = parse_plan(text)
        on_phase(PlanPhase(phase="plan", status="done", detail=f"{len(steps)} steps"))
        return PlanResult(
            direct=False,
            analysis=analysis,
            reflect=reflect,
            review=review,
            text=text,
            steps=steps,
            milestones=milestones,
            complexity=complexity,
        )


def _analysis_detail(direct: bool, reflect: bool) -> str:
    if direct:
        return "direct"
    return "reflect: yes" if reflect else "reflect: no"
