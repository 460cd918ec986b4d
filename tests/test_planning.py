"""The planning phase: prompts, parsers, casual detection and the three-phase flow.

The model is a scripted fake `complete` that records the messages of every call; no
network, no real sleeps (the cancellation test uses the autojump clock).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from quick_run import examples

from navi_trio.core.turn.planning import (
    MAX_PLAN_STEPS,
    PlanningPrompts,
    PlanResult,
    fill_prompt,
    format_step,
    is_casual,
    parse_analysis,
    parse_plan,
    plan_context_message,
    plan_event,
    plan_step_texts,
    review_sections,
    run_planning,
    should_plan,
)
from navi_trio.errors import ConfigError, LLMStreamError
from navi_trio.events import PlanPhase, PlanStep, WarningEvent
from navi_trio.profiles import AgentProfile
from navi_trio.settings import REPO_ROOT

PROMPTS_DIR = REPO_ROOT / "config" / "prompts"

GOOD_PLAN = """Complexity: medium
Milestones:
- Failure understood
- Tests green
Steps:
1. Read tests/test_foo.py — TOOL: filesystem
2. Run the failing test — TOOL: terminal
3. Fix the parser — AGENT: coder
4. Summarise the fix — SELF
"""

REVIEW = """Critic:
- assumes the test is deterministic
Pragmatist:
- one tool call is enough to read the file
Detailer:
- check the CHANGELOG
Plan Adjustments:
- Add a step that reruns the whole suite
"""


class FakeModel:
    """A scripted `complete`: one answer per phase, every call recorded."""

    def __init__(self, **answers: str) -> None:
        self.answers = answers
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []

    async def __call__(self, messages: list[dict[str, Any]], phase: str) -> str:
        self.calls.append((phase, messages))
        await trio.lowlevel.checkpoint()
        return self.answers[phase]

    @property
    def phases(self) -> list[str]:
        return [phase for phase, _ in self.calls]

    def prompt(self, phase: str) -> str:
        return "\n".join(m["content"] for p, msgs in self.calls if p == phase for m in msgs)


@pytest.fixture
def prompts() -> PlanningPrompts:
    return PlanningPrompts.load(PROMPTS_DIR)


async def plan_with(
    model: FakeModel,
    prompts: PlanningPrompts,
    profile: AgentProfile | None = None,
    message: str = "fix the failing test in foo.py",
) -> tuple[PlanResult, list[PlanPhase | WarningEvent]]:
    seen: list[PlanPhase | WarningEvent] = []
    with trio.fail_after(5):
        result = await run_planning(
            message,
            profile=profile or AgentProfile(id="coder"),
            complete=model,
            prompts=prompts,
            tools=["filesystem", "terminal"],
            profiles=["coder", "researcher"],
            context_summary="The user works on the foo parser.",
            on_phase=seen.append,
        )
    return result, seen


def phase_log(events: list[PlanPhase | WarningEvent]) -> list[tuple[str, str]]:
    """(phase, status) per event; a warning shows as ("warning", its code)."""
    return [
        (e.phase, e.status) if isinstance(e, PlanPhase) else ("warning", e.code) for e in events
    ]


# ---------------------------------------------------------------- prompts


def test_prompt_files_state_the_formats_the_parsers_expect(prompts: PlanningPrompts) -> None:
    assert "DIRECT" in prompts.analysis
    assert "REFLECT: yes" in prompts.analysis and "REFLECT: no" in prompts.analysis
    for section in ("Critic:", "Pragmatist:", "Detailer:", "Plan Adjustments:"):
        assert section in prompts.review
    for rule in ("1-3", "5-9", "8-15", "15", "Comma test", "TOOL:", "AGENT:", "SELF"):
        assert rule in prompts.plan
    for line in ("Complexity:", "Milestones:", "Steps:"):
        assert line in prompts.plan


def test_prompts_load_names_the_missing_file(tmp_path: Path) -> None:
    (tmp_path / "planning_analysis.md").write_text("{request}")
    (tmp_path / "planning_plan.md").write_text("{request} {analysis} {review}")
    with pytest.raises(ConfigError, match="planning_review.md"):
        PlanningPrompts.load(tmp_path)


def test_prompts_load_names_a_missing_placeholder(tmp_path: Path) -> None:
    (tmp_path / "planning_analysis.md").write_text("{request}")
    (tmp_path / "planning_review.md").write_text("{request} {analysis}")
    (tmp_path / "planning_plan.md").write_text("{request} {analysis}")
    with pytest.raises(ConfigError, match=r"planning_plan.md.*\{review\}"):
        PlanningPrompts.load(tmp_path)


def test_fill_prompt_leaves_braces_in_user_text_alone() -> None:
    template = 'Request: {request}\nJSON example: {"a": {tools}}\nAnalysis: {analysis}'
    request = "print(f'{x}') and {analysis} and {0} and {"
    filled = fill_prompt(template, {"request": request, "tools": "T", "analysis": "A"})
    assert filled == f'Request: {request}\nJSON example: {{"a": T}}\nAnalysis: A'


# ---------------------------------------------------------------- parse_analysis


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("DIRECT", (True, False)),
        ("  **DIRECT**  \n", (True, False)),
        ("Direct.", (True, False)),
        ("`DIRECT`", (True, False)),
        ("Decision: DIRECT", (True, False)),
        ("DIRECT\nIt is a simple factual question.", (True, False)),
        ("<think>maybe REFLECT: yes</think>\nDIRECT", (True, False)),
        ("Goal: fix it\nApproach: run tests\nREFLECT: yes", (False, True)),
        ("Goal: fix it\nREFLECT: Yes.", (False, True)),
        ("Goal: fix it\n**REFLECT:** YES", (False, True)),
        ("Goal: fix it\nreflect - yes", (False, True)),
        ("Goal: fix it\nREFLECT: no", (False, False)),
        ("Goal: fix it\n## REFLECT: No!", (False, False)),
        ("Goal: answer direct questions quickly\nREFLECT: no", (False, False)),
        ("Goal: fix it, no reflect line at all", (False, False)),
        ("", (False, False)),
    ],
)
def test_parse_analysis_reads_direct_and_reflect_tolerantly(
    text: str, expected: tuple[bool, bool]
) -> None:
    assert parse_analysis(text) == expected


# ---------------------------------------------------------------- parse_plan


def steps_of(text: str) -> list[tuple[str, str, str | None]]:
    return [(s.description, s.executor, s.target) for s in parse_plan(text)[0]]


def test_parse_plan_reads_the_documented_format() -> None:
    steps, milestones, complexity = parse_plan(GOOD_PLAN)
    assert complexity == "medium"
    assert milestones == ("Failure understood", "Tests green")
    assert [(s.index, s.description, s.executor, s.target) for s in steps] == [
        (1, "Read tests/test_foo.py", "TOOL", "filesystem"),
        (2, "Run the failing test", "TOOL", "terminal"),
        (3, "Fix the parser", "AGENT", "coder"),
        (4, "Summarise the fix", "SELF", None),
    ]


def test_parse_plan_accepts_every_numbering_and_executor_style() -> None:
    text = """Steps:
