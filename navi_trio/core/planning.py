"""The planning phase: analysis, optional review, execution plan (spec: agent-loop.md).

The agent loop decides whether to plan (`should_plan`) and does what follows a plan
(the assistant message from `plan_context_message`, the display history with
``is_plan``, the todo list from `plan_step_texts`, the `plan_event` for clients). This
module runs the model calls through an injected `Complete` function, so it has no HTTP
in it, and reads what the model wrote. The parsers forgive on purpose: models number,
bold and bracket their lists in every style, and a plan read imperfectly is worth more
than a plan thrown away.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from navi_trio.errors import ConfigError
from navi_trio.events import PlanCreated, PlanPhase, PlanStep
from navi_trio.profiles import AgentProfile

# complete(messages, phase) -> the model's whole answer; phase is "analysis" | "review" | "plan".
Complete = Callable[[list[dict[str, Any]], str], Awaitable[str]]

MAX_PLAN_STEPS = 15
MAX_MILESTONES = 10
REVIEW_SECTIONS = ("Critic", "Pragmatist", "Detailer", "Plan Adjustments")

# ---------------------------------------------------------------- prompts

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
    """Replace the known ``{name}`` placeholders in one pass.

    Not `str.format`: user text is full of braces (code, JSON), and a single pass means
    a placeholder spelled inside a substituted value is never expanded again.
    """
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


# ---------------------------------------------------------------- result


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


# ---------------------------------------------------------------- when to plan

_CASUAL_PHRASES = """
hi|hello|hey|heya|hiya|hullo|yo|howdy|greetings|sup|gm|gn|morning|evening|afternoon
good morning|good afternoon|good evening|good night|good day|good to see you
thanks|thank you|thx|ty|tysm|thanks a lot|thank you so much|many thanks|cheers|much appreciated
appreciate it|thanks for the help|thank you for your help|thanks for your help
ok|okay|k|kk|okie|alright|all right|sure|cool|great|nice|awesome|perfect|fine|got it
sounds good|good|yes|yeah|yep|yup|no|nope|nah|lol|haha|hahaha|wow|oh|ah|hmm|indeed
bye|goodbye|good bye|bye bye|see you|see ya|see you later|later|cya|take care|gotta go
have a nice day|have a good day|have a good one|good job|well done|great job|nice work
how are you|how are you doing|how are things|hows it going|how is it going|how do you do
whats up|what is up|wassup|nice to meet you|pleased to meet you|welcome back|im back
youre welcome|you are welcome|np|no problem|no worries|my pleasure
hallo|guten morgen|guten tag|guten abend|gute nacht|danke|danke schön|danke schon|vielen dank
tschüss|tschuss|servus|moin|wie gehts|wie geht es dir|bis später|bis dann
bonjour|bonsoir|salut|coucou|merci|merci beaucoup|au revoir|à bientôt|ça va|comment ça va
hola|buenos días|buenos dias|buenas tardes|buenas noches|gracias|muchas gracias|adiós|adios
qué tal|que tal|cómo estás|como estas|hasta luego|ciao|grazie|grazie mille|buongiorno
buonasera|come stai|arrivederci|olá|ola|oi|obrigado|obrigada|bom dia|boa tarde|boa noite
tudo bem|tchau|hoi|dank je|dank je wel|bedankt|goedemorgen|doei|hej|tack|cześć|dziękuję
привет|здравствуйте|здравствуй|спасибо|большое спасибо|пока|как дела|доброе утро|добрый день
добрый вечер|こんにちは|こんばんは|おはよう|おはようございます|ありがとう|ありがとうございます
你好|您好|谢谢|谢谢你|再见|早上好|晚上好|안녕하세요|안녕|감사합니다|merhaba|teşekkürler|namaste
"""
_CASUAL: frozenset[tuple[str, ...]] = frozenset(
    tuple(p.split()) for line in _CASUAL_PHRASES.split("\n") for p in line.split("|") if p.strip()
)
_CASUAL_LONGEST = max(len(p) for p in _CASUAL)
# Words that may surround a greeting without turning it into a task ("hi there navi").
_CASUAL_FILLER = frozenset(
    "there again all everyone everybody friend friends buddy mate dude man pal guys folks "
    "team navi bot assistant so much very really a lot too you and then today tonight sir "
    "madam again to".split()
)
_CASUAL_MAX_CHARS = 80


def is_casual(message: str) -> bool:
    """A greeting, thanks or small talk with no task in it (never worth a plan)."""
    text = message.strip().lower().replace("’", "'").replace("'", "")
    if len(text) > _CASUAL_MAX_CHARS:
        return False
    words = re.sub(r"[^\w\s]|_", " ", text).split()
    if not words:
        return True  # only punctuation or emoji: nothing to plan
    i, matched = 0, False
    while i < len(words):
        for n in range(min(_CASUAL_LONGEST, len(words) - i), 0, -1):
            if tuple(words[i : i + n]) in _CASUAL:
                i, matched = i + n, True
                break
        else:
            if words[i] not in _CASUAL_FILLER:
                return False
            i += 1
    return matched


def should_plan(*, is_first_message: bool, profile: AgentProfile, message: str) -> bool:
    """The spec's rule: (first message or planning_enabled) and not casual."""
    return (is_first_message or profile.planning_enabled) and not is_casual(message)


