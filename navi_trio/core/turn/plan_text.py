"""Reading what the planning model wrote: the analysis verdict, the review sections, the plan.

Pure text functions, no model calls: `parse_analysis` (Phase 1), `review_sections`
(Phase 2), `parse_plan` (Phase 3), and `is_casual` with its table of greetings and
thanks. The parsers forgive on purpose: models number, bold and bracket their lists in
every style, and a plan read imperfectly is worth more than a plan thrown away.
"""

from __future__ import annotations

import re

import attrs

from navi_trio.events import PlanStep
from navi_trio.patterns import LazyPattern

MAX_PLAN_STEPS = 15
MAX_MILESTONES = 10
REVIEW_SECTIONS = ("Critic", "Pragmatist", "Detailer", "Plan Adjustments")


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


_THINK_CLOSE = LazyPattern(r"</think(?:ing)?>", re.I)


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


_DIRECT = LazyPattern(
    r"(?:(?:answer|decision|classification|verdict|result|mode|output)\s*[:=\-–—]\s*)?"
    r"direct[\s.!:;]*",
    re.I,
)
_REFLECT = LazyPattern(r"\breflect(?:ion)?\s*[:=\-–—]?\s*(yes|no|true|false|y|n)\b", re.I)


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


_REVIEW_HEAD = LazyPattern(
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


_NUMBERED = LazyPattern(
    r"^(?:[-*+•]\s+)?(?:#{1,6}\s*)?(?:\*\*|__)?\s*\(?"
    r"(?:(?P<word>step)\s*)?(?P<num>\d{1,3})(?!\d)(?:\*\*|__)?"
    r"(?:\s*[.):\]]|\s+[-–—]|(?(word)\s|(?!)))"
    r"(?:\*\*|__)?\s*(?P<body>.*)$",
    re.I,
)
_BULLET = LazyPattern(r"^[-*+•]\s+(?P<body>\S.*)$")
_SECTION = LazyPattern(
    r"^(?P<name>milestones|steps|plan steps|execution plan|numbered steps|step list|"
    r"action plan|the plan|plan)\s*(?P<colon>:)?\s*(?P<rest>.*)$",
    re.I,
)
_MILESTONE_LINE = LazyPattern(r"^milestone\s*(?:\d+|[a-z])?\s*[:.)\-–—]\s*(?P<text>\S.*)$", re.I)
_MILESTONE_PREFIX = LazyPattern(r"^(?:milestone\s*\d*|m\d+)\s*[:.)\-–—]\s*", re.I)
_COMPLEXITY = LazyPattern(r"^complexity(?:\s+level)?\s*[:=\-–—]\s*(?P<word>[a-z]+)", re.I)
_COMPLEXITY_WORDS = {
    "simple": "simple",
    "easy": "simple",
    "trivial": "simple",
    "low": "simple",
    "medium": "medium",
    "moderate": "medium",
    "intermediate": "medium",
    "complex": "complex",
    "hard": "complex",
    "high": "complex",
    "difficult": "complex",
    "autonomous": "autonomous",
}
_TARGET = r"[`'\"]?(?P<target>[A-Za-z_][\w.\-/]*)[`'\"]?"
# Tried in order; the first pattern that matches anywhere decides the executor.
_EXECUTORS = (
    LazyPattern(
        r"[\[(]?\s*executor\s*[:=]?\s*(?:(?P<kind>tool|agent)\b\s*[:=(]?\s*"
        + _TARGET
        + r"|(?P<other>[A-Za-z_]\w*))\s*[\])]?",
        re.I,
    ),
    LazyPattern(r"[\[(]?\s*\b(?P<kind>tool|agent)\s*[:=(]\s*" + _TARGET + r"\s*[\])]?", re.I),
    LazyPattern(r"\b(?-i:(?P<kind>TOOL|AGENT))\s+" + _TARGET, re.I),
    LazyPattern(r"[\[(]\s*(?P<other>(?i:self|agent)|[A-Z]{3,})\s*[\])]"),
    LazyPattern(r"\b(?P<other>SELF)\b"),
    LazyPattern(r"(?:[-–—|:→]|->|=>)\s*(?P<other>self)\s*\.?\s*$", re.I),
)
_EXECUTOR_LEAD = LazyPattern(r"^(?:executor|tool|agent|self)\b", re.I)
# What makes a marker an executor tag and not a word in brackets ("(API)").
_TAG_WORD = LazyPattern(r"\b(?:executor|tool|agent|self)\b", re.I)
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


def _is_tagged(text: str) -> bool:
    """True when `text` names its executor (TOOL/AGENT/SELF/executor), not just "(API)"."""
    plain = text.replace("**", "")
    span = _executor(plain)[2]
    return span is not None and _TAG_WORD.search(plain[span[0] : span[1]]) is not None


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

    Steps under a ``Steps:`` heading win, else numbered lines outside the milestones; a
    line with an executor tag is a step even right after them. Missing or unknown executors
    become SELF; steps are cut to `MAX_PLAN_STEPS` and renumbered."""
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
        if section == "milestones" and numbered and _is_tagged(body):
            # A numbered line with an executor tag is a step wherever it stands: the
            # model wrote its milestones inline or as bullets and went on without a
            # "Steps:" heading. What follows is steps too.
            section = "steps"
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
    """A line that is not a list item (heading, milestones, detail, prose): the section it
    opens (None: unchanged) and the step that continues."""
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