1. Read the config — TOOL: filesystem
2) Run the test [TOOL: terminal]
Step 3: Fix the bug (AGENT: coder)
- 4. Summarise the change (SELF)
**5.** Check docs — Executor: TOOL filesystem
### 6. Ask the human — Executor: HUMAN
7 - run linters — tool: terminal
**Step 8** Lint again -> TOOL: `terminal`.
9. Explain results
10. Delegate [AGENT]
"""
    assert steps_of(text) == [
        ("Read the config", "TOOL", "filesystem"),
        ("Run the test", "TOOL", "terminal"),
        ("Fix the bug", "AGENT", "coder"),
        ("Summarise the change", "SELF", None),
        ("Check docs", "TOOL", "filesystem"),
        ("Ask the human", "SELF", None),
        ("run linters", "TOOL", "terminal"),
        ("Lint again", "TOOL", "terminal"),
        ("Explain results", "SELF", None),
        ("Delegate", "AGENT", None),
    ]


def test_parse_plan_reads_markdown_headers_bullets_and_detail_lines() -> None:
    text = """## Plan
**Complexity:** Complex
### Milestones
1. M1: Setup done
2. Milestone 2 - Feature works
### Steps
- Read `__init__.py` — TOOL: filesystem
- Write the module
  Executor: AGENT coder
  - keep it small
- Report back
Executor: SELF
## Notes
1. this numbered note is not a step
"""
    steps, milestones, complexity = parse_plan(text)
    assert complexity == "complex"
    assert milestones == ("Setup done", "Feature works")
    assert [(s.description, s.executor, s.target) for s in steps] == [
        ("Read `__init__.py`", "TOOL", "filesystem"),
        ("Write the module - keep it small", "AGENT", "coder"),
        ("Report back", "SELF", None),
    ]


def test_parse_plan_joins_steps_grouped_under_milestones_and_drops_thinking() -> None:
    text = """<think>1. this is reasoning, not a step</think>
