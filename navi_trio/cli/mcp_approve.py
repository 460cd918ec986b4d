"""Approvals over MCP: `navi mcp serve` asks its client, through elicitation, about a
tool call that needs an approval.

The form offers allow once, allow for the session, or deny. A decline, a cancel, a
failed elicitation or no answer within the approval's timeout is a deny, with a note
in the answer; a client without elicitation is denied too: nobody could answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import trio
from mcp.server.mcpserver import Context
from mcp_types import ClientCapabilities, ElicitationCapability
from mcp_types.version import is_version_at_least
from pydantic import BaseModel, Field

from navi_trio.approval_text import grant_line, part_lines
from navi_trio.cli.mcp_ask import AskFeed, cut
from navi_trio.wire import Frame

ANSWERS = ("allow_once", "allow_session", "deny")
QUESTION_MAX = 4000  # characters of the form's message
LINE_MAX = 500  # characters of one line of it
DEFAULT_TIMEOUT = 300.0  # seconds, when a request names none

# The client's answer to one question: one of ANSWERS.
Asker = Callable[[str], Awaitable[str]]


class ApprovalAnswer(BaseModel):
    answer: Literal["allow_once", "allow_session", "deny"] = Field(
        description="allow_once: run this call; allow_session: run it and what the "
        "question says the session grant covers; deny: do not run it"
    )


NO_ELICITATION = "the client has no elicitation"
# The first protocol version whose calls ask their client in "input required" rounds.
ROUNDS_VERSION = "2026-07-28"


def in_rounds(ctx: Context[Any, Any]) -> bool:
    """Whether `ctx`'s client is asked in "input required" rounds: it declared elicitation,
    and its protocol takes no request during a call."""
    session = ctx.request_context.session
    version = ctx.request_context.protocol_version
    wanted = ClientCapabilities(elicitation=ElicitationCapability())
    return (
        session.check_client_capability(wanted)
        and not session.can_send_request
        and version is not None
        and is_version_at_least(version, ROUNDS_VERSION)
    )


def elicitor(ctx: Context[Any, Any]) -> Asker | str:
    """How to ask the client of `ctx`'s request during the call, or why it cannot be
    asked: it declared no elicitation, or its transport lets a server send no request
    during a call (a client on the 2026-07-28 protocol is asked in rounds: `in_rounds`)."""
    session = ctx.request_context.session
    wanted = ClientCapabilities(elicitation=ElicitationCapability())
    if not session.check_client_capability(wanted):
        return NO_ELICITATION
    if not session.can_send_request:
        version = ctx.request_context.protocol_version
        return f"its protocol version {version} takes no request during a call"

    async def ask(message: str) -> str:
        result = await ctx.elicit(message, ApprovalAnswer)
        if result.action == "accept":
            return result.data.answer
        return "deny"

    return ask


def question(frame: Frame) -> str:
    """The form's message: the call, why it asks, its parts, what a session grant is."""
    lines = [
        f"navi wants to run {frame.get('tool', '?')}: {frame.get('summary', '')}",
        f"It asks because: {frame.get('rule', '')}",
    ]
    lines += part_lines(frame)
    grant = grant_line(frame, '"allow_session"')
    lines += [grant] if grant else []
    text = "\n".join(cut(line, LINE_MAX) for line in lines)
    return text if len(text) <= QUESTION_MAX else text[: QUESTION_MAX - 1] + "…"


def approver(
    feed: AskFeed, asker: Asker | str = NO_ELICITATION
) -> Callable[[Frame], Awaitable[tuple[bool, str]]]:
    """The answer to each approval request of one `ask`: the client's, through `asker`
    (a string: why it cannot be asked); a deny with a note in the answer when it cannot
    or does not answer in time."""

    async def decide(frame: Frame) -> tuple[bool, str]:
        tool, summary = frame.get("tool", "?"), cut(str(frame.get("summary", "")), 200)
        denied = f"denied {tool} ({summary})"
        if isinstance(asker, str):
            feed.note(
                f"{denied}: it needs approval ({frame.get('rule', '')}) and nobody can "
                f"approve it over MCP ({asker}); allow it with a rule, or use `navi chat`"
            )
            return False, "once"
        timeout = frame.get("timeout_sec")
        limit = float(timeout) if isinstance(timeout, int | float) and timeout > 0 else 0.0
        answer: str | None = None
        with trio.move_on_after(limit or DEFAULT_TIMEOUT):
            try:
                answer = await asker(question(frame))
            except Exception as exc:  # the client's error, a bad form: nothing approved
                feed.note(f"{denied}: asking the MCP client failed ({cut(str(exc), 200)})")
                return False, "once"
        if answer is None:
            feed.note(
                f"{denied}: the MCP client did not answer within {limit or DEFAULT_TIMEOUT:g} s"
            )
            return False, "once"
        if answer not in ("allow_once", "allow_session"):
            feed.note(f"{denied}: the MCP client denied it")
            return False, "once"
        return True, "session" if answer == "allow_session" else "once"

    return decide
