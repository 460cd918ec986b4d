"""Client message keys across daemons on one PostgreSQL: a resend that reaches another
daemon than the first send is not run again.

A client whose connection dropped reconnects where it can: to another daemon of the
cluster. The keys are in the database the daemons share, taken with the message (its
queued row, or the queued row of a hand-over to the daemon that runs the session), so a
resend on the other daemon gets the first one's ok again (``duplicate``) and the session
runs each message once. A handed-over message's ok names the seq of the session as the
handing daemon saw it (the owner's frames relayed to it): its run's frames come after.
Two real `navi serve` processes, real PostgreSQL, a fake LLM
over real HTTP; waits are for frames; every test under `trio.fail_after`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client
from daemons import history, pg_daemons
from pg_server import pg_url_with_schema as pg_url_with_schema
from store_backends import PostgresBackend

from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 60


async def say(c: Client, sid: str, text: str, key: str) -> dict[str, Any]:
    """The daemon's last reply to a message (after a new session's ``session``)."""
    frame = {"type": "message", "session_id": sid, "content": text, "key": key}
    reply = await c.request(frame)
    if reply["type"] == "session":
        reply = await c.until(lambda f: f.get("id") == reply["id"])
    assert reply["type"] == "ok", reply
    return reply


async def test_a_resend_on_the_other_daemon_is_not_run_again(tmp_path: Path, pg_url: str) -> None:
    replies: list[dict[str, Any]] = [{"text": f"answer {n}"} for n in range(1, 6)]
    sid = "admin.keys"
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 2, forked=True) as (a, b),
        ):
            release = llm.hold_after(0)  # B's first turn runs until it is set
            async with b.connect() as on_b, a.connect() as on_a:
                await say(on_b, sid, "one", "k-1")
                await llm.wait_held()  # B runs the session now
                await on_a.request({"type": "subscribe", "session_id": sid})
                # Taken on B (queued behind its turn), sent again on A.
                two = await say(on_b, sid, "two", "k-2")
                # (A follows B's frames now: its view of the session is B's.)
                await on_a.until(lambda f: f["type"] == "message_queued" and f["text"] == "two")
                two_again = await say(on_a, sid, "two", "k-2")
                # Handed over by A to B (its queued row there), sent again on B, then on A.
                three = await say(on_a, sid, "three", "k-3")
                three_on_b = await say(on_b, sid, "three", "k-3")
                three_on_a = await say(on_a, sid, "three", "k-3")
                one_on_a = await say(on_a, sid, "one", "k-1")  # the running one's
                # B took the handed message in: on A, every frame of it comes after the
                # seq A's ok named (A's view of B's frames when it handed it over).
                taken_in = await on_a.until(
                    lambda f: f["type"] == "message_queued" and f.get("text") == "three"
                )
                release.set()
                for _ in range(3):
                    assert (await on_b.until_end(sid))["reason"] == "complete"
                await on_b.idle(sid)
            assert history(pg_url, sid) == [
                ("user", "one"), ("assistant", "answer 1"),
                ("user", "two"), ("assistant", "answer 2"),
                ("user", "three"), ("assistant", "answer 3"),
            ]  # fmt: skip
    assert two["queued"] and "duplicate" not in two
    assert two_again["duplicate"] and (two_again["seq"], two_again["epoch"]) == (
        two["seq"],
        two["epoch"],
    )
    assert three["queued"] and "duplicate" not in three
    # A handed-over message's ok names a seq its run's frames all come after.
    assert (three["seq"], three["epoch"]) == (two["seq"] + 1, two["epoch"])
    assert (taken_in["seq"], taken_in["epoch"]) == (three["seq"] + 1, three["epoch"])
    for dup in (three_on_b, three_on_a, one_on_a):
        assert dup["duplicate"] is True, dup
    assert three_on_b["queued"] and three_on_a["queued"] and not one_on_a["queued"]


async def test_a_resend_whose_first_was_still_on_its_way_gets_the_first_ones_ok(
    tmp_path: Path, pg_url: str
) -> None:
    """Both on their way at once: the session busy (its turn held at the LLM), so each is
    queued; the session's row locked by another connection, so neither queued row is
    written when the other's key is looked up (each is said ``message_queued`` after its
    look-up). Let go, the store lets one in and refuses the other, whose ok is the first
    one's again (its seq, epoch, queued, on_busy), ``duplicate``; it runs once."""
    replies: list[dict[str, Any]] = [{"text": f"answer {n}"} for n in range(1, 4)]
    sid = "admin.race"

    def queued_two(f: dict[str, Any]) -> bool:
        return f["type"] == "message_queued" and f.get("text") == "two"

    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 1, forked=True) as (a,),
        ):
            release = llm.hold_after(0)  # the first turn runs until it is set
            async with a.connect() as one, a.connect() as other:
                await say(one, sid, "one", "k-1")
                await llm.wait_held()
                async with PostgresBackend(pg_url).holding(sid):
                    two = {"type": "message", "session_id": sid, "content": "two", "key": "k-2"}
                    await one.send({**two, "id": "on-one"})
                    await other.send({**two, "id": "on-other"})
                    await one.until(queued_two)
                    await one.until(queued_two)
                oks = [await one.until(lambda f: f.get("id") == "on-one")]
                oks.append(await other.until(lambda f: f.get("id") == "on-other"))
                release.set()
                for _ in range(2):
                    assert (await one.until_end(sid))["reason"] == "complete"
                await one.idle(sid)
            assert history(pg_url, sid) == [
                ("user", "one"), ("assistant", "answer 1"),
                ("user", "two"), ("assistant", "answer 2"),
            ]  # fmt: skip
    dups = [ok for ok in oks if ok.get("duplicate")]
    assert len(dups) == 1 and all(ok["type"] == "ok" for ok in oks), oks
    first = next(ok for ok in oks if not ok.get("duplicate"))
    assert first["queued"] is True and isinstance(first["seq"], int), first
    fields = ("seq", "epoch", "queued", "on_busy")
    assert {k: dups[0].get(k) for k in fields} == {k: first[k] for k in fields}
