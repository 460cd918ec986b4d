"""What the WebSocket side needs of the daemon's core: the `DaemonCore` protocol.

api/ depends on this, never on the concrete `runtime.Runtime` (which satisfies it): the
layers' arrows point down only (DESIGN.md). It names the parts a connection and its
commands use — settings, the live config, the store, the session registry (actors),
the session service (create, delete), the approval broker, the task supervisor, the
rewinds (rewind, fork), the scheduler (scheduled runs), the users' notices, the
users' watch (a revoked token closes its connections) and, with
several daemons on one database, the cluster — and nothing of how they are wired.
"""

from __future__ import annotations

from typing import Any, Protocol

from navi_trio.api.client_tools import ClientTools
from navi_trio.core.cluster import Cluster
from navi_trio.core.history import SessionRewinds
from navi_trio.core.jobs import TaskSupervisor
from navi_trio.core.session import SessionRegistry, SessionService, UserWatch
from navi_trio.core.triggers import Scheduler
from navi_trio.core.turn import ApprovalBroker
from navi_trio.notices import UserNotices
from navi_trio.profiles import ConfigSource
from navi_trio.settings import Settings
from navi_trio.store.methods import SessionStore


class DaemonCore(Protocol):
    """The daemon's core as the api layer sees it (`runtime.Runtime` is one)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def config(self) -> ConfigSource: ...
    @property
    def store(self) -> SessionStore: ...
    @property
    def sessions(self) -> SessionRegistry: ...
    @property
    def session_service(self) -> SessionService: ...
    @property
    def approvals(self) -> ApprovalBroker: ...
    @property
    def client_tools(self) -> ClientTools: ...
    @property
    def supervisor(self) -> TaskSupervisor: ...
    @property
    def cluster(self) -> Cluster | None: ...  # several daemons on one database
    @property
    def rewinds(self) -> SessionRewinds: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def notices(self) -> UserNotices: ...
    @property
    def users(self) -> UserWatch: ...  # each change of the users table

    def llm_status(self) -> dict[str, Any] | None:
        """The embedded model's process, as its host reports it; None for an endpoint."""
        ...
