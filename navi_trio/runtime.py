"""Wiring: the runtime that owns every long-lived actor.

    async with open_runtime(settings) as rt:
        actor = await rt.sessions.get("s-1")
        actor.send_message("hello")

The root nursery holds, in start order: the process pool (persistent processes of
``terminal open``), the peer tool's link (its connections to other daemons), the MCP
servers (each started when a run first needs it; their tools reach runs through the
tool registry), the waker (finished jobs' notes, core/wake.py), the TaskSupervisor
(background jobs), the session registry (session actors and their runs) and, in the
daemon, the scheduler (scheduled runs, core/schedules.py). Leaving the block cancels
them all: runs are stopped (their clean-up is shielded), background jobs end (their
running markers stay, so the next start reports them as lost), and every process group
is killed. The store closes last, after every queued write has landed.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import trio

from navi_trio.api.peer_link import WsPeerLink
from navi_trio.api.protocol import event_frame, resync_frame
from navi_trio.core.agent import Agent
from navi_trio.core.approvals import ApprovalBroker
from navi_trio.core.notices import UserNotices
from navi_trio.core.schedules import Scheduler, notify_schedule_run
from navi_trio.core.session_registry import SessionRegistry
from navi_trio.core.session_service import SessionService
from navi_trio.core.task_supervisor import TaskSupervisor
from navi_trio.core.wake import Waker
from navi_trio.events import TaskUpdate
from navi_trio.llm.base import LLMBackend
from navi_trio.llm.factory import make_backend, make_client
from navi_trio.profiles import BUILTIN_TOOL_NAMES, ConfigSource
from navi_trio.settings import Settings
from navi_trio.store.base import SessionStore
from navi_trio.store.factory import open_store
from navi_trio.tools.base import Tool, ToolRegistry
from navi_trio.tools.builtin import builtin_tools
from navi_trio.tools.mcp import McpServers
from navi_trio.tools.peer import PeerTool
from navi_trio.tools.procs import ProcessPool
from navi_trio.tools.sandbox import sandbox_available
from navi_trio.tools.spawn_agent import SpawnAgentTool
from navi_trio.tools.tasks import TasksTool


@attrs.define(eq=False)
class Runtime:
    settings: Settings
    config: ConfigSource
    store: SessionStore
    backend: LLMBackend
    registry: ToolRegistry
    processes: ProcessPool
    mcp: McpServers
    supervisor: TaskSupervisor
    approvals: ApprovalBroker
    agent: Agent
    sessions: SessionRegistry
    session_service: SessionService
    nursery: trio.Nursery
    scheduler: Scheduler
    notices: UserNotices


def freeze_start_up_objects() -> None:
    """Leave what start-up made (modules, classes, functions, config: tens of thousands
    of objects that live as long as the process) out of every later garbage collection.

    A full collection walks every tracked object: without this, each one in a long tool
    loop costs ~15-20 ms, nearly all of it start-up objects. Done once per process (the
    first runtime; `gc.freeze` is process-wide), without a collection first: start-up
    leaves little cyclic garbage, and collecting it would cost the start-up path that
    full pass.
    """
    if gc.get_freeze_count() == 0:
        gc.freeze()


def default_tools(settings: Settings) -> list[Tool]:
    return [*builtin_tools(settings), TasksTool(), SpawnAgentTool(), PeerTool(WsPeerLink())]


@asynccontextmanager
async def open_runtime(
    settings: Settings,
    *,
    backend: LLMBackend | None = None,
    config: ConfigSource | None = None,
    tools: list[Tool] | None = None,
    schedules: bool = False,
    wall_clock: Callable[[], float] = time.time,
) -> AsyncIterator[Runtime]:
    """Open the store, the LLM backend and every actor; close them all on exit.

    `schedules`: run due schedules (the daemon does; an embedded `navi run` does not);
    `wall_clock` is their clock (a test passes one on trio's virtual time)."""
    config = config or ConfigSource(settings.config_path)
    tools = tools if tools is not None else default_tools(settings)
    # Refuse a config naming a tool nobody provides or lacking a prompt file, before
    # anything opens (and before a user message could be saved).
    config.require(BUILTIN_TOOL_NAMES | {t.name for t in tools})
    # Sandboxed modes (the default) need bwrap: say so now, not at the first command.
    ok, reason = await trio.to_thread.run_sync(sandbox_available, settings.bwrap_path)
    if not ok:
        logging.getLogger(__name__).warning(
            "the sandbox is unavailable, so sandboxed terminal and code_exec calls will be "
            "refused: %s",
            reason,
        )
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store(settings))
        if backend is None:
            client = await stack.enter_async_context(make_client(settings))
            backend = make_backend(settings, client)
        async with trio.open_nursery() as nursery:
            registry = ToolRegistry(tools)
            processes = ProcessPool()
            await nursery.start(processes.run)
            for tool in tools:  # the peer tool's connections live in the runtime's nursery
                if isinstance(tool, PeerTool):
                    await nursery.start(tool.link.run)
            mcp = McpServers(lambda: config.current)
            await nursery.start(mcp.run)
            registry.add_source(mcp)
            # The supervisor starts first (the agent needs it), the session registry
            # last (it needs the agent): task updates reach it through this closure.
            sessions: SessionRegistry | None = None

            def publish(session_id: str, event: TaskUpdate) -> None:
                if sessions is not None:
                    sessions.publish_task_update(session_id, event)

            # Finished jobs' notes, and the turns they start (wake_on_task_done).
            waker = Waker(store, settings, lambda: config.current, lambda: sessions)
            await nursery.start(waker.run)
            supervisor = TaskSupervisor(settings, store, publish, notes=waker)
            await nursery.start(supervisor.run)

            def attached(session_id: str) -> bool:
                return sessions is not None and sessions.attached(session_id)

            approvals = ApprovalBroker(store, settings.approval_timeout_sec, attached)
            agent = Agent(
                settings=settings,
                config=config,
                store=store,
                backend=backend,
                registry=registry,
                supervisor=supervisor,
                processes=processes,
                approvals=approvals,
            )
            nursery.start_soon(agent.parts.counter.preload_on_demand)  # off the start-up path
            notices = UserNotices()
            sessions = SessionRegistry(
                agent,
                encode=event_frame,
                resync=resync_frame,
                queue_max=settings.message_queue_max,
                idle_timeout=settings.session_idle_sec,
                on_run_end=lambda sid, msg, end: notify_schedule_run(notices, sid, msg, end),
            )
            await nursery.start(sessions.run)
            scheduler = Scheduler(
                store, settings, lambda: config.current, lambda: sessions, clock=wall_clock
            )
            if schedules:
                await nursery.start(scheduler.run)
            freeze_start_up_objects()
            try:
                yield Runtime(
                    settings=settings,
                    config=config,
                    store=store,
                    backend=backend,
                    registry=registry,
                    processes=processes,
                    mcp=mcp,
                    supervisor=supervisor,
                    approvals=approvals,
                    agent=agent,
                    sessions=sessions,
                    session_service=SessionService(
                        settings=settings,
                        config=config,
                        store=store,
                        sessions=sessions,
                        supervisor=supervisor,
                        approvals=approvals,
                    ),
                    nursery=nursery,
                    scheduler=scheduler,
                    notices=notices,
                )
            finally:
                nursery.cancel_scope.cancel()
