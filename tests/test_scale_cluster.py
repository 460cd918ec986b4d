"""Three `navi serve` processes on one PostgreSQL, clients spread over them (issue 20
"Tests and proof"):

- a client on daemon A drives and follows a session that daemon B runs: its message is
  handed to B, and it gets every frame of B's runs, in order, once;
- a daemon SIGKILLed mid-run: its session is taken over, its turn ended, and no
  acknowledged message is lost (each is in the history exactly once, in the order sent);
- no session is ever run by two daemons at once, checked from the store's own records
  (a trigger logs every lease change over the whole test).

Real processes on 127.0.0.1, real PostgreSQL, a fake LLM over real HTTP. The waits are
for frames, lines and processes, except the failover, which waits for a lease to run
out (NAVI_LEASE_TTL_SEC). Every test under `trio.fail_after`; every process is killed.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client
from daemons import history, no_plan_config, pg_daemons
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql

from navi_trio import wire
from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 150
ENDS_LIMIT = 100  # real seconds for the ends after a failover (inside TIMEOUT: said, not cut)
TTL = "2"

LEASE_LOG = """
CREATE TABLE lease_log (
    id bigint GENERATED ALWAYS AS IDENTITY, session_id text, owner text, generation bigint,
    expires_at double precision, at double precision
);
CREATE FUNCTION log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO lease_log (session_id, owner, generation, expires_at, at)
    VALUES (NEW.session_id, NEW.owner, NEW.generation, NEW.expires_at,
            extract(epoch FROM clock_timestamp()));
    RETURN NEW;
END $$;
CREATE TRIGGER lease_log AFTER INSERT OR UPDATE ON leases
    FOR EACH ROW EXECUTE FUNCTION log_lease();
"""


def never_two_owners(url: str, killed: frozenset[int] = frozenset()) -> int:
    """Checks the lease log: a new owner's claim comes after the last owner's lease
    ended (expired or released), or its process was killed (`killed`: pids, all on this
    machine, where a dead pid's lease is taken over at once); the number of changes
    checked."""
    rows = sql(url, "SELECT session_id, owner, generation, expires_at, at FROM lease_log"
                    " ORDER BY session_id, id")  # fmt: skip
    last: dict[str, tuple[str, int, float]] = {}
    for sid, owner, generation, expires_at, at in rows:
        before = last.get(sid)
        if before is not None and before[0] != owner:
            dead = int(before[0].split(":")[1]) in killed
            assert dead or at >= before[2], (sid, before, owner, at)  # the old lease ended
            assert generation == before[1] + 1, (sid, before, owner, generation)
        if before is not None and before[0] == owner:
            assert generation == before[1], (sid, before, generation)
        last[sid] = (owner, generation, expires_at)
    return len(rows)


def seqs_in_order(frames: list[dict[str, Any]], sid: str) -> None:
    """Within each epoch, this session's seqs only go up (by one, or more where a slow
    subscriber's waiting deltas were merged into one frame); an epoch
    may change (a resync, or the daemon's own frames after relayed ones), never repeat."""
    epoch, seq = None, None
    left: set[str] = set()
    for f in frames:
        # A reply (a message's ok names the seq it was taken at) is no frame of the stream.
        if f.get("session_id") != sid or not wire.is_session_frame(f) or "epoch" not in f:
            continue
        if f["epoch"] != epoch:
            assert f["epoch"] not in left, (left, f)
            if epoch is not None:
                left.add(epoch)
        elif f["type"] != "resync" and seq is not None:
            assert f["seq"] > seq, (seq, f)
        epoch, seq = f["epoch"], f["seq"]


def killed_then_two(wait: float) -> list[dict[str, Any]]:
    """A reply the model waits `wait` s to start (its daemon is killed meanwhile), then
    the answers to two more messages."""
    return [
        {"text": "never finished", "delay_first": wait},
        {"text": "answer two"},
        {"text": "answer three"},
    ]


async def message(c: Client, sid: str, text: str) -> dict[str, Any]:
    return await c.request({"type": "message", "session_id": sid, "content": text})


async def ends_within(c: Client, sid: str, count: int, logs: Path) -> list[dict[str, Any]]:
    """The next `count` run ends of `sid` that `c` gets. Should they not all come within
    ENDS_LIMIT, the failure says what `c` got of the session and how the daemons' logs
    (`daemon*.log` in `logs`) end: which daemon took over, and what it met."""
    ends: list[dict[str, Any]] = []
    with trio.move_on_after(ENDS_LIMIT):
        while len(ends) < count:
            ends.append(await c.until_end(sid))
        return ends
    got = [
        (f["type"], f.get("reason") or f.get("code"))
        for f in c.frames
        if f.get("session_id") == sid
    ]
    raise AssertionError(
        f"{len(ends)} of {count} ends in {ENDS_LIMIT} s; got {got}; logs: {log_tails(logs)}"
    )


def log_tails(folder: Path) -> dict[str, str]:
    return {
        p.name: p.read_text(errors="replace")[-3000:] for p in sorted(folder.glob("daemon*.log"))
    }


async def test_a_client_on_one_daemon_drives_and_follows_a_session_run_by_another(
    tmp_path: Path, pg_url: str
) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "first answer in many words", "delay_chunk": 0.05},
        {"text": "second answer"},
    ]
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 3, NAVI_LEASE_TTL_SEC=TTL, forked=True) as (
                a,
                b,
                c,
            ),
        ):
            sql(pg_url, LEASE_LOG)
            sid = "admin.shared"
            # B's first answer stops mid-way until A and C follow: on a loaded machine it
            # could end before C's subscribe, and C would never see two ends.
            release = llm.hold_after(2, reply=0)
            async with b.connect() as on_b, a.connect() as on_a, c.connect() as on_c:
                assert (await message(on_b, sid, "one"))["type"] == "session"
                await llm.wait_held(1)  # B runs it now
                # A follows it and sends the next message while B runs: handed to B.
                sub = await on_a.request({"type": "subscribe", "session_id": sid})
                assert sub["type"] == "ok", sub
                ok = await message(on_a, sid, "two")
                assert (ok["type"], ok["queued"]) == ("ok", True), ok
                # B took it in, and published that to A: B knows A follows (A's note to
                # follow came before its hand-over's), so the rest of B's frames go out.
                await on_a.until(lambda f: f["type"] == "message_queued" and f["text"] == "two")
                # C only follows.
                await on_c.request({"type": "subscribe", "session_id": sid})
                release.set()
                for name, client in (("A", on_a), ("C", on_c), ("B", on_b)):
                    with trio.move_on_at(trio.current_effective_deadline() - 10) as waited:
                        first = await client.until_end(sid)
                        second = await client.until_end(sid)
                    assert not waited.cancelled_caught, (
                        f"{name} saw no two ends; its frames: "
                        f"{[(f['type'], f.get('seq')) for f in client.frames][-40:]}; "
                        f"requests to the LLM: {len(llm.requests)}; logs: {log_tails(tmp_path)}"
                    )
                    assert (first["reason"], second["reason"]) == ("complete", "complete")
                # A saw B's second run whole, once: its text deltas make the answer.
                texts = [f["text"] for f in on_a.frames if f["type"] == "text_delta"]
                assert "".join(texts).endswith("second answer"), texts
                for client in (on_a, on_b, on_c):
                    seqs_in_order(client.frames, sid)
                owners = sql(pg_url, "SELECT DISTINCT pid FROM lease_log l JOIN daemons d"
                                     " ON d.owner = l.owner")  # fmt: skip
                assert owners == [(b.pid,)], owners
            assert history(pg_url, sid) == [
                ("user", "one"), ("assistant", "first answer in many words"),
                ("user", "two"), ("assistant", "second answer"),
            ]  # fmt: skip
            assert never_two_owners(pg_url) >= 2