Milestone 1: Environment ready
1. Create a venv → TOOL: terminal
2. Install deps → TOOL: terminal
Milestone 2: Built
1. Build it -> AGENT: coder
"""
    steps, milestones, _ = parse_plan(text)
    assert milestones == ("Environment ready", "Built")
    assert [(s.index, s.description) for s in steps] == [
        (1, "Create a venv"),
        (2, "Install deps"),
        (3, "Build it"),
    ]


def test_parse_plan_without_steps_heading_takes_numbered_lines() -> None:
    text = "Here is my plan.\n1. look around\n2. act — TOOL: terminal\nThat is all."
    assert steps_of(text) == [("look around", "SELF", None), ("act", "TOOL", "terminal")]


def test_parse_plan_keeps_flags_and_dots_inside_descriptions() -> None:
    text = "Steps:\n1. Run `pytest --lf` — TOOL: terminal\n2. cd .. then list (TOOL: terminal)."
    assert steps_of(text) == [
        ("Run `pytest --lf`", "TOOL", "terminal"),
        ("cd .. then list", "TOOL", "terminal"),
    ]


def test_parse_plan_cuts_to_fifteen_steps_and_renumbers() -> None:
    text = "Steps:\n" + "\n".join(f"{i * 10}. step {i} — TOOL: terminal" for i in range(1, 31))
    steps, _, _ = parse_plan(text)
    assert len(steps) == MAX_PLAN_STEPS
    assert [s.index for s in steps] == list(range(1, 16))
    assert steps[-1].description == "step 15"


def test_numbered_tagged_lines_after_inline_milestones_are_steps() -> None:
    # Seen from a real model: milestones inline, then the steps with no "Steps:" heading.
    text = """Complexity: medium
Milestones: gather, report
1. List the files — TOOL: filesystem
2. Read the README — TOOL: filesystem
3. Write the report — SELF
"""
    steps, milestones, complexity = parse_plan(text)
    assert [(s.index, s.description, s.executor, s.target) for s in steps] == [
        (1, "List the files", "TOOL", "filesystem"),
        (2, "Read the README", "TOOL", "filesystem"),
        (3, "Write the report", "SELF", None),
    ]
    assert milestones == ("gather, report",) and complexity == "medium"


def test_numbered_tagged_lines_after_bulleted_milestones_are_steps() -> None:
    text = """Milestones:
- Files known
- Report written
1. List the files — TOOL: filesystem
2. Write the report
"""
    steps, milestones, _ = parse_plan(text)
    assert [(s.description, s.executor) for s in steps] == [
        ("List the files", "TOOL"),
        ("Write the report", "SELF"),
    ]
    assert milestones == ("Files known", "Report written")


def test_numbered_milestones_without_executor_tags_stay_milestones() -> None:
    text = "Milestones:\n1. Design the (API)\n2. Tests green\nSteps:\n1. Write it — SELF\n"
    steps, milestones, _ = parse_plan(text)
    assert milestones == ("Design the (API)", "Tests green")
    assert [s.description for s in steps] == ["Write it"]


@pytest.mark.parametrize(
    "text",
    [
        "Complexity: simple\nMilestones:\n- done\nSteps:\n",  # a heading and no steps
        "Milestones: a; b\n1. first outcome\n2. second outcome\n",  # all milestones
        "Steps: none needed, I will answer directly.",
        "<think>1. Read it — TOOL: filesystem</think>\nNo plan.",  # steps only in thinking
    ],
)
def test_plan_text_with_no_parsable_steps_gives_no_steps(text: str) -> None:
    assert parse_plan(text)[0] == ()


@pytest.mark.parametrize("text", ["", "   \n\n", "I cannot make a plan.", "DIRECT", "}{%$#@!"])
def test_parse_plan_finds_no_steps_in_garbage(text: str) -> None:
    assert parse_plan(text)[0] == ()


def check_plan_invariants(text: str) -> None:
    steps, milestones, complexity = parse_plan(text)
    assert len(steps) <= MAX_PLAN_STEPS
    assert [s.index for s in steps] == list(range(1, len(steps) + 1))
    for s in steps:
        assert s.description and s.description == s.description.strip()
        assert s.executor in ("TOOL", "AGENT", "SELF")
        if s.executor == "TOOL":
            assert s.target
        if s.executor == "SELF":
            assert s.target is None
    assert complexity in ("", "simple", "medium", "complex", "autonomous")
    assert all(m for m in milestones)


@settings(max_examples=examples(300), deadline=None)
@given(st.text())
def test_parse_plan_never_raises_on_arbitrary_text(text: str) -> None:
    check_plan_invariants(text)


_LINE_PIECES = st.sampled_from(
    [
        "1.", "2)", "Step 3:", "- 4.", "**5.**", "###", "-", "*", "  ", "Steps:", "Milestones:",
        "Complexity: medium", "TOOL: terminal", "[AGENT: coder]", "(SELF)", "Executor: TOOL x",
        "— ", "tool:", "agent", "SELF", "read file", "and", ",", "**", "`x`", "{}", "\t",
        "Milestone 1:", "<think>", "</think>", "Notes:", "1", "99.", "AGENT:", "(", ")",
    ]
)  # fmt: skip


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.lists(_LINE_PIECES, max_size=6).map(" ".join), max_size=40).map("\n".join))
def test_parse_plan_never_breaks_on_plan_like_noise(text: str) -> None:
    check_plan_invariants(text)


# ---------------------------------------------------------------- review sections


def test_review_sections_reads_headed_sections_in_any_markdown() -> None:
    text = """**Critic**: the test may be flaky
