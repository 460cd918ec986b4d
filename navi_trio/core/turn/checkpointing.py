"""A checkpoint before the first writing call of a round, and their keeping.

When one of a round's calls may change files (`may_write`), the run's writable folders
are snapshotted once, before any of them runs; a denied call takes none, and only a
run of a session snapshots. Each writing call runs inside `calling`, so a rewind puts
back only what the session itself changed. A skipped or partial snapshot says why in a
warning; a Stop during a snapshot abandons it and the calls do not run.

A snapshot may add only the room the user's and everyone's totals leave (`Room`),
reserved while it runs, since snapshots of one user's sessions run at once. After each
new checkpoint the session's are pruned off the call's path; the newest pruned one's
time is kept so a rewind to an older message is refused, not restored wrong.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from navi_trio.actor import NurseryHolder
from navi_trio.core.checkpoints import (
    CheckpointEngine,
    CheckpointError,
    Created,
    Outcome,
    Room,
    Skipped,
    size_text,
)
from navi_trio.core.turn.policy import FILE_WRITES, CallFacts, decide
from navi_trio.errors import RootChangedError
from navi_trio.events import AgentEvent, CheckpointCreated, WarningEvent
from navi_trio.llm.base import ToolCall
from navi_trio.profiles import MCP_PREFIX
from navi_trio.store.base import SessionRow
from navi_trio.tools.base import ToolContext, ToolRegistry
from navi_trio.tools.private import private_paths

log = logging.getLogger(__name__)

Publish = Callable[[AgentEvent], None]

TERMINAL_WRITES = ("run", "open", "write")
WRITERS = ("code_exec", "spawn_agent")
LABEL_MAX = 200
LEFT_OUT_SHOWN = 3
PRUNED_SCOPE = "checkpoints"  # kv (scope, session id) -> {"pruned_until": seconds}


class KV(Protocol):
    async def kv_get(self, scope: str, key: str) -> Any | None: ...
    async def kv_set(self, scope: str, key: str, value: Any) -> None: ...
    async def list_sessions(self, user_id: str | None = None) -> list[SessionRow]: ...


def created_at(checkpoint_id: str) -> float:
    """When a checkpoint was made, from its id (nanoseconds in its first 16 digits)."""
    return int(checkpoint_id[:16], 16) / 1e9


def may_write(call: ToolCall, registry: ToolRegistry, allowed: Sequence[str], mode: str) -> bool:
    """Whether `call` may change files in the writable folders (see the module's list)."""
    if call.parse_error is not None or call.name not in allowed:
        return False
    tool = registry.get(call.name)
    if tool is None:
        return False
    action = call.arguments.get("action")
    if call.name == "filesystem":
        return action in FILE_WRITES
    if call.name in ("terminal", "code_exec"):
        wanted = call.name == "code_exec" or action in TERMINAL_WRITES
        return wanted and mode != "read-only"
    if call.name in WRITERS:
        return True
    # An MCP server's tool (another program): unless its server is marked read-only.
    return call.name.startswith(MCP_PREFIX) and not getattr(tool, "read_only", False)


def round_label(calls: Sequence[ToolCall]) -> str:
    """What a checkpoint comes before, readable: ``before filesystem write, terminal run``."""
    names = []
    for call in calls:
        action = call.arguments.get("action")
        name = f"{call.name} {action}" if isinstance(action, str) and action else call.name
        if name not in names:
            names.append(name)
    text = "before " + ", ".join(names)
    return text if len(text) <= LABEL_MAX else text[: LABEL_MAX - 1] + "…"


class RoundCheckpoints(NurseryHolder):
    """The executor's checkpoints (a nursery-holding actor: it prunes in its own)."""

    def __init__(self, engine: CheckpointEngine, kv: KV) -> None:
        self.engine = engine
        self.kv = kv
        self._pruning: set[str] = set()
        self._again: set[str] = set()  # a checkpoint came while its session was pruned
        self._pruned = trio.Event()  # set when no pruning is under way
        self._pruned.set()
        # What the snapshots running now may still store, per user: spent, for the
        # others' room, until each ends (and what it stored is counted instead). The
        # lock makes reading the store's count and reserving one step, and a release
        # waits for it, so no snapshot counts what another stored neither way nor both.
        self._reserved: dict[str, int] = {}
        self._room_lock = trio.Lock()

    @staticmethod
    def writing(
        calls: Sequence[ToolCall], ctx: ToolContext, registry: ToolRegistry, allowed: Sequence[str]
    ) -> list[ToolCall]:
        """The calls of `calls` that may change the run's folders and that the policy does
        not deny (a denied call never runs); none for a run of no session."""
        if not ctx.can_detach:  # a sub-agent of no session: nothing to rewind
            return []
        return [
            c
            for c in calls
            if may_write(c, registry, allowed, ctx.mode)
            and decide(
                ctx.profile,
                ctx.user_role,
                ctx.mode,
                CallFacts.of(c.name, c.arguments, ctx.roots(), ctx.cwd),
            ).decision
            != "deny"
        ]

    @asynccontextmanager
    async def calling(
        self, call: ToolCall, ctx: ToolContext, registry: ToolRegistry, allowed: Sequence[str]
    ) -> AsyncIterator[None]:
        """Around one call that runs: when it may write, what changes in the run's folders
        meanwhile is marked as the session's own (a rewind puts it back)."""
        if not self.writing([call], ctx, registry, allowed):
            yield
            return
        try:
            roots = await trio.to_thread.run_sync(ctx.call_roots)
        except (OSError, RootChangedError):
            yield
            return
        try:
            try:
                held = list({r.path: r for r in roots.all()}.values())
            except RootChangedError:
                held = []  # the call fails with it; nothing of it is in the folders
            private = private_paths(ctx.settings, ctx.session_dir, config=ctx.config)
            async with self.engine.calling(ctx.session_id, held, private=private):
                yield
        finally:
            roots.close()

    async def before_round(
        self,
        calls: Sequence[ToolCall],
        ctx: ToolContext,
        registry: ToolRegistry,
        allowed: Sequence[str],
        publish: Publish,
    ) -> bool:
        """Snapshot the writable folders once when a call of the round may write;
        whether it did (and so waited)."""
        writing = self.writing(calls, ctx, registry, allowed)
        if not writing:
            return False
        label = round_label(writing)
        roots = await trio.to_thread.run_sync(ctx.call_roots)
        try:
            # The folders the run holds, as the sandbox binds them: never by path again.
            held = list({r.path: r for r in roots.all()}.values())
            private = private_paths(ctx.settings, ctx.session_dir, config=ctx.config)
            async with self._reserving(ctx) as room:
                outcome = await self.engine.snapshot(
                    ctx.session_id,
                    held,
                    private=private,
                    label=label,
                    room=room,
                    namespace=ctx.user_id,
                )
        except (CheckpointError, OSError, RootChangedError) as exc:
            outcome = Skipped("unreadable", str(exc), 0.0)
        finally:
            roots.close()
        self._say(outcome, label, publish)
        if isinstance(outcome, Created) and not outcome.reused:
            self.prune_soon(ctx.session_id)
        return True

    @asynccontextmanager
    async def _reserving(self, ctx: ToolContext) -> AsyncIterator[Room]:
        """The room of one snapshot (`_room`), reserved for as long as it runs: as much
        as it may store (the room, at most NAVI_CHECKPOINT_MAX_BYTES)."""
        async with self._room_lock:
            room = await self._room(ctx)
            amount = max(0, min(room.bytes, ctx.settings.checkpoint_max_bytes))
            self._reserved[ctx.user_id] = self._reserved.get(ctx.user_id, 0) + amount
        try:
            yield room
        finally:
            with trio.CancelScope(shield=True):  # a stopped snapshot still gives it back
                async with self._room_lock:
                    left = self._reserved.get(ctx.user_id, 0) - amount
                    if left > 0:
                        self._reserved[ctx.user_id] = left
                    else:
                        self._reserved.pop(ctx.user_id, None)

    async def _room(self, ctx: ToolContext) -> Room:
        """What the nearer total leaves for this snapshot: the user's (their sessions'
        kept checkpoints, and what their running snapshots reserved) or everyone's."""
        s = ctx.settings
        mine = [row.id for row in await self.kv.list_sessions(ctx.user_id)]
        used = await self.engine.stored_bytes([ctx.session_id, *mine])
        used += self._reserved.get(ctx.user_id, 0)
        user = Room(
            s.checkpoint_user_max_bytes - used,
            "user_total",
            f"what NAVI_CHECKPOINT_USER_MAX_BYTES={size_text(s.checkpoint_user_max_bytes)}"
            " leaves for this user's checkpoints",
        )
        used = await self.engine.stored_bytes(None) + sum(self._reserved.values())
        total = Room(
            s.checkpoint_total_max_bytes - used,
            "total",
            f"what NAVI_CHECKPOINT_TOTAL_MAX_BYTES={size_text(s.checkpoint_total_max_bytes)}"
            " leaves for all checkpoints",
        )
        return min(user, total, key=lambda r: r.bytes)

    def _say(self, outcome: Outcome, label: str, publish: Publish) -> None:
        if isinstance(outcome, Skipped):
            if outcome.code != "off":
                publish(
                    WarningEvent(
                        message=f"no checkpoint {label}: {outcome.reason}; the calls run, "
                        "and what they change cannot be rewound",
                        code="checkpoint_skipped",
                    )
                )
            return
        info = outcome.checkpoint
        publish(
            CheckpointCreated(
                checkpoint_id=info.id,
                label=label,
                files=info.files,
                changed=info.changed,
                bytes=info.bytes,
                new_bytes=info.new_bytes,
                duration_ms=int(outcome.seconds * 1000),
                reused=outcome.reused,
            )
        )
        if info.left_out and not outcome.reused:
            shown = "; ".join(
                f"{x.path} ({x.size} bytes: {x.reason})" for x in info.left_out[:LEFT_OUT_SHOWN]
            )
            more = len(info.left_out) - LEFT_OUT_SHOWN
            publish(
                WarningEvent(
                    message=f"checkpoint {info.id} holds no copy of {len(info.left_out)} "
                    f"file(s), which a rewind leaves as they are: {shown}"
                    + (f" and {more} more" if more > 0 else ""),
                    code="checkpoint_left_out",
                )
            )

    def prune_soon(self, session_id: str) -> None:
        """Prune the session's checkpoints in the background (once at a time: one asked
        for meanwhile runs again after it)."""
        if not self.running:
            return
        if session_id in self._pruning:
            self._again.add(session_id)
            return
        self._pruning.add(session_id)
        if self._pruned.is_set():
            self._pruned = trio.Event()
        self.nursery.start_soon(self._prune, session_id)

    async def wait_pruned(self) -> None:
        """Until the pruning under way (if any) has ended."""
        await self._pruned.wait()

    async def _prune(self, session_id: str) -> None:
        try:
            while True:
                dropped = await self.engine.prune(session_id)
                if dropped:
                    newest = max(created_at(i) for i in dropped)
                    kept = await self.kv.kv_get(PRUNED_SCOPE, session_id) or {}
                    until = max(newest, float(kept.get("pruned_until", 0.0)))
                    await self.kv.kv_set(PRUNED_SCOPE, session_id, {"pruned_until": until})
                if session_id not in self._again:
                    break
                self._again.discard(session_id)
        except Exception as exc:  # noqa: BLE001 - keeping is best effort: the next one retries
            log.warning("pruning the checkpoints of session %s failed: %s", session_id, exc)
        finally:
            self._pruning.discard(session_id)
            if not self._pruning:
                self._pruned.set()