async def test_a_profile_that_rejects_refuses_a_message_for_a_turn_on_another_daemon(
    tmp_path: Path, pg_url: str
) -> None:
    """The profile's on_busy default holds on every daemon: B runs the turn; a message
    sent on A with no on_busy of its own is refused as it is on B; one that asks to be
    queued, or to steer (which does not cross daemons), waits in B's queue."""
    replies: list[dict[str, Any]] = [
        {"text": "a long answer in many words"},
        {"text": "queued answer"},
        {"text": "steered answer"},
    ]
    rejecting = str(no_plan_config(tmp_path, on_busy="reject"))
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 2, NAVI_CONFIG=rejecting, forked=True) as (a, b),
        ):
            sid = "admin.rejecting"
            async with b.connect() as on_b, a.connect() as on_a:
                release = llm.hold_after(0)  # B's turn stays running until it is set
                assert (await message(on_b, sid, "one"))["type"] == "session"
                await llm.wait_held()  # B runs it now
                for client in (on_b, on_a):  # here and there alike
                    refused = await message(client, sid, "not now")
                    assert (refused["type"], refused["code"]) == ("error", "session_busy")
                for text, asked in (("two", "enqueue"), ("three", "steer")):  # both queued
                    ok = await on_a.request(
                        {"type": "message", "session_id": sid, "content": text, "on_busy": asked}
                    )  # fmt: skip
                    assert (ok["type"], ok["queued"], ok["on_busy"]) == ("ok", True, "enqueue")
                release.set()
                for _ in range(3):
                    assert (await on_b.until_end(sid))["reason"] == "complete"
            assert history(pg_url, sid) == [
                ("user", "one"), ("assistant", "a long answer in many words"),
                ("user", "two"), ("assistant", "queued answer"),
                ("user", "three"), ("assistant", "steered answer"),
            ]  # fmt: skip


async def test_a_daemon_killed_mid_run_loses_no_acknowledged_message(
    tmp_path: Path, pg_url: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(killed_then_two(60)) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 3, NAVI_LEASE_TTL_SEC=TTL, forked=True) as (
                a,
                b,
                c,
            ),
        ):
            sql(pg_url, LEASE_LOG)
            sid = "admin.failover"
            async with b.connect() as on_b, a.connect() as on_a:
                assert (await message(on_b, sid, "one"))["type"] == "session"
                await llm.wait_requests(1)
                # Two more, acknowledged while B runs: queued for B, durably.
                for text in ("two", "three"):
                    ok = await message(on_a, sid, text)
                    assert (ok["type"], ok["queued"]) == ("ok", True), ok
                os.kill(b.pid, signal.SIGKILL)
                # A (or C) takes the session over, ends B's turn, and runs the queue.
                ends = await ends_within(on_a, sid, 3, tmp_path)
                assert [e["reason"] for e in ends] == ["error", "complete", "complete"], ends
            rows = history(pg_url, sid)
            users = [content for role, content in rows if role == "user"]
            assert users == ["one", "two", "three"], rows
            assert rows[1] == ("assistant", ""), rows  # B's turn, ended (its error: DEAD_TURN)
            assert ("assistant", "answer two") in rows and ("assistant", "answer three") in rows
            assert sql(pg_url, "SELECT count(*) FROM queued") == [(0,)]
            assert never_two_owners(pg_url, frozenset({b.pid})) >= 2
