"""The floor under conc.py's per-token figure: the smallest trio relay doing the same job.

    python scripts/bench/relay_floor.py --sessions 20 --words 40 [--json]

What a streamed token needs and nothing else: one process (``relay_floor.py relay``)
serves WebSocket clients with trio-websocket; for each client it runs 10 rounds, each one
streaming POST to the fake LLM (``python -m navi_trio.testing.fake_llm``, Ollama NDJSON
over h11 on one kept-alive connection, the same script as ``conc.py --pace realistic``:
`--words` words then one ``echo`` call, a chunk every 20 ms), and per chunk parses its
JSON line, builds a small frame, encodes it and writes one WebSocket frame. No store,
no history, no seq, no replay.

Each part in its own process, as in conc.py (the fake LLM, the relay, the clients), and
the relay's CPU is read from /proc. It runs twice, with no words and with `--words`, and
reports the relay's CPU per round of each and per token, defined as conc.py's pair:
``(cpu_per_round(words) - cpu_per_round(0)) / words``. Prints one JSON object (``--json``)
or a line of text.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conc import REALISTIC_S, _cpu_s, _line, _spawn, _tell, stop_all  # noqa: E402

ROUNDS = 10  # LLM calls per session, as conc.py's sessions run


def _script(words: int) -> list[dict[str, Any]]:
    text = " ".join(f"word{i}" for i in range(words))
    return [{
        "text": text, "tool_calls": [{"name": "echo", "arguments": {"text": "ping"}}],
        "delay_first": REALISTIC_S, "delay_chunk": REALISTIC_S,
    }]  # fmt: skip


def _frame(chunk: dict[str, Any]) -> str:
    """One NDJSON chunk as a small JSON frame (an event's text, its calls, done)."""
    msg = chunk.get("message", {})
    frame = {"type": "delta", "text": msg.get("content", ""), "tools": msg.get("tool_calls"),
             "done": chunk["done"]}  # fmt: skip
    return json.dumps(frame, separators=(",", ":"))


async def _relay_rounds(ws: Any, host: str, port: int) -> None:
    """One client's session: ROUNDS streamed LLM calls, one frame per chunk, then "end"."""
    import h11
    import trio

    stream = await trio.open_tcp_stream(host, port)
    conn = h11.Connection(h11.CLIENT)
    body = json.dumps({
        "model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}],
    }).encode()  # fmt: skip
    async with stream:
        for _ in range(ROUNDS):
            headers = [("host", host), ("content-type", "application/json"),
                       ("content-length", str(len(body)))]  # fmt: skip
            out = conn.send(h11.Request(method="POST", target="/api/chat", headers=headers))
            out += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
            await stream.send_all(out)
            pending = b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                    continue
                if isinstance(event, h11.Data):
                    pending += event.data
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.strip():
                            await ws.send_message(_frame(json.loads(line)))
                elif isinstance(event, h11.EndOfMessage):
                    break
            conn.start_next_cycle()
    await ws.send_message('{"type":"end"}')


async def relay(url: str) -> None:
    """Serve WebSocket clients on 127.0.0.1: each "go" runs its rounds; prints the port."""
    import trio
    from trio_websocket import serve_websocket

    llm = url.split("//", 1)[1].split("/", 1)[0]
    host, port = llm.rsplit(":", 1)

    async def handler(request: Any) -> None:
        ws = await request.accept()
        await ws.get_message()
        await _relay_rounds(ws, host, int(port))

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        print(server.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)
        nursery.cancel_scope.cancel()


async def clients(port: int, count: int) -> None:
    """`count` clients: connect, say ``ready``; on ``go`` each asks and reads to "end"."""
    import trio
    from trio_websocket import open_websocket_url

    async with trio.open_nursery() as nursery:
        go = trio.Event()
        done = 0

        async def one(task_status: Any) -> None:
            nonlocal done
            url = f"ws://127.0.0.1:{port}/"
            async with open_websocket_url(url) as ws:
                task_status.started()
                await go.wait()
                await ws.send_message("go")
                while await ws.get_message() != '{"type":"end"}':
                    pass
                done += 1

        for _ in range(count):
            await nursery.start(one)
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        go.set()
    print(json.dumps({"done": done, "cpu_s": time.process_time()}), flush=True)


def measure_one(sessions: int, words: int, timeout: float) -> dict[str, Any]:
    """One run: the relay's CPU per round for `sessions` sessions of ROUNDS rounds."""
    import shutil
    import subprocess
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="relay-floor-"))
    procs: list[subprocess.Popen[str]] = []
    try:
        script = tmp / "script.json"
        script.write_text(json.dumps(_script(words)))
        fake = _spawn(["-m", "navi_trio.testing.fake_llm", "--loop", "--script", str(script)])
        procs.append(fake)
        url = _line(fake, 30, "the fake LLM server").split("listening on", 1)[1].strip()
        server = _spawn(["relay_floor.py", "relay", "--url", url])
        procs.append(server)
        port = _line(server, 30, "the relay").strip()
        group = _spawn(["relay_floor.py", "clients", "--port", port, "--count", str(sessions)])
        procs.append(group)
        if _line(group, 60, "the clients").strip() != "ready":
            raise RuntimeError("the clients did not connect")
        cpu0, t0 = _cpu_s(server.pid), time.monotonic()
        _tell(group, "go")
        result = json.loads(_line(group, timeout, "the clients"))
        cpu, wall = _cpu_s(server.pid) - cpu0, time.monotonic() - t0
        rounds = result["done"] * ROUNDS
        return {"words": words, "rounds": rounds, "seconds": wall, "cpu_s": cpu,
                "cpu_ms_per_round": 1000 * cpu / max(rounds, 1)}  # fmt: skip
    finally:
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("what", nargs="?", default="measure", choices=["measure", "relay", "clients"])
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--words", type=int, default=40)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", action="store_true", help="one JSON object, as conc.py prints")
    p.add_argument("--url", default="")  # relay (internal): the fake LLM
    p.add_argument("--port", type=int, default=0)  # clients (internal): the relay's port
    p.add_argument("--count", type=int, default=1)
    a = p.parse_args()
    import trio

    if a.what == "relay":
        trio.run(relay, a.url)
        return 0
    if a.what == "clients":
        trio.run(clients, a.port, a.count)
        return 0
    if a.words < 1:
        p.error("--words: at least 1 (the per-token figure is the difference to 0 words)")
    none = measure_one(a.sessions, 0, a.timeout)
    some = measure_one(a.sessions, a.words, a.timeout)
    per_token_us = 1000 * (some["cpu_ms_per_round"] - none["cpu_ms_per_round"]) / a.words
    out = {"sessions": a.sessions, "words": a.words, "runs": [none, some],
           "cpu_ms_per_round_0": none["cpu_ms_per_round"],
           "cpu_ms_per_round_words": some["cpu_ms_per_round"],
           "cpu_us_per_token": per_token_us}  # fmt: skip
    if a.json:
        print(json.dumps(out))
    else:
        print(f"relay floor, {a.sessions} sessions: {none['cpu_ms_per_round']:.2f} ms per round "
              f"(0 words), {some['cpu_ms_per_round']:.2f} ms ({a.words} words): "
              f"{per_token_us:.0f} µs per token")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
