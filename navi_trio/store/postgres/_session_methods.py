"""The store's methods for sessions, their history and context (mixed into `PostgresStore`).

Each method checks its input on the caller's side (`store/_input`, shared with the
SQLite store), names its operation and runs one job on the workers (`_core._run`); the
statements are `_history`'s. Every history write carries the session's lease fence
(`store/fence`), so a daemon that lost the lease cannot write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from navi_trio.errors import LimitError
from navi_trio.store._control_input import check_sessions_max, sessions_full
from navi_trio.store._input import (
    _check_meta,
    _check_text,
    _dump,
    _prepare,
    _prepare_rewrite,
    check_page,
    check_session_id,
)
from navi_trio.store._sessions import _new_session_id
from navi_trio.store.base import HistoryPage, LoadedSession, SessionRow
from navi_trio.store.fence import fence_for
from navi_trio.store.postgres import _history as h
from navi_trio.store.postgres._core import _Core


class _Sessions(_Core):
    # -- sessions -------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        profile_id: str,
        title: str = "",
        user_id: str = "local",
        meta: dict[str, Any] | None = None,
        sessions_max: int | None = None,
    ) -> SessionRow:
        sid = check_session_id(session_id) if session_id is not None else _new_session_id()
        most = check_sessions_max(sessions_max)
        now = self._now()
        row = SessionRow(
            id=sid,
            profile_id=_check_text(profile_id, "profile_id"),
            title=_check_text(title, "title", allow_empty=True),
            user_id=_check_text(user_id, "user_id"),
            created_at=now,
            updated_at=now,
            meta=dict(_check_meta(meta if meta is not None else {})),
        )
        meta_json = _dump(row.meta, "session meta")
        full = await self._run(
            f"create session {sid!r}", lambda c: h.insert_session(c, row, meta_json, most)
        )
        if full is not None and most is not None:
            raise LimitError(sessions_full(full, most))
        return row

    async def get_session(self, session_id: str) -> SessionRow | None:
        sid = check_session_id(session_id)
        return await self._run(f"get session {sid!r}", lambda c: h.get_session(c, sid), write=False)

    async def list_sessions(self, user_id: str | None = None) -> list[SessionRow]:
        if user_id is not None:
            _check_text(user_id, "user_id")
        return await self._run("list sessions", lambda c: h.list_sessions(c, user_id), write=False)

    async def update_session(
        self,
        session_id: str,
        *,
        profile_id: str | None = None,
        title: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Change the given fields (meta is replaced whole) and bump updated_at."""
        sid = check_session_id(session_id)
        changes: dict[str, Any] = {"updated_at": self._now()}
        if profile_id is not None:
            changes["profile_id"] = _check_text(profile_id, "profile_id")
        if title is not None:
            changes["title"] = _check_text(title, "title", allow_empty=True)
        if meta is not None:
            changes["meta"] = _dump(_check_meta(meta), "session meta")
        fence = fence_for(sid)
        await self._run(
            f"update session {sid!r}",
            h.fenced(fence, lambda c: h.update_session(c, sid, changes, fence)),
        )

    async def delete_session(self, session_id: str) -> bool:
        """Delete the session, its history, context, queue and kv rows `sid` or `sid:…`."""
        sid = check_session_id(session_id)
        return await self._run(f"delete session {sid!r}", lambda c: h.delete_session(c, sid))

    # -- history --------------------------------------------------------------------

    async def append(
        self,
        session_id: str,
        *,
        messages: Sequence[dict[str, Any]] = (),
        context: Sequence[dict[str, Any]] = (),
        durable: bool = True,
        dequeue: str | None = None,
    ) -> None:
        """Append new display messages and context entries in one transaction (base)."""
        sid = check_session_id(session_id)
        msg_rows = _prepare(messages, "messages")
        done = {id(m): row for m, row in zip(messages, msg_rows, strict=True)}
        ctx_rows = _prepare(context, "context", done)
        if not msg_rows and not ctx_rows and dequeue is None:
            return
        now = self._now()
        fence = fence_for(sid)
        await self._run(
            f"append to session {sid!r}",
            h.fenced(fence, lambda c: h.append(c, sid, msg_rows, ctx_rows, now, dequeue, fence,
                                              durable=durable)),
            # One statement, its own transaction (migrations/0005); a dequeue is three.
            transaction=dequeue is not None,
        )  # fmt: skip

    async def load_messages(self, session_id: str) -> list[dict[str, Any]]:
        sid = check_session_id(session_id)
        return await self._run(
            f"load messages of {sid!r}", lambda c: h.load_history(c, "messages", sid), write=False
        )

    async def load_messages_page(
        self, session_id: str, *, after: float | None = None, limit: int, max_bytes: int
    ) -> HistoryPage:
        """One page of the display history (SessionStore.load_messages_page)."""
        sid = check_session_id(session_id)
        check_page(limit, max_bytes)
        return await self._run(
            f"load a page of messages of {sid!r}",
            lambda c: h.load_page(c, sid, after, limit, max_bytes),
            write=False,
        )

    async def load_context(self, session_id: str) -> list[dict[str, Any]]:
        sid = check_session_id(session_id)
        return await self._run(
            f"load context of {sid!r}", lambda c: h.load_history(c, "context", sid), write=False
        )

    async def replace_context(self, session_id: str, context: Sequence[dict[str, Any]]) -> None:
        """Compression only: swap the whole LLM context in one transaction."""
        sid = check_session_id(session_id)
        rows = _prepare(context, "context")
        now = self._now()
        fence = fence_for(sid)
        await self._run(
            f"replace context of {sid!r}",
            h.fenced(fence, lambda c: h.replace_context(c, sid, rows, now, fence)),
        )

    async def rewrite_history(
        self,
        session_id: str,
        *,
        keep: int,
        messages: Sequence[dict[str, Any]] = (),
        context: Sequence[dict[str, Any]],
        kv_set: Sequence[tuple[str, str, Any]] = (),
        kv_delete: Sequence[tuple[str, str]] = (),
    ) -> None:
        """A rewind or a branch brought back, in one transaction (base)."""
        sid = check_session_id(session_id)
        job = _prepare_rewrite(keep, messages, context, kv_set, kv_delete)
        now = self._now()
        fence = fence_for(sid)
        await self._run(
            f"rewrite history of {sid!r}",
            h.fenced(fence, lambda c: h.rewrite(c, sid, job, now, fence)),
        )

    async def load_session(self, session_id: str) -> LoadedSession | None:
        """Row, messages and context, dangling tool calls repaired and persisted (base)."""
        sid = check_session_id(session_id)
        now = self._now()
        fence = fence_for(sid)
        return await self._run(
            f"load session {sid!r}",
            h.fenced(fence, lambda c: h.load_session(c, sid, now, fence)),
            write=False,
        )
