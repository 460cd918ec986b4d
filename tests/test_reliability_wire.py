"""Reliability: hostile frames against a live daemon (issue 11, "Wire fuzzing").

An in-process ApiServer on 127.0.0.1 port 0 (real WebSocket connections) with the fake
LLM. Hypothesis generates frames: JSON that is not an object, objects of the wrong shape,
known types with fields of the wrong types, huge strings, deep nesting, binary frames.
Every frame gets an error frame (naming the problem, echoing a readable id) or its
normal reply; the connection and the daemon go on, and a normal turn works afterwards.

Hypothesis runs in a worker thread and calls back into the trio loop for each example
(`trio.from_thread.run`), so one daemon and one connection serve thousands of frames,
ten different ones to an example: hypothesis's own work for an example costs more than a
frame's round trip, and is paid once for ten (of 2000 frames, about 1,700 differ, where
2000 examples of one frame gave about 1,900). ``NAVI_FUZZ_EXAMPLES`` sets the count of
frames (2000 over the whole file; a fifth in the quick run, tests/quick_run.py).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import trio
import wsproto
import wsproto.events
from api_ws import Client, open_daemon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quick_run import examples
from trio_websocket import ConnectionClosed

from navi_trio.api.protocol import COMMANDS

EXAMPLES = int(os.environ.get("NAVI_FUZZ_EXAMPLES", str(examples(2000))))
TIMEOUT = 240
BATCH = 10  # fuzz frames per hypothesis example
MAX_BYTES = 16 * 1024  # ws_frame_max_bytes for these tests: huge strings stay cheap
KNOWN = sorted(COMMANDS)
FIELDS = ["content", "session_id", "cwd", "profile", "last_seq", "epoch", "action",
          "task_id", "token", "decision"]  # fmt: skip

json_leaf = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=40)
)  # fmt: skip
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
frame_id = st.none() | st.text(max_size=20) | st.integers() | st.booleans() | st.floats()


def _with_id(obj: dict[str, Any], rid: Any) -> dict[str, Any]:
    return obj if rid is None else {**obj, "id": rid}


# Each case: (what to send, must it be refused?)
not_an_object = json_value.filter(lambda v: not isinstance(v, dict)).map(
    lambda v: (json.dumps(v), True)
)
not_json = st.text(max_size=60).filter(lambda s: not _is_json(s)).map(lambda s: (s, True))
bad_type = st.builds(
    lambda body, t, rid: (json.dumps(_with_id({**body, "type": t}, rid)), True),
    st.dictionaries(st.sampled_from(FIELDS), json_value, max_size=3),
    json_value.filter(
        lambda t: not (isinstance(t, str) and (t in COMMANDS or t in ("approve", "deny")))
    ),
    frame_id,
)
wrong_fields = st.builds(
    lambda t, body, rid: (json.dumps(_with_id({**body, "type": t}, rid)), False),
    st.sampled_from(KNOWN + ["approve", "deny"]),
    st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), json_value, max_size=4),
    frame_id,
)
huge = st.builds(
    lambda n, t: (json.dumps({"type": t, "content": "x" * n, "session_id": "s"}), True),
    st.integers(MAX_BYTES, 3 * MAX_BYTES),
    st.sampled_from(KNOWN),
)
deep = st.builds(
    lambda n, open_, close: (open_ * n + close * n, True),
    st.integers(100, 20_000),
    st.just("["),
    st.just("]"),
) | st.integers(100, 5_000).map(lambda n: ('{"a":' * n + "1" + "}" * n, True))
binary = st.binary(max_size=200).map(lambda b: (b, True))
CASES = not_an_object | not_json | bad_type | wrong_fields | huge | deep | binary


def _is_json(s: str) -> bool:
    try:
        json.loads(s)
    except ValueError:
        return False
    return True


def _fast(tmp_path: Path, **kw: Any) -> Any:
    return open_daemon(
        tmp_path, replies=[{"text": "Hello there"}], loop=True, ws_frames_per_sec=1e9,
        ws_frames_burst=10**9, ws_frame_max_bytes=MAX_BYTES, **kw,
    )  # fmt: skip


async def _normal_turn(c: Client, text: str = "hello after the storm") -> None:
    created = await c.request({"type": "message", "content": text})
    assert created["type"] == "session", created
    end = await c.until_end(created["session_id"])
    assert (end["reason"], end["text"]) == ("complete", "Hello there"), end


class _Prober:
    """Sends one fuzz frame, then a ping; the frames in between are its answers."""

    def __init__(self, client: Client) -> None:
        self.c = client
        self.n = 0
        self.refused = 0

    async def probe(self, message: str | bytes, must_refuse: bool) -> None:
        self.n += 1
        ping = f"zz-ping-{self.n}"
        await self.c.ws.send_message(message)
        await self.c.send({"type": "sessions", "action": "list", "id": ping})
        between: list[dict[str, Any]] = []
        while True:
            frame = await self.c.next()
            assert isinstance(frame, dict) and isinstance(frame.get("type"), str), frame
            if frame.get("id") == ping:
                assert frame["type"] != "error", frame
                break
            between.append(frame)
        errors = [f for f in between if f["type"] == "error"]
        for err in errors:
            assert err["code"] != "internal", (message[:200], err)
            assert isinstance(err["message"], str) and len(err["message"]) > 5, err
        if must_refuse:
            assert errors, (message[:200], between)
        self.refused += bool(errors)

    async def probe_all(self, cases: list[tuple[str | bytes, bool]]) -> None:
        for case in cases:
            await self.probe(*case)


def _run_hypothesis(prober: _Prober, token: trio.lowlevel.TrioToken, n: int) -> None:
    """At least `n` fuzz frames, `BATCH` to an example."""

    @settings(
        max_examples=-(-n // BATCH), deadline=None, database=None, derandomize=False,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(st.lists(CASES, min_size=BATCH, max_size=BATCH, unique=True))
    def check(cases: list[tuple[str | bytes, bool]]) -> None:
        trio.from_thread.run(prober.probe_all, cases, trio_token=token)

    check()


async def test_fuzzed_frames_are_refused_and_the_daemon_goes_on(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with _fast(tmp_path) as d, d.connect("alice") as c:
            prober = _Prober(c)
            token = trio.lowlevel.current_trio_token()
            await trio.to_thread.run_sync(_run_hypothesis, prober, token, EXAMPLES)
            assert prober.n >= EXAMPLES and prober.refused > EXAMPLES // 2
            await _normal_turn(c)
            async with d.connect("bob") as other:
                await _normal_turn(other, "a second connection works too")


async def test_deep_nesting_is_a_bad_frame_not_an_internal_error(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with _fast(tmp_path) as d, d.connect("alice") as c:
            await c.send("[" * 5000 + "]" * 5000)
            err = await c.next()
            assert err["type"] == "error" and err["code"] == "bad_frame", err
            assert "deep" in err["message"], err
            await _normal_turn(c)


async def test_a_frame_over_the_hard_limit_closes_only_that_connection(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with _fast(tmp_path) as d:
            async with d.connect("alice") as c:
                await c.send(json.dumps({"type": "message", "content": "x" * (5 * MAX_BYTES)}))
                with pytest.raises(ConnectionClosed):
                    while True:
                        await c.next()
            async with d.connect("alice") as c:
                await _normal_turn(c)


def _raw_text_frame(port: int, payload: bytes) -> int | None:
    """Open a WebSocket by hand and send one TEXT frame whose payload is not UTF-8 (no
    client library lets you); the close code the server sends, None if it just hangs up."""
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(ws.send(wsproto.events.Request(host="127.0.0.1", target="/")))
        accepted = False
        code = None
        while code is None:
            data = sock.recv(65536)
            if not data:
                return None
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, wsproto.events.AcceptConnection):
                    accepted = True
                    # A masked text frame (opcode 1) with the raw payload.
                    mask = b"\x01\x02\x03\x04"
                    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
                    header = bytes([0x81, 0x80 | len(payload)]) + mask
                    sock.sendall(header + body)
                elif isinstance(event, wsproto.events.CloseConnection):
                    code = event.code
        assert accepted
        return code


@pytest.mark.parametrize("payload", [b"\xff\xfe", b'{"type": "\xc3\x28"}', b"\xed\xa0\x80"])
async def test_invalid_utf8_text_closes_only_that_connection(
    tmp_path: Path, payload: bytes
) -> None:
    # RFC 6455 8.1: a text frame that is not UTF-8 fails the connection (1007). Only that
    # connection: the daemon and the others go on. trio-websocket hangs up without a
    # close frame (seen here with trio-websocket 0.12): either is a closed connection.
    with trio.fail_after(30):
        async with _fast(tmp_path) as d, d.connect("alice") as c:
            code = await trio.to_thread.run_sync(_raw_text_frame, d.port, payload)
            assert code in (1007, None)
            await _normal_turn(c)
