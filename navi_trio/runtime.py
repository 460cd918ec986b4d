"""Wiring: the runtime that owns every long-lived actor.

    async with open_runtime(settings) as rt:
        actor = await rt.sessions.get("s-1")
        actor.send_message("hello")

The root nursery holds, in start order: the embedded model's host (with the local
backend: its process, started by the first request), the process pool (persistent
processes of ``terminal open``), the peer tool's link (its connections to other
daemons), the MCP servers (each started when a run first needs it; their tools reach
runs through the tool registry), the waker (finished jobs' notes, core/triggers/wake.py), the
TaskSupervisor (background jobs), the checkpoints (the engine on DATA/checkpoints,
opened first: it completes a restore a killed daemon left; its pruning actor), the
session registry (session actors and their runs), with several daemons on one
database the cluster link (core/cluster/cluster.py), the users' watch (revocations reach open
connections and runs: core/session/user_watch.py) and, in the daemon, the scheduler
(scheduled runs, core/triggers/schedules.py). Leaving the block cancels them all: runs are
stopped (their clean-up is shielded), background jobs end (their running markers stay,
so the next start reports them as lost), and every process group is killed. The store
closes last, after every queued write has landed.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
import trio

from navi_trio.api.client_tools import ClientTools
from navi_trio.api.peer_link import WsPeerLink
from navi_trio.api.protocol import event_frame, resync_frame
from navi_trio.core.checkpoints import open_checkpoints
from navi_trio.core.cluster import Cluster, RelayBroadcast
from navi_trio.core.history import Rewinder, SessionRewinds
from navi_trio.core.jobs import TaskSupervisor
from navi_trio.core.session import SessionRegistry, SessionService, UserWatch
from navi_trio.core.triggers import Scheduler, Waker, notify_schedule_run
from navi_trio.core.turn import Agent, ApprovalBroker, Observer, RoundCheckpoints, UserMessage
from navi_trio.events import StreamEnd, TaskUpdate
from navi_trio.imports import start_up_over
from navi_trio.llm.base import LLMBackend, SupervisedBackend
from navi_trio.llm.factory import make_backend, make_client
from navi_trio.notices import UserNotices
from navi_trio.profiles import BUILTIN_TOOL_NAMES, ConfigSource
from navi_trio.project.skill_tool import SkillTool
from navi_trio.settings import Settings
from navi_trio.store.base import ClusterBus
from navi_trio.store.factory import open_store
from navi_trio.store.methods import SessionStore
from navi_trio.store.modes import private_data
from navi_trio.tools.base import Tool, ToolRegistry
from navi_trio.tools.builtin import builtin_tools
from navi_trio.tools.mcp import McpServers
from navi_trio.tools.peer import PeerTool
from navi_trio.tools.procs import ProcessPool, tag_owner
from navi_trio.tools.runas import run_as
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
    client_tools: ClientTools
    supervisor: TaskSupervisor
    approvals: ApprovalBroker
    checkpoints: RoundCheckpoints
    agent: Agent
    sessions: SessionRegistry
    session_service: SessionService
    rewinds: SessionRewinds
    nursery: trio.Nursery
    scheduler: Scheduler
    notices: UserNotices
    users: UserWatch
    cluster: Cluster | None = None  # several daemons on one database (core/cluster/cluster.py)

    def llm_status(self) -> dict[str, Any] | None:
        """The embedded model's process, as its host reports it; None for an endpoint."""
        # Duck-typed: llm/host.py (and its process code) loads only with the local backend.
        status = getattr(getattr(self.backend, "host", None), "status", None)
        return dict(status()) if callable(status) else None

    async def warm_up(self) -> None:
        """Load what turns need ahead of the first one: the token encoding, on a thread.

        Its last ~70-130 ms hold the GIL (tiktoken builds its encoder in Rust without
        releasing it), so a load that overlaps the first turns stalls the loop for them
        all: a daemon awaits this before it listens. A one-shot command does not: its
        first request would only wait behind it (the load then runs during that call).
        """
        await self.agent.parts.counter.preload()


