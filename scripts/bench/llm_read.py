"""The LLM read of a streamed token, alone: a backend's chunks drained in one process.

    python scripts/bench/llm_read.py [--streams 20] [--rounds 10] [--words 40] [--pace 0.005]
    python scripts/bench/llm_read.py --guard   # through the stream guard, as a turn reads

What conc.py's per-token figure holds on the model's side and nothing after it: the
backend the daemon makes (`make_client`, `make_backend`: Ollama NDJSON over navi's h11
transport) streams the fake LLM's answer (``python -m navi_trio.testing.fake_llm``, its
own process, a chunk every `--pace` seconds so that each chunk is a read of its own),
`--streams` streams at once, `--rounds` requests each, and this process only takes the
chunks (no events; no guard unless `--guard`: then the chunks come through
`guarded_stream` with the default timeouts, as a turn takes them). Its CPU per chunk is
read as conc.py's pair:
``(cpu(words) - cpu(0)) / (words * streams * rounds)``, the socket's wait, its read, h11,
the body's generators, the line splitter and the parser. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conc import _line, _spawn, stop_all  # noqa: E402

from navi_trio.llm.base import ChatRequest, LLMChunk  # noqa: E402
from navi_trio.llm.factory import make_backend, make_client  # noqa: E402
from navi_trio.llm.guard import guarded_stream  # noqa: E402
from navi_trio.settings import Settings  # noqa: E402


def _script(words: int, pace: float) -> list[dict[str, Any]]:
    text = " ".join(f"word{i}" for i in range(words))
    return [{"text": text, "delay_first": pace, "delay_chunk": pace}]


async def _drain(url: str, streams: int, rounds: int, guard: bool) -> tuple[float, int]:
    """CPU seconds of this process while `streams` streams take `rounds` answers each."""
    import attrs

    settings = attrs.evolve(Settings(), llm_url=url, llm_backend="ollama", llm_transport="h11")
    client = make_client(settings)
    backend = make_backend(settings, client)
    request = ChatRequest(messages=[{"role": "user", "content": "go"}], model="m")
    chunks = 0

    def stream_chat() -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[LLMChunk]]:
        if not guard:
            return backend.stream_chat(request)
        first, later = settings.first_chunk_timeout, settings.chunk_timeout
        return guarded_stream(backend, request, first_chunk_timeout=first, chunk_timeout=later)

    async def one() -> None:
        nonlocal chunks
        for _ in range(rounds):
            async with stream_chat() as stream:
                async for _chunk in stream:
                    chunks += 1

    await one()  # a warm connection, the code loaded
    chunks = 0
    cpu0 = time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(one)
    cpu = time.process_time() - cpu0
    await backend.aclose()
    return cpu, chunks


def measure_one(words: int, a: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="llm-read-"))
    procs = []
    try:
        script = tmp / "script.json"
        script.write_text(json.dumps(_script(words, a.pace)))
        fake = _spawn(["-m", "navi_trio.testing.fake_llm", "--loop", "--script", str(script)])
        procs.append(fake)
        url = _line(fake, 30, "the fake LLM server").split("listening on", 1)[1].strip()
        cpu, chunks = trio.run(_drain, url, a.streams, a.rounds, a.guard)
        return {"words": words, "cpu_s": cpu, "chunks": chunks}
    finally:
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--words", type=int, default=40)
    p.add_argument("--pace", type=float, default=0.005, help="seconds before each chunk")
    p.add_argument("--guard", action="store_true", help="through the stream guard")
    a = p.parse_args()
    none, some = measure_one(0, a), measure_one(a.words, a)
    tokens = a.words * a.streams * a.rounds
    per_token = (some["cpu_s"] - none["cpu_s"]) / tokens
    out = {"streams": a.streams, "rounds": a.rounds, "words": a.words, "pace": a.pace,
           "guard": a.guard,
           "cpu_s": [none["cpu_s"], some["cpu_s"]], "chunks": [none["chunks"], some["chunks"]],
           "us_per_token": round(per_token * 1e6, 2)}  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