# ---------------------------------------------------------------- reading model text

_THINK_CLOSE = re.compile(r"</think(?:ing)?>", re.I)


def _strip_thinking(text: str) -> str:
    # Reasoning models may leak <think>…</think> into the text: the answer is what
    # follows the last closing tag (a linear cut, where a lazy block regex is quadratic).
    return _THINK_CLOSE.split(text)[-1]


def _squash(line: str) -> str:
    # Every regex below sees single spaces only, so `\s*` runs cannot backtrack badly.
    return " ".join(line.split())


def _bare(line: str) -> str:
    """A line without markdown decoration or extra spaces, for matching keywords."""
    return _squash(re.sub(r"[*`#>]", "", line)).strip("_").strip()


_DIRECT = re.compile(
    r"(?:(?:answer|decision|classification|verdict|result|mode|output)\s*[:=\-–—]\s*)?"
    r"direct[\s.!:;]*",
    re.I,
)
_REFLECT = re.compile(r"\breflect(?:ion)?\s*[:=\-–—]?\s*(yes|no|true|false|y|n)\b", re.I)


def parse_analysis(text: str) -> tuple[bool, bool]:
    """(direct, reflect) from a Phase 1 answer; reflect is False when direct."""
    lines = [b for b in (_bare(x) for x in _strip_thinking(text).splitlines()) if b]
    if not lines:
        return False, False
    reflect: bool | None = None
    for line in lines:
        m = _REFLECT.search(line)
        if m:
            reflect = m.group(1).lower() in ("yes", "true", "y")
    direct = _DIRECT.fullmatch(lines[-1]) is not None or (
        reflect is None and _DIRECT.fullmatch(lines[0]) is not None
    )
    return direct, bool(reflect) and not direct


_REVIEW_HEAD = re.compile(
    r"^\s*(?:\d+[.)]\s*)?(critic|pragmatist|detailer|plan adjustments?)\s*[:\-–—]?\s*(.*)$", re.I
)


