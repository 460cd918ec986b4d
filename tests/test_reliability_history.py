"""Reliability: clients that ask for a long history and do not read cost bounded memory.

A real `navi serve` subprocess; an ordinary user written to the store as `navi users add`
writes one (no process to start), whose session of 30 messages of 1 MB is written into
the SQLite file before the daemon starts. Four
connections of that user each send 30 ``sessions history`` requests at once and never
read a byte. Each connection's outbox fills (the daemon logs it), and the daemon stops
taking its requests: its resident set grows by a bounded amount, whatever the number of
requests. Once the clients close their sockets (the daemon logs each one leaving), the
memory comes back. A client that reads gets the whole history through `open_daemon`,
which follows the pages, before and after.

Before the history came in pages and the outbox was bounded in bytes, the same load took
the daemon from ~175 MB to ~3.8 GB, and ~3.5 GB stayed after the clients left.

Rules: the waits are on the daemon's log lines and on frames, under one absolute
`trio.fail_after`; the thresholds leave room for any machine (measured: +31 MB at the
peak, +3 MB after).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import wsproto
from daemons import store_user
from reliability import clean_env, navi_serve, peak_rss_mb, rss_mb
from wsproto.events import AcceptConnection, Request, TextMessage

from navi_trio import wire
from navi_trio.api.daemon_client import open_daemon
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow
SID = "mallory.big"
MESSAGES, MESSAGE_CHARS = 30, 1_000_000
CONNECTIONS, REQUESTS = 4, 30
PEAK_OVER_MB = 200  # over the daemon's RSS before the load (was ~3600)
AFTER_OVER_MB = 100  # once the clients are gone (was ~3400)


def _history() -> list[dict[str, str]]:
    return [{"role": ("user", "assistant")[i % 2], "content": chr(97 + i % 26) * MESSAGE_CHARS}
            for i in range(MESSAGES)]  # fmt: skip


async def _write_session(db: Path, user: str) -> None:
    async with SQLiteStore.open(db) as store:
        row = await store.get_user_by_name(user)
        assert row is not None
        await store.create_session(SID, profile_id="general", user_id=row["id"])
        for message in _history():
            await store.append(SID, messages=[message])


async def _deaf(url: str, frames: list[wire.Frame]) -> trio.SocketStream:
    """A WebSocket client that sends `frames` and then never reads: only the handshake's
    answer is read (wsproto over a bare socket, no reader task behind it)."""
    host, port = url.split("//")[1].strip("/").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    await stream.send_all(ws.send(Request(host=f"{host}:{port}", target="/")))
    accepted = False
    while not accepted:
        data = await stream.receive_some()
        assert data, "the daemon closed the connection during the handshake"
        ws.receive_data(data)
        accepted = any(isinstance(e, AcceptConnection) for e in ws.events())
    for frame in frames:
        await stream.send_all(ws.send(TextMessage(data=json.dumps(frame))))
    return stream


async def _read_whole(url: str, token: str) -> list[str]:
    async with open_daemon(url, token) as daemon:
        reply = await daemon.request(wire.history(SID), timeout=60)
    assert reply["next_cursor"] is None
    return [m["content"] for m in reply["messages"]]


async def test_clients_pipelining_history_without_reading_cost_bounded_memory_given_back(
    tmp_path: Path,
) -> None:
    env = clean_env(tmp_path)
    with trio.fail_after(120):
        token = await store_user(env, "mallory")
        await _write_session(Path(env["NAVI_DB"]), "mallory")
        async with (
            open_fake_llm([]) as llm,
            navi_serve(env, llm.url, tmp_path / "serve.log", log_level="info",
                       watch_log=True) as d,
        ):  # fmt: skip
            assert d.log is not None
            expected = [m["content"] for m in _history()]
            assert await _read_whole(d.url, token) == expected
            base = rss_mb(d.pid)

            asks = [wire.hello(token)]
            asks += [{**wire.history(SID), "id": i} for i in range(REQUESTS)]
            deaf = [await _deaf(d.url, asks) for _ in range(CONNECTIONS)]
            # Each connection's outbox is full: the daemon takes no more of its requests.
            await d.log.until("the client is not reading", CONNECTIONS)
            peak = peak_rss_mb(d.pid)

            for stream in deaf:
                await stream.aclose()
            await d.log.until("user mallory disconnected", 1 + CONNECTIONS)
            after = rss_mb(d.pid)
            assert await _read_whole(d.url, token) == expected
    print(
        f"history load: RSS MB before {base:.0f}, peak {peak:.0f}, after the clients "
        f"left {after:.0f} ({CONNECTIONS} connections x {REQUESTS} requests, "
        f"{MESSAGES} x {MESSAGE_CHARS // 1_000_000} MB messages)"
    )
    assert peak - base < PEAK_OVER_MB, f"peak {peak:.0f} MB, before {base:.0f} MB"
    assert after - base < AFTER_OVER_MB, f"after {after:.0f} MB, before {base:.0f} MB"
