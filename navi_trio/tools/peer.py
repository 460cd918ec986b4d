"""peer: ask another navi daemon (config ``peers``) and return its answer.

The message runs in a session of the peer (new unless ``session`` names one) and the
peer's final answer comes back with its session id, so the model can continue it. The
peer's text (coalesced) and tool cards stream as this call's tool events. Leaving
before the peer's run ended — our stop, a cancel, the timeout — sends ``stop`` to the
peer. Every failure names the peer and the cause; the token appears in none of them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import attrs
import trio

from navi_trio.errors import ConfigError, ToolInputError
from navi_trio.errors import PeerError as PeerError
from navi_trio.errors import PeerRefusedError as PeerRefusedError
from navi_trio.errors import PeerUnreachableError as PeerUnreachableError
from navi_trio.profiles import PeerConfig
from navi_trio.tools.args import action_schema, arg, parse_action
from navi_trio.tools.base import ToolContext, ToolResult, cap_text

Frame = dict[str, Any]
CARD_STATUS_MAX = 120  # characters of a peer tool's error shown on its card


class PeerRun(Protocol):
    """One message's run on the peer, as `PeerLink.ask` yields it."""

    @property
    def session_id(self) -> str: ...
    @property
    def created(self) -> bool: ...

    async def receive(self) -> Frame:
        """The next session frame of this run (the last is its top-level stream_end)."""
        ...


class PeerLink(Protocol):
    def ask(
        self,
        url: str,
        token: str,
        message: str,
        *,
        session_id: str | None,
        profile: str | None,
        trace: Mapping[str, str] | None = None,
    ) -> AbstractAsyncContextManager[PeerRun]:
        """Connect, hello, send the message (with `trace`, the calling span's W3C trace
        context, when tracing); leaving before the run ended stops it."""
        ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve `ask` until cancelled (the runtime starts it in its nursery)."""
        ...


class _Feed:
    """The peer's live view: text coalesced and rate-limited, tool cards in order."""

    def __init__(self, ctx: ToolContext, peer: str) -> None:
        self._emit = ctx.emit
        self._peer = peer
        self._interval = ctx.settings.tool_progress_interval_sec
        self._max = max(ctx.settings.tool_progress_max_chars, 1)
        self.limit = ctx.settings.tool_output_max_chars
        self._text: list[str] = []
        self._chars = 0
        self._ready = trio.Event()
        self.answer = ""  # the top-level text so far, newest `limit` characters

    def text(self, delta: str) -> None:
        self.answer = (self.answer + delta)[-self.limit :]
        self._text.append(delta)
        self._chars += len(delta)
        self._ready.set()

    def card(self, data: dict[str, Any]) -> None:
        self.flush()
        self._emit({"peer": self._peer, **data})

    def flush(self) -> None:
        if not self._text:
            return
        text = "".join(self._text)
        self._text.clear()
        self._chars = 0
        dropped = max(len(text) - self._max, 0)
        self._emit(
            {"peer": self._peer, "stream": "text", "text": text[dropped:], "dropped_chars": dropped}
        )

    async def run(self) -> None:
        """At most one text event per interval, until cancelled (then `flush`)."""
        while True:
            await self._ready.wait()
            self._ready = trio.Event()
            self.flush()
            await trio.sleep(self._interval)


def _forward(frame: Frame, feed: _Feed, peer: str) -> str | None:
    """Show one peer frame; an error frame's message is returned (the run failed)."""
    kind = frame.get("type")
    sub = bool(frame.get("is_subagent"))
    if kind == "text_delta" and not sub:
        feed.text(str(frame.get("text", "")))
    elif kind == "tool_started":
        tool = str(frame.get("name", "?"))
        feed.card(
            {"event": "tool_started", "tool": tool, "subagent": sub, "text": f"{peer} ▶ {tool}"}
        )
    elif kind == "tool_result":
        tool = str(frame.get("name", "?"))
        ok = bool(frame.get("ok"))
        status = "ok" if ok else f"failed: {frame.get('error') or ''}"[:CARD_STATUS_MAX]
        feed.card(
            {
                "event": "tool_result",
                "tool": tool,
                "ok": ok,
                "status": status,
                "subagent": sub,
                "text": f"{peer} ⎿ {tool}: {status}",
            }
        )
    elif kind == "error" and not sub:
        message = str(frame.get("message", ""))
        feed.card({"event": "error", "code": frame.get("code"), "text": f"{peer} ✖ {message}"})
        return message
    return None