def review_sections(text: str) -> dict[str, str]:
    """The four review sections found in a Phase 2 answer (missing ones are absent)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in _strip_thinking(text).splitlines():
        m = _REVIEW_HEAD.match(_bare(line))
        if m:
            name = next(s for s in REVIEW_SECTIONS if m.group(1).lower().startswith(s.lower()))
            current = found.setdefault(name, [])
            if m.group(2).strip():
                current.append(m.group(2).strip())
        elif current is not None:
            current.append(line.rstrip())
    return {k: "\n".join(v).strip() for k, v in found.items()}


def _review_block(review: str) -> str:
    sections = review_sections(review)
    head = "## Review of the analysis (apply every Plan Adjustment)\n\n"
    if not sections:  # the model ignored the format: hand over what it said
        return head + _strip_thinking(review).strip()
    body = "\n\n".join(f"### {name}\n{sections.get(name) or '- none'}" for name in REVIEW_SECTIONS)
    return head + body


# ---------------------------------------------------------------- reading a plan

_NUMBERED = re.compile(
    r"^(?:[-*+•]\s+)?(?:#{1,6}\s*)?(?:\*\*|__)?\s*\(?"
    r"(?:(?P<word>step)\s*)?(?P<num>\d{1,3})(?!\d)(?:\*\*|__)?"
    r"(?:\s*[.):\]]|\s+[-–—]|(?(word)\s|(?!)))"
    r"(?:\*\*|__)?\s*(?P<body>.*)$",
    re.I,
)
_BULLET = re.compile(r"^[-*+•]\s+(?P<body>\S.*)$")
_SECTION = re.compile(
    r"^(?P<name>milestones|steps|plan steps|execution plan|numbered steps|step list|"
    r"action plan|the plan|plan)\s*(?P<colon>:)?\s*(?P<rest>.*)$",
    re.I,
)
_MILESTONE_LINE = re.compile(r"^milestone\s*(?:\d+|[a-z])?\s*[:.)\-–—]\s*(?P<text>\S.*)$", re.I)
_MILESTONE_PREFIX = re.compile(r"^(?:milestone\s*\d*|m\d+)\s*[:.)\-–—]\s*", re.I)
_COMPLEXITY = re.compile(r"^complexity(?:\s+level)?\s*[:=\-–—]\s*(?P<word>[a-z]+)", re.I)
_COMPLEXITY_WORDS = {
    "simple": "simple", "easy": "simple", "trivial": "simple", "low": "simple",
    "medium": "medium", "moderate": "medium", "intermediate": "medium",
    "complex": "complex", "hard": "complex", "high": "complex", "difficult": "complex",
    "autonomous": "autonomous",
}  # fmt: skip
_TARGET = r"[`'\"]?(?P<target>[A-Za-z_][\w.\-/]*)[`'\"]?"
# Tried in order; the first pattern that matches anywhere decides the executor.
_EXECUTORS = (
    re.compile(
        r"[\[(]?\s*executor\s*[:=]?\s*(?:(?P<kind>tool|agent)\b\s*[:=(]?\s*"
        + _TARGET
        + r"|(?P<other>[A-Za-z_]\w*))\s*[\])]?",
        re.I,
    ),
    re.compile(r"[\[(]?\s*\b(?P<kind>tool|agent)\s*[:=(]\s*" + _TARGET + r"\s*[\])]?", re.I),
    re.compile(r"\b(?-i:(?P<kind>TOOL|AGENT))\s+" + _TARGET, re.I),
    re.compile(r"[\[(]\s*(?P<other>(?i:self|agent)|[A-Z]{3,})\s*[\])]"),
    re.compile(r"\b(?P<other>SELF)\b"),
    re.compile(r"(?:[-–—|:→]|->|=>)\s*(?P<other>self)\s*\.?\s*$", re.I),
)
_EXECUTOR_LEAD = re.compile(r"^(?:executor|tool|agent|self)\b", re.I)
_EDGE_JUNK = " \t-–—:|,;→>=*"


@attrs.define
class _Draft:
    indent: int
    parts: list[str]
    in_steps: bool
    numbered: bool


def _executor(text: str) -> tuple[str, str | None, tuple[int, int] | None]:
    for pattern in _EXECUTORS:
        m = pattern.search(text)
        if m is None:
            continue
        groups = m.groupdict()
        kind, target = (groups.get("kind") or "").upper(), groups.get("target")
        target = target.rstrip(".-/") if target else None
        if kind in ("TOOL", "AGENT") and target:
            return kind, target, m.span()
        if kind == "AGENT" or (groups.get("other") or "").upper() == "AGENT":
            return "AGENT", None, m.span()
        return "SELF", None, m.span()  # SELF, an unknown word, or TOOL without a name
    return "SELF", None, None


def _tidy(text: str) -> str:
    text = re.sub(r"\(\s*\)|\[\s*\]", " ", _squash(text))
    text = _squash(text)
    text = re.sub(r"(?<=\s)([-–—|])(?:\s+[-–—|])+(?=\s|$)", r"\1", text)
    text = re.sub(r"^(?:step\s*\d{1,3}\s*[:.)\-–—]\s*)", "", text.strip(_EDGE_JUNK), flags=re.I)
    return text.strip(_EDGE_JUNK)


def _make_step(text: str, index: int) -> PlanStep | None:
    text = text.replace("**", "")
    executor, target, span = _executor(text)
    if span is not None:
        # The separator before the marker ("—", "->") and a lone period after it go too.
        head, tail = text[: span[0]].rstrip(_EDGE_JUNK), text[span[1] :]
        text = f"{head} {'' if tail.strip() == '.' else tail}"
    description = _tidy(text)
    if not description:
        return None
    return PlanStep(index=index, description=description, executor=executor, target=target)


def _add_milestone(milestones: list[str], text: str) -> None:
    cleaned = _tidy(_MILESTONE_PREFIX.sub("", text.replace("**", "").strip()))
    if cleaned:
        milestones.append(cleaned)


def parse_plan(text: str) -> tuple[tuple[PlanStep, ...], tuple[str, ...], str]:
    """(steps, milestones, complexity) from a Phase 3 answer; never raises on bad text.

    Steps under a ``Steps:`` heading win; without one, numbered lines anywhere outside
    the milestones count. Executors missing or unknown become SELF; steps are cut to
    `MAX_PLAN_STEPS` and renumbered 1..n.
    """
    complexity = ""
    milestones: list[str] = []
    drafts: list[_Draft] = []
    section: str | None = None  # "milestones" | "steps" | "other" | None
    current: _Draft | None = None
    for raw in _strip_thinking(text).expandtabs(4).splitlines():
        line = _squash(raw)
        if not line:
            continue
        indent = len(raw) - len(raw.lstrip())
        norm = _bare(line)
        if current is not None and indent > current.indent:
            current.parts.append(line)  # an indented detail or sub-item of a step
            continue
        m = _COMPLEXITY.match(norm)
        if m:
            complexity = complexity or _COMPLEXITY_WORDS.get(m.group("word").lower(), "")
            current = None
            continue
        numbered = _NUMBERED.match(line)
        item = numbered or _BULLET.match(line)
        if item is None:
            new_section, current = _classify_line(line, norm, current, milestones)
            section = new_section or section
            continue
        body = item.group("body")
        if section == "milestones":
            _add_milestone(milestones, body)
            current = None
        elif numbered or section == "steps" or _executor(body)[2] is not None:
            current = _Draft(indent, [body], section == "steps", numbered is not None)
            drafts.append(current)
        else:
            current = None
    chosen = _choose(drafts)
    steps: list[PlanStep] = []
    for draft in chosen:
        step = _make_step(" ".join(draft.parts), len(steps) + 1)
        if step is not None:
            steps.append(step)
        if len(steps) == MAX_PLAN_STEPS:
            break
    return tuple(steps), tuple(milestones[:MAX_MILESTONES]), complexity


def _classify_line(
    line: str, norm: str, current: _Draft | None, milestones: list[str]
) -> tuple[str | None, _Draft | None]:
    """A line that is not a list item: a heading, a milestone line, a detail, or prose.

    Returns the section it opens (None: unchanged) and the step that continues.
    """
    heading = line.startswith("#")
    m = _SECTION.match(norm)
    if m and (m.group("colon") or not m.group("rest") or heading):
        if m.group("name").lower() != "milestones":
            return "steps", None
        rest = m.group("rest").strip()
        for part in rest.split(";") if rest else ():
            _add_milestone(milestones, part)
        return "milestones", None
    m = _MILESTONE_LINE.match(norm)
    if m:  # "Milestone 1: Setup" heading a group of steps
        _add_milestone(milestones, m.group("text"))
        return "steps", None
    if current is not None and _EXECUTOR_LEAD.match(norm):
        current.parts.append(norm)  # "Executor: TOOL terminal" on its own line
        return None, current
    if heading or (norm.endswith(":") and len(norm) <= 60):
        return "other", None
    return None, None  # prose ends the current step


def _choose(drafts: list[_Draft]) -> list[_Draft]:
    groups = (
        [d for d in drafts if d.in_steps and d.numbered],
        [d for d in drafts if d.in_steps and not d.numbered],
        [d for d in drafts if not d.in_steps and d.numbered],
        [d for d in drafts if not d.in_steps and not d.numbered],
    )
    return next((g for g in groups if g), [])


# ---------------------------------------------------------------- the three phases


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
    on_phase: Callable[[PlanPhase], None] = lambda e: None,
) -> PlanResult:
    """Run Phase 1, then (maybe) Phase 2 and Phase 3. Errors and cancellation propagate."""
    if not message.strip():
        raise ValueError("planning needs a non-empty user message")
    values = {
        "request": message,
        "context": context_summary.strip() or "(no earlier conversation)",
        "tools": _bullets(tools, "(no tools)"),
        "profiles": _bullets(profiles, "(no sub-agent profiles)"),
        "analysis": "",
        "review": "",
    }

    on_phase(PlanPhase(phase="analysis", status="started"))
    analysis = await complete(_ask(prompts.analysis, values), "analysis")
    direct, reflect = parse_analysis(analysis)
    on_phase(PlanPhase(phase="analysis", status="done", detail=_analysis_detail(direct, reflect)))
    if direct and not profile.planning_mandatory:
        on_phase(PlanPhase(phase="review", status="skipped", detail="direct"))
        on_phase(PlanPhase(phase="plan", status="skipped", detail="direct"))
        return PlanResult(direct=True, analysis=analysis, reflect=False, review=None, text="")
    values["analysis"] = _FORCED_NOTE if direct else _strip_thinking(analysis).strip()

    review: str | None = None
    if profile.planning_phase2_enabled and reflect:
        on_phase(PlanPhase(phase="review", status="started"))
        review = await complete(_ask(prompts.review, values), "review")
        values["review"] = _review_block(review)
        on_phase(PlanPhase(phase="review", status="done"))
    else:
        why = "no reflection asked" if profile.planning_phase2_enabled else "phase 2 disabled"
        on_phase(PlanPhase(phase="review", status="skipped", detail=why))

    on_phase(PlanPhase(phase="plan", status="started"))
    text = await complete(_ask(prompts.plan, values), "plan")
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
