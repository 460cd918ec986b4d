"""The SessionStore contract (store/base.py), on both stores: sessions, history, repair, kv, users.

Every test runs twice through the `backend` fixture (tests/store_backends.py): on a real
SQLite file and on a fresh database of a throwaway PostgreSQL server (skipped, saying
why, where none can be started). Queue, leases, durability and concurrency are in
tests/test_store_contract_queue.py; the SIGKILL tests in test_store_contract_crash.py.
tests/test_store.py keeps the SQLite store's own details (the worker thread, pragmas).

Rules: no sleeps; every test under an absolute `trio.fail_after` (real clock: the
stores' threads work in real time).
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

import pytest
import trio
from builders import assistant, call, result, user
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pg_server import pg_url_with_schema as pg_url_with_schema
from quick_run import examples
from store_backends import Backend

from navi_trio.errors import StoreError
from navi_trio.store import LoadedSession, SessionStore, SQLiteStore
from navi_trio.store.repair import PLACEHOLDER_CONTENT

TIMEOUT = 20


async def test_the_store_satisfies_the_session_store_protocol(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            as_protocol: SessionStore = store
            names = [n for n in dir(SessionStore) if not n.startswith("_")]
            # Every method a coroutine but the hook that times the writes and the one
            # that sets the wall clock of its stamps.
            sync = [n for n in names if not inspect.iscoroutinefunction(getattr(as_protocol, n))]
            assert names and sync == ["observe_writes", "use_clock"]
            assert await store.stats() == dict.fromkeys(
                ["sessions", "messages", "context", "kv", "users"], 0
            )


async def test_closed_or_never_opened_store_raises_instead_of_hanging(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            pass
        with pytest.raises(StoreError, match="closed"):
            await store.create_session(profile_id="p")
        with pytest.raises(StoreError, match="closed"):
            await store.stats()


async def test_errors_come_back_as_store_error_naming_the_operation(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            row = await store.create_session("s-1", profile_id="p")
            await backend.fail_inserts("context", "context is frozen")
            with pytest.raises(StoreError, match="append to session 's-1'.*context is frozen"):
                await store.append(row.id, messages=[user("a")], context=[user("a")])
            # One transaction for both tables: the message did not land either.
            assert await store.load_messages(row.id) == []
            await backend.allow_inserts("context")
            await store.append(row.id, messages=[user("b")], context=[user("b")])
            assert await store.load_messages(row.id) == await store.load_context(row.id)


# -- sessions ---------------------------------------------------------------------------


async def test_sessions_create_get_list_update_and_reject_bad_input(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            a = await store.create_session(profile_id="coder", title="A", meta={"k": [1, "é"]})
            assert re.fullmatch(r"s-[0-9a-f]{12}", a.id)
            b = await store.create_session("chat.2", profile_id="p", user_id="bob")
            assert await store.get_session(a.id) == a
            assert await store.get_session("nope") is None
            assert [r.id for r in await store.list_sessions()] == [b.id, a.id]
            await store.update_session(a.id, title="A2", meta={"x": 1})
            got = await store.get_session(a.id)
            assert got is not None
            assert (got.title, got.meta, got.profile_id) == ("A2", {"x": 1}, "coder")
            assert got.updated_at >= a.updated_at
            assert [r.id for r in await store.list_sessions()] == [a.id, b.id]
            assert [r.id for r in await store.list_sessions("bob")] == [b.id]
            assert await store.count_sessions("bob") == 1
            assert await store.count_sessions("nobody") == 0
            with pytest.raises(StoreError, match="'chat.2' already exists"):
                await store.create_session("chat.2", profile_id="p")
            with pytest.raises(StoreError, match="no session 'ghost'"):
                await store.update_session("ghost", title="x")
            with pytest.raises(StoreError, match="invalid session id 'a:b'"):
                await store.create_session("a:b", profile_id="p")
            with pytest.raises(StoreError, match="profile_id"):
                await store.create_session(profile_id="")
            with pytest.raises(StoreError, match="no session 'ghost'"):
                await store.append("ghost", messages=[user("x")])
            with pytest.raises(StoreError, match="no session 'ghost'"):
                await store.load_messages("ghost")
        async with backend.open() as store:  # after a restart
            assert [r.id for r in await store.list_sessions()] == [a.id, b.id]


async def test_delete_session_removes_history_context_queue_and_its_kv_rows_only(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            a = await store.create_session("s_1", profile_id="p")
            b = await store.create_session("s_10", profile_id="p")
            for sid in (a.id, b.id):
                await store.append(sid, messages=[user(sid)], context=[user(sid)])
                await store.enqueue(sid, f"q-{sid}", {"text": "later"}, pid=1, host="h")
            for key in ("s_1", "s_1:todo", "s_10", "s_10:todo", "s_1x", "sX1:todo"):
                await store.kv_set("notes", key, key)
            assert await store.delete_session(a.id) is True
            assert await store.get_session(a.id) is None
            remaining = [k for k, _ in await store.kv_list("notes")]
            assert remaining == sorted(["s_10", "s_10:todo", "s_1x", "sX1:todo"])
            stats = await store.stats()
            assert (stats["sessions"], stats["messages"], stats["context"]) == (1, 1, 1)
            assert await store.queued_sessions() == [b.id]
            assert await store.load_messages(b.id) == [user(b.id)]
            assert await store.delete_session(a.id) is False


# -- history ----------------------------------------------------------------------------


async def test_append_n_then_m_adds_rows_and_never_rewrites_earlier_ones(backend: Backend) -> None:
    q = "SELECT id, position, data FROM messages ORDER BY position"
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p")).id
            first = [user(f"m{i}") for i in range(5)]
            await store.append(sid, messages=first, context=first[:2])
            before = await backend.query(q)
            more = [assistant(text=f"a{i}") | {"is_plan": i == 0} for i in range(3)]
            await store.append(sid, messages=more, context=more)
            after = await backend.query(q)
            assert len(after) == 8 and after[:5] == before
            assert await store.load_messages(sid) == first + more
            assert await store.load_context(sid) == first[:2] + more
            cols = await backend.query(
                "SELECT role, content, is_plan FROM messages ORDER BY position"
            )
            shown = [(r, c, bool(p)) for r, c, p in cols][::5]
            assert shown == [("user", "m0", False), ("assistant", "a0", True)]


async def test_replace_context_swaps_context_and_leaves_messages(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p")).id
            history = [user(str(i)) for i in range(6)]
            await store.append(sid, messages=history, context=history)
            summary = {"role": "system", "content": "summary of 0-3", "is_summary": True}
            await store.replace_context(sid, [summary, *history[4:]])
            assert await store.load_context(sid) == [summary, *history[4:]]
            assert await store.load_messages(sid) == history
            await store.append(sid, context=[user("6")])
            assert (await store.load_context(sid))[-1] == user("6")
            with pytest.raises(StoreError, match="no session 'ghost'"):
                await store.replace_context("ghost", [summary])


async def test_append_rejects_what_is_not_a_json_dict_and_writes_nothing(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p")).id
            with pytest.raises(StoreError, match=r"context\[1\] is not JSON-serialisable"):
                await store.append(sid, messages=[user("a")], context=[user("a"), {"x": {1, 2}}])
            with pytest.raises(StoreError, match=r"messages\[0\] must be a dict"):
                await store.append(sid, messages=["hello"])  # type: ignore[list-item]
            with pytest.raises(StoreError, match="not finite"):
                await store.append(sid, messages=[{"role": "user", "n": float("nan")}])
            stats = await store.stats()
            assert stats["messages"] == stats["context"] == 0


async def test_unicode_nul_and_odd_values_round_trip_exactly(backend: Backend) -> None:
    # Exactly, but for a lone surrogate, which comes back as U+FFFD (navi_trio/text.py).
    odd: dict[str, Any] = {
        "role": "assistant",
        "content": "héllo 🌍 שלום \x00 end \ud800",
        "thinking": "∑ ≠ 𝔘",
        "tool_calls": [{"id": "c1", "name": "t", "arguments": {"n": 2**70, "f": -0.5}}],
        "nested": {"": [None, True, {"deep": []}], "z": 1, "a": 2},
    }
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p", title="t 🌍 שלום")).id
            await store.append(sid, messages=[odd, user("next")], context=[odd])
        async with backend.open() as store:
            back = {**odd, "content": odd["content"].replace("\ud800", "\ufffd")}
            got = await store.load_messages(sid)
            assert got == [back, user("next")]
            assert list(got[0]["nested"]) == ["", "z", "a"]  # key order kept
            assert await store.load_context(sid) == [back]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
messages_st = st.lists(st.dictionaries(st.text(), json_values, max_size=6), max_size=5)


SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


# Three (messages, context) cases to an example, each in a session of its own: opening
# the store was most of an example's time, and is paid once for three (30 cases, as before).
@settings(max_examples=examples(10), deadline=None, suppress_health_check=SLOW_OK)
@given(cases=st.lists(st.tuples(messages_st, messages_st), min_size=3, max_size=3))
def test_any_json_dicts_round_trip_through_append_and_load(
    backend: Backend, cases: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]
) -> None:
    # One database for every example (the fixture's); each case has its own session.
    async def main() -> None:
        with trio.fail_after(TIMEOUT):
            async with backend.open() as store:
                for messages, context in cases:
                    sid = (await store.create_session(profile_id="p")).id
                    await store.append(sid, messages=messages, context=context)
                    # Compare JSON text too: 1 == 1.0 == True would hide a type change.
                    got_m = await store.load_messages(sid)
                    got_c = await store.load_context(sid)
                    assert json.dumps(got_m) == json.dumps(messages)
                    assert json.dumps(got_c) == json.dumps(context)

    trio.run(main)


# -- load_session and repair --------------------------------------------------------------


async def test_load_session_repairs_dangling_calls_in_place_and_persists_once(
    backend: Backend,
) -> None:
    history = [user("go"), assistant(call("c1"), call("c2", "grep")), result("c1"),
               user("and?"), assistant(text="done")]  # fmt: skip
    placeholder = {"role": "tool", "tool_call_id": "c2", "name": "grep",
                   "content": PLACEHOLDER_CONTENT, "repaired": True}  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p")).id
            await store.append(sid, messages=history, context=history[:2])
            loaded = await store.load_session(sid)
            assert isinstance(loaded, LoadedSession) and loaded.repaired == 3  # 1 + 2
            assert loaded.messages == [*history[:3], placeholder, *history[3:]]
            assert loaded.context == [*history[:2],
                                      placeholder | {"tool_call_id": "c1", "name": "shell"},
                                      placeholder]  # fmt: skip
            # Persisted at the right position, and a second load repairs nothing.
            assert await store.load_messages(sid) == loaded.messages
            await store.append(sid, messages=[user("later")])
            assert (await store.load_messages(sid))[-1] == user("later")
            assert await store.load_session("missing") is None
        async with backend.open() as store:  # after a restart
            again = await store.load_session(sid)
            assert again is not None and again.repaired == 0
            assert again.messages == [*loaded.messages, user("later")]
            assert again.context == loaded.context


# -- kv and users -------------------------------------------------------------------------


async def test_kv_set_get_list_delete_with_json_values(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            assert await store.kv_get("todo", "s1") is None
            await store.kv_set("todo", "s1:b", {"items": ["x"]})
            await store.kv_set("todo", "s1:a", [1, 2])
            await store.kv_set("todo", "s2:a", "other")
            await store.kv_set("todo", "S1:a", "capital")  # bytes order: before lowercase
            await store.kv_set("memory", "s1:a", 3)
            await store.kv_set("todo", "s1:a", [1, 2, 3])  # overwrite
            assert await store.kv_get("todo", "s1:a") == [1, 2, 3]
            assert await store.kv_list("todo", "s1:") == [("s1:a", [1, 2, 3]),
                                                          ("s1:b", {"items": ["x"]})]  # fmt: skip
            assert [k for k, _ in await store.kv_list("todo")] == ["S1:a", "s1:a", "s1:b", "s2:a"]
            assert await store.kv_list("todo", "s1_") == []  # no LIKE wildcards
            assert await store.kv_list("todo", "s1%") == []
            await store.kv_delete("todo", "s1:a")
            await store.kv_delete("todo", "absent")
            assert await store.kv_get("todo", "s1:a") is None
            assert await store.kv_get("memory", "s1:a") == 3
            with pytest.raises(StoreError, match="kv value for todo/x is not JSON"):
                await store.kv_set("todo", "x", object())
            with pytest.raises(StoreError, match="kv scope"):
                await store.kv_get("", "x")


async def test_users_by_token_name_and_id_tokens_stored_only_hashed(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            ada = await store.create_user("ada", "secret-token-1", role="admin")
            bob = await store.create_user("bob", "secret-token-2")
            assert await store.get_user_by_token("secret-token-1") == ada
            assert ada["role"] == "admin" and ada["id"].startswith("u-")
            assert await store.get_user_by_token("wrong") is None
            with pytest.raises(StoreError, match="token already exists"):
                await store.create_user("eve", "secret-token-1")
            assert await store.list_users() == [ada, bob]
            assert await store.get_user(bob["id"]) == bob
            assert await store.get_user_by_name("bob") == bob
            assert await store.get_user_by_name("eve") is None
            # A new token: the old one stops working; another user's is refused.
            assert await store.rotate_user_token("bob", "secret-token-3") is True
            assert await store.get_user_by_token("secret-token-2") is None
            assert await store.get_user_by_token("secret-token-3") == bob
            with pytest.raises(StoreError, match="token already exists"):
                await store.rotate_user_token("bob", "secret-token-1")
            assert await store.rotate_user_token("eve", "secret-token-9") is False
            rows = await backend.query("SELECT * FROM users")
            assert len(rows) == 2 and "secret-token" not in repr(rows)
            assert await store.remove_user("bob") is True
            assert await store.remove_user("bob") is False
            assert (await store.stats())["users"] == 1
        async with backend.open() as store:
            assert await store.get_user_by_token("secret-token-1") == ada


def test_each_engine_gives_every_statement_the_methods_run() -> None:
    # Engine declares the statements whose SQL is each engine's own; an engine that
    # forgot one would fail only when that method is first called.
    from navi_trio.store.postgres.store import PostgresStore
    from navi_trio.store.statements import Engine

    declared = [n for n in Engine.__annotations__ if not n.startswith("_")]
    assert "claim_lease" in declared and "append" in dir(Engine)
    for store in (SQLiteStore, PostgresStore):
        missing = [n for n in declared if not callable(getattr(store.sql, n, None))]
        assert missing == [], f"{store.__name__} lacks {missing}"
        assert "append" in vars(type(store.sql)), store.__name__  # not Engine's