@attrs.frozen(kw_only=True)
class AskArgs:
    peer: str = arg("The peer's name in the config.")
    message: str = arg("What to ask; it sees nothing else.")
    session: str | None = arg("A peer session id to continue.", default=None)
    profile: str | None = arg("The peer's profile (new sessions).", default=None)
    # Clamped to 1..the peer's timeout_sec by the tool, not refused.
    timeout: float | None = arg("Seconds to wait.", default=None, extra={"minimum": 1})


class PeerTool:
    name = "peer"
    description = (
        "Ask another navi daemon (a peer named in the config) to run a message in a "
        "session of its own, and get its final answer. action 'ask' with `peer` and "
        "`message`; `session` continues a peer session (its id comes with every answer). "
        "The peer works with its own files and tools. Manual: read `manual:peer` with the "
        "filesystem tool."
    )
    parameters = action_schema({"ask": AskArgs})

    def __init__(self, link: PeerLink, environ: Mapping[str, str] | None = None) -> None:
        self.link = link
        self._environ = environ

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            _, asked = parse_action({"ask": AskArgs}, args)
            name, message = asked.peer, asked.message
            session, profile = asked.session, asked.profile
            peer = _peer(ctx, name)
            wanted = peer.timeout_sec if asked.timeout is None else asked.timeout
            timeout = min(max(wanted, 1.0), peer.timeout_sec)
            token = peer.resolve_token(name, os.environ if self._environ is None else self._environ)
        except (ToolInputError, ConfigError) as exc:
            return ToolResult.fail(str(exc))
        feed = _Feed(ctx, name)
        where = f"peer {name!r} ({peer.url})"
        run: PeerRun | None = None
        try:
            with trio.move_on_after(timeout) as waited:
                async with self.link.ask(
                    peer.url,
                    token,
                    message,
                    session_id=session,
                    profile=profile,
                    trace=ctx.trace_context(ctx.call_id, self.name) or None,
                ) as run:
                    feed.card(
                        {
                            "event": "asked",
                            "session": run.session_id,
                            "text": f"asked {name} (session {run.session_id})",
                        }
                    )
                    end, error = await _follow(run, feed, name)
        except PeerRefusedError as exc:
            if exc.code == "unauthorized":
                why = f"refused the token of peers.{name} (fix it in the config or env): {exc}"
            else:
                why = f"refused the request: {exc}"
            return ToolResult.fail(f"{where} {why}", peer=name)
        except PeerError as exc:
            extra = {} if run is None else {"session_id": run.session_id}
            return ToolResult.fail(f"{where}: {exc}", output=feed.answer, peer=name, **extra)
        finally:
            feed.flush()
        data: dict[str, Any] = {"peer": name}
        if run is not None:
            data.update(session_id=run.session_id, created=run.created)
        if waited.cancelled_caught:
            state = "its run was stopped" if run is not None else "it never took the message"
            return ToolResult.fail(
                f"no answer from {where} within {timeout:g} s; {state}",
                output=feed.answer,
                **data,
            )
        assert run is not None
        return _outcome(end, error, feed, name, data)


def _peer(ctx: ToolContext, name: str) -> PeerConfig:
    peers = ctx.config.peers
    if name in peers:
        return peers[name]
    if not peers:
        raise ToolInputError(
            'no peers are configured: add a "peers" section to config.json (name -> url '
            "and token_env) to ask another navi daemon"
        )
    raise ToolInputError(f"unknown peer {name!r}; peers: {', '.join(sorted(peers))}")


async def _follow(run: PeerRun, feed: _Feed, peer: str) -> tuple[Frame, str | None]:
    """Forward the run's frames until its top-level stream_end; (that frame, last error)."""
    error: str | None = None
    failure: PeerError | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed.run)
        try:
            while True:
                frame = await run.receive()
                if frame.get("type") == "stream_end" and not frame.get("is_subagent"):
                    break
                error = _forward(frame, feed, peer) or error
        except PeerError as exc:  # raised past the nursery, not wrapped in a group
            failure = exc
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return frame, error


def _outcome(
    end: Frame, error: str | None, feed: _Feed, name: str, data: dict[str, Any]
) -> ToolResult:
    reason = str(end.get("reason", "complete"))
    text = str(end.get("text") or feed.answer)
    data["reason"] = reason
    sid = data["session_id"]
    if reason in ("complete", "max_iterations"):
        note = f'\n\n[peer {name}, session {sid}: pass "session": "{sid}" to continue it]'
        cut = cap_text(text, feed.limit)
        return ToolResult.success(cut + note, **data)
    if reason == "stopped":
        why = "the peer's run was stopped before it finished"
    else:
        why = f"the peer's run failed ({reason})" + (f": {error}" if error else "")
    return ToolResult.fail(f"peer {name!r}, session {sid}: {why}", output=text, **data)