### Pragmatist
- skip the sub-agent
3. Detailer - read the docs
Plan adjustments:
- add a rerun step
"""
    assert review_sections(text) == {
        "Critic": "the test may be flaky",
        "Pragmatist": "- skip the sub-agent",
        "Detailer": "read the docs",
        "Plan Adjustments": "- add a rerun step",
    }


# ---------------------------------------------------------------- run_planning


async def test_direct_answer_skips_planning_after_one_call(prompts: PlanningPrompts) -> None:
    model = FakeModel(analysis="DIRECT", review="unused", plan=GOOD_PLAN)
    result, seen = await plan_with(model, prompts, AgentProfile(planning_phase2_enabled=True))
    assert model.phases == ["analysis"]
    assert result.direct and not result.has_plan and result.steps == () and result.text == ""
    assert phase_log(seen) == [
        ("analysis", "started"),
        ("analysis", "done"),
        ("review", "skipped"),
        ("plan", "skipped"),
    ]


async def test_reflect_yes_with_phase2_runs_the_review_and_embeds_it(
    prompts: PlanningPrompts,
) -> None:
    analysis = "Goal: fix the parser\nREFLECT: yes"
    model = FakeModel(analysis=analysis, review=REVIEW, plan=GOOD_PLAN)
    result, seen = await plan_with(model, prompts, AgentProfile(planning_phase2_enabled=True))
    assert model.phases == ["analysis", "review", "plan"]
    assert result.reflect and result.review == REVIEW and result.has_plan
    assert "Goal: fix the parser" in model.prompt("review")
    plan_prompt = model.prompt("plan")
    for section, body in [
        ("Critic", "assumes the test is deterministic"),
        ("Pragmatist", "one tool call is enough"),
        ("Detailer", "check the CHANGELOG"),
        ("Plan Adjustments", "reruns the whole suite"),
    ]:
        assert f"### {section}" in plan_prompt and body in plan_prompt
    assert "Goal: fix the parser" in plan_prompt
    assert phase_log(seen) == [
        ("analysis", "started"),
        ("analysis", "done"),
        ("review", "started"),
        ("review", "done"),
        ("plan", "started"),
        ("plan", "done"),
    ]


async def test_a_review_without_headings_is_still_handed_to_the_plan(
    prompts: PlanningPrompts,
) -> None:
    model = FakeModel(analysis="Goal\nREFLECT: yes", review="Use fewer steps.", plan=GOOD_PLAN)
    await plan_with(model, prompts, AgentProfile(planning_phase2_enabled=True))
    assert "Use fewer steps." in model.prompt("plan")


async def test_reflect_yes_with_phase2_disabled_makes_two_calls(
    prompts: PlanningPrompts,
) -> None:
    model = FakeModel(analysis="Goal: x\nREFLECT: yes", review=REVIEW, plan=GOOD_PLAN)
    result, seen = await plan_with(model, prompts)
    assert model.phases == ["analysis", "plan"]
    assert result.reflect and result.review is None and result.has_plan
    assert "Critic" not in model.prompt("plan")
    assert ("review", "skipped") in phase_log(seen)


async def test_reflect_no_skips_the_review_even_when_enabled(prompts: PlanningPrompts) -> None:
    model = FakeModel(analysis="Goal: x\nREFLECT: no", review=REVIEW, plan=GOOD_PLAN)
    result, _ = await plan_with(model, prompts, AgentProfile(planning_phase2_enabled=True))
    assert model.phases == ["analysis", "plan"]
    assert not result.reflect and result.review is None


async def test_planning_mandatory_plans_even_after_direct(prompts: PlanningPrompts) -> None:
    model = FakeModel(analysis="DIRECT", review=REVIEW, plan=GOOD_PLAN)
    result, seen = await plan_with(model, prompts, AgentProfile(planning_mandatory=True))
    assert model.phases == ["analysis", "plan"]
    assert not result.direct and result.has_plan and len(result.steps) == 4
    assert "1-3 steps" in model.prompt("plan")
    assert phase_log(seen)[-2:] == [("plan", "started"), ("plan", "done")]


async def test_every_phase_sees_request_tools_profiles_and_context(
    prompts: PlanningPrompts,
) -> None:
    request = 'rename {analysis} to {review} in config.json {"a": 1}'
    model = FakeModel(analysis="Goal\nREFLECT: yes", review=REVIEW, plan=GOOD_PLAN)
    await plan_with(model, prompts, AgentProfile(planning_phase2_enabled=True), message=request)
    for phase in ("analysis", "review", "plan"):
        text = model.prompt(phase)
        assert request in text
        for word in ("- filesystem", "- terminal", "- researcher", "foo parser"):
            assert word in text
        assert "{request}" not in text and "{tools}" not in text


async def test_a_plan_the_parser_cannot_read_gives_no_plan(prompts: PlanningPrompts) -> None:
    model = FakeModel(analysis="Goal\nREFLECT: no", plan="Sorry, I cannot help with that.")
    result, seen = await plan_with(model, prompts)
    assert not result.direct and not result.has_plan
    assert seen[-1] == PlanPhase(phase="plan", status="done", detail="0 steps")
    with pytest.raises(ValueError, match="no plan steps"):
        plan_context_message(result)


async def test_cancellation_during_a_phase_propagates(
    prompts: PlanningPrompts, autojump_clock: trio.testing.MockClock
) -> None:
    seen: list[PlanPhase | WarningEvent] = []
    reached_end = False

    async def stalls_in_review(messages: list[dict[str, Any]], phase: str) -> str:
        if phase == "review":
            await trio.sleep_forever()
        return "Goal\nREFLECT: yes"

    with trio.move_on_after(30) as scope:
        await run_planning(
            "fix the test",
            profile=AgentProfile(planning_phase2_enabled=True),
            complete=stalls_in_review,
            prompts=prompts,
            tools=[],
            profiles=[],
            on_phase=seen.append,
        )
        reached_end = True
    assert scope.cancelled_caught and not reached_end
    assert phase_log(seen)[-1] == ("review", "started")


async def test_llm_errors_propagate(prompts: PlanningPrompts) -> None:
    async def broken(messages: list[dict[str, Any]], phase: str) -> str:
        raise LLMStreamError("model exploded")

    with trio.fail_after(5), pytest.raises(LLMStreamError, match="model exploded"):
        await run_planning(
            "fix it", profile=AgentProfile(), complete=broken, prompts=prompts,
            tools=[], profiles=[],
        )  # fmt: skip


async def test_empty_message_is_refused_with_a_clear_error(prompts: PlanningPrompts) -> None:
    model = FakeModel(analysis="DIRECT")
    with pytest.raises(ValueError, match="non-empty user message"):
        await plan_with(model, prompts, message="   ")
    assert model.calls == []


# ---------------------------------------------------------------- outputs for the agent


def test_plan_context_message_todo_texts_and_event() -> None:
    steps, milestones, complexity = parse_plan(GOOD_PLAN)
    result = PlanResult(
        direct=False, analysis="a", reflect=False, review=None, text=GOOD_PLAN,
        steps=steps, milestones=milestones, complexity=complexity,
    )  # fmt: skip
    assert plan_context_message(result) == (
        "## Plan\nComplexity: medium\nMilestones:\n- Failure understood\n- Tests green\n"
        "Steps:\n1. Read tests/test_foo.py — TOOL: filesystem\n"
        "2. Run the failing test — TOOL: terminal\n3. Fix the parser — AGENT: coder\n"
        "4. Summarise the fix — SELF"
    )
    assert plan_step_texts(result)[2] == "Fix the parser — AGENT: coder"
    event = plan_event(result)
    assert event.steps == steps and event.milestones == milestones
    assert event.complexity == "medium" and event.text.startswith("## Plan")


def test_format_step_round_trips_through_the_parser() -> None:
    steps = (
        PlanStep(1, "read it", "TOOL", "filesystem"),
        PlanStep(2, "delegate", "AGENT", "coder"),
        PlanStep(3, "think", "SELF"),
    )
    text = "Steps:\n" + "\n".join(f"{s.index}. {format_step(s)}" for s in steps)
    assert parse_plan(text)[0] == steps


# ---------------------------------------------------------------- casual / should_plan

CASUAL = [
    "hi", "Hello!", "hey there", "Hi Navi 👋", "good morning", "Good evening, everyone",
    "thanks", "Thank you so much!", "thx", "cheers mate", "ok", "Okay.", "cool, thanks",
    "bye", "see you later!", "how are you?", "How's it going?", "what's up", "hello, how are you",
    "you're welcome", "Danke schön", "Bonjour !", "merci beaucoup", "hola", "gracias",
    "привет", "спасибо", "こんにちは", "你好", "...", "",
]  # fmt: skip
NOT_CASUAL = [
    "hi, can you fix the failing test in foo.py",
    "thanks, now run the tests",
    "hello world program in C please",
    "what's up with the build?",
    "good morning! summarise this file",
    "ok do it",
    "fix it",
    "how are you implementing the cache?",
    "Hi! Please write a plan to migrate the database to PostgreSQL.",
    "thanks " * 20,
    "hey, what is 2+2",
    "bonjour, peux-tu corriger le test",
]


@pytest.mark.parametrize("message", CASUAL)
def test_greetings_and_small_talk_are_casual(message: str) -> None:
    assert is_casual(message)


@pytest.mark.parametrize("message", NOT_CASUAL)
def test_messages_with_a_task_are_not_casual(message: str) -> None:
    assert not is_casual(message)


@pytest.mark.parametrize(
    ("first", "enabled", "message", "expected"),
    [
        (True, False, "fix the bug", True),
        (False, True, "fix the bug", True),
        (True, True, "fix the bug", True),
        (False, False, "fix the bug", False),
        (True, False, "hello!", False),
        (False, True, "thanks", False),
        (True, True, "good morning", False),
        (False, False, "hi", False),
    ],
)
def test_should_plan_truth_table(first: bool, enabled: bool, message: str, expected: bool) -> None:
    profile = AgentProfile(planning_enabled=enabled)
    assert should_plan(is_first_message=first, profile=profile, message=message) is expected


# The parsers' speed on long whitespace runs (linear, not backtracking) is measured by
# scripts/bench_plan_parser.py: a wall-clock assert here would depend on the machine.


@pytest.mark.parametrize(
    ("first", "message", "expected"),
    [(False, "fix the bug", True), (True, "fix the bug", True), (False, "thanks", False)],
)
def test_planning_mandatory_plans_every_non_casual_turn(
    first: bool, message: str, expected: bool
) -> None:
    profile = AgentProfile(planning_mandatory=True)
    assert should_plan(is_first_message=first, profile=profile, message=message) is expected


async def test_a_review_cut_at_its_cap_ends_planning_with_one_warning(
    prompts: PlanningPrompts,
) -> None:
    from navi_trio.core.turn.llm_call import StreamedReply as Reply
    from navi_trio.llm.base import DoneChunk

    answers = {"analysis": ("Goal\nREFLECT: yes", "stop"), "review": ("Critic: and so", "length")}
    asked: list[str] = []

    async def complete(messages: list[dict[str, Any]], phase: str) -> Reply:
        asked.append(phase)
        await trio.lowlevel.checkpoint()
        text, reason = answers[phase]
        return Reply(text=[text], done=DoneChunk(done_reason=reason))

    seen: list[PlanPhase | WarningEvent] = []
    result = await run_planning(
        "fix the failing test in foo.py",
        profile=AgentProfile(id="r", planning_phase2_enabled=True),
        complete=complete,
        prompts=prompts,
        tools=["filesystem"],
        profiles=["r"],
        on_phase=seen.append,
    )
    assert asked == ["analysis", "review"]  # the plan phase never ran
    assert not result.has_plan and "review phase was cut" in result.failed
    warnings = [e for e in seen if isinstance(e, WarningEvent)]
    assert [w.code for w in warnings] == ["plan_cut"]
    assert [(e.phase, e.status) for e in seen if isinstance(e, PlanPhase)][-1] == (
        "review", "failed",
    )  # fmt: skip