def freeze_start_up_objects() -> None:
    """Leave what start-up made (modules, classes, functions, config: tens of thousands
    of objects that live as long as the process) out of every later garbage collection.

    A full collection walks every tracked object: without this, each one in a long tool
    loop costs ~15-20 ms, nearly all of it start-up objects. Done once per process (the
    first runtime; `gc.freeze` is process-wide), without a collection first: the cyclic
    garbage start-up left (under `navi`'s start-up threshold all of it, ~3 MB) stays
    frozen with the rest, as collecting it would cost the start-up path a full pass.
    Then the thresholds start-up found again (`start_up_over`): from here young objects
    are the runs'.
    """
    if gc.get_freeze_count() == 0:
        gc.freeze()
    start_up_over()


def default_tools(settings: Settings) -> list[Tool]:
    return [
        *builtin_tools(settings),
        TasksTool(),
        SpawnAgentTool(),
        PeerTool(WsPeerLink()),
        SkillTool(),
    ]


@asynccontextmanager
async def open_runtime(
    settings: Settings,
    *,
    backend: LLMBackend | None = None,
    config: ConfigSource | None = None,
    tools: list[Tool] | None = None,
    cluster: bool = False,
    schedules: bool = False,
    wall_clock: Callable[[], float] | None = None,
    checkpoint_wall: Callable[[], float] | None = None,
    observer: Observer | None = None,
) -> AsyncIterator[Runtime]:
    """Open the store, the LLM backend and every actor; close them all on exit.

    `cluster`: join the other daemons of a shared store (`navi serve` on PostgreSQL).
    `schedules`: run due schedules (the daemon does; an embedded `navi run` does not);
    `wall_clock`: the one wall clock that schedules and leases are judged by (the
    scheduler's due times, the store's stamps and lease expiry; default: time.time, a
    test passes one on trio's virtual time). `checkpoint_wall`: the checkpoints'
    (default: time.time; a test of their age limit moves it on)."""
    config = config or ConfigSource(settings.config_path)
    tools = tools if tools is not None else default_tools(settings)
    # Refuse a config naming a tool nobody provides or lacking a prompt file, before
    # anything opens (and before a user message could be saved).
    config.require(BUILTIN_TOOL_NAMES | {t.name for t in tools})
    # Tool processes never run as root: a NAVI_TOOL_USER naming no one stops the start.
    user = run_as(settings.tool_user)
    if user is not None:
        logging.getLogger(__name__).info(
            "navi runs as root: its tool processes run as %s (uid %d, NAVI_TOOL_USER), "
            "never as root (navi doctor says more)",
            user.name,
            user.uid,
        )
    # Sandboxed modes (the default) need bwrap: say so now, not at the first command.
    ok, reason = await trio.to_thread.run_sync(sandbox_available, settings.bwrap_path, user)
    if not ok:
        logging.getLogger(__name__).warning(
            "the sandbox is unavailable, so sandboxed terminal and code_exec calls will be "
            "refused: %s",
            reason,
        )
    # Before anything is written there: the data folder is the daemon account's alone.
    await trio.to_thread.run_sync(private_data, settings.data_dir)
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store(settings))
        wall = wall_clock or time.time
        store.use_clock(wall)
        # Before any run: a restore a killed process left half done is completed first.
        engine = await stack.enter_async_context(
            open_checkpoints(settings, wall=checkpoint_wall or time.time)
        )
        if backend is None:
            client = await stack.enter_async_context(make_client(settings))
            backend = make_backend(settings, client)
        async with trio.open_nursery() as nursery:
            if isinstance(backend, SupervisedBackend):  # the embedded model's process
                await nursery.start(backend.run)
            registry = ToolRegistry(tools)
            processes = ProcessPool(idle_sec=settings.terminal_idle_sec)
            await nursery.start(processes.run)
            for tool in tools:  # the peer tool's connections live in the runtime's nursery
                if isinstance(tool, PeerTool):
                    await nursery.start(tool.link.run)
            # Stdio servers in the daemon's cgroup tree, as tool commands (tools/cgroups.py).
            owner = tag_owner(settings.data_dir) if settings.cgroups else None
            mcp = McpServers(lambda: config.current, settings.tool_user, settings.bwrap_path, owner)
            await nursery.start(mcp.run)
            registry.add_source(mcp)
            client_tools = ClientTools()  # tools a client runs for its session
            registry.add_source(client_tools)
            # The supervisor starts first (the agent needs it), the session registry
            # last (it needs the agent): task updates reach it through this closure.
            sessions: SessionRegistry | None = None

            def publish(session_id: str, event: TaskUpdate) -> None:
                if observer is not None:  # out of band, past the session's publish
                    observer.event(session_id, event)
                if sessions is not None:
                    sessions.publish_task_update(session_id, event)

            # Finished jobs' notes, and the turns they start (wake_on_task_done).
            waker = Waker(store, settings, lambda: config.current, lambda: sessions)
            await nursery.start(waker.run)
            supervisor = TaskSupervisor(settings, store, publish, notes=waker.record)
            # A store several daemons share offers a bus (PostgreSQL); SQLite has none.
            make_bus: Callable[[], ClusterBus] | None = getattr(store, "bus", None)
            make_bus = make_bus if cluster else None
            supervisor.lost_at_start = make_bus is None  # else the cluster, knowing who lives
            await nursery.start(supervisor.run)

            def attached(session_id: str) -> bool:
                return sessions is not None and sessions.attached(session_id)

            approvals = ApprovalBroker(store, settings.approval_timeout_sec, attached)
            checkpoints = RoundCheckpoints(engine, store)
            await nursery.start(checkpoints.run)
            agent = Agent(
                settings=settings,
                config=config,
                store=store,
                backend=backend,
                registry=registry,
                supervisor=supervisor,
                processes=processes,
                approvals=approvals,
                checkpoints=checkpoints,
                observer=observer,
            )
            nursery.start_soon(agent.parts.counter.preload_on_demand)  # off the start-up path
            joined = None
            if make_bus is not None:
                joined = Cluster(
                    make_bus(),
                    store,
                    agent.leases,
                    settings.lease_ttl_sec,
                    queue_max=settings.message_queue_max,
                    ask_timeout=settings.cluster_ask_timeout_sec,
                )
            notices = UserNotices()
            if joined is not None:
                joined.share_notices(notices)

            def run_ended(sid: str, msg: UserMessage, end: StreamEnd) -> None:
                notify_schedule_run(notices, sid, msg, end, wall())

            sessions = SessionRegistry(
                agent,
                encode=event_frame if joined is None else joined.tap(event_frame),
                resync=resync_frame,
                queue_max=settings.message_queue_max,
                idle_timeout=settings.session_idle_sec,
                on_run_end=run_ended,
            )
            await nursery.start(sessions.run)

            # Revocations reach what is open (core/session/user_watch.py): the store signals each
            # change of the users table, through the cluster's bus or the SQLite marker.
            def removed(user_ids: set[str]) -> None:
                sessions.revoke_users(user_ids)
                supervisor.cancel_users(user_ids)
                processes.close_users(user_ids)

            users = UserWatch(store, on_removed=removed)
            await nursery.start(users.run)
            watch_users = getattr(store, "watch_users", None)
            if joined is not None:
                joined.users_changed = users.signal
            elif watch_users is not None:
                await nursery.start(watch_users, users.signal)
            if joined is not None:
                joined.attach(sessions, supervisor, approvals)
                supervisor.shared = joined  # the caps count for every daemon
                sessions.on_retire = joined.unfollow_soon
                sessions.hand_over = joined.hand_back  # a session taken: its queue goes there
                sessions.broadcast_class = RelayBroadcast  # other daemons' frames, relayed
                sessions.dead_turn = joined.dead_turn  # a turn a dead daemon left: ended
                await nursery.start(joined.run)
            rewinder = Rewinder(
                settings=settings,
                store=store,
                engine=engine,
                leases=agent.leases,
                config=agent.config,
                forget=agent.cache.forget,
                jobs=supervisor.running_count,
                source=config,
            )
            rewinds = SessionRewinds(rewinder, sessions, checkpoints)
            scheduler = Scheduler(
                store,
                settings,
                lambda: config.current,
                lambda: sessions,
                clock=wall,
                notices=notices,
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
                    client_tools=client_tools,
                    supervisor=supervisor,
                    approvals=approvals,
                    checkpoints=checkpoints,
                    agent=agent,
                    sessions=sessions,
                    session_service=SessionService(
                        settings=settings,
                        config=config,
                        store=store,
                        sessions=sessions,
                        supervisor=supervisor,
                        approvals=approvals,
                        checkpoints=engine,
                        processes=processes,
                    ),
                    rewinds=rewinds,
                    nursery=nursery,
                    cluster=joined,
                    scheduler=scheduler,
                    notices=notices,
                    users=users,
                )
            finally:
                nursery.cancel_scope.cancel()
