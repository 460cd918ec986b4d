"""A peer server on the same load as conc.py: the LangGraph Agent Server, in memory.

    python scripts/bench/langgraph_server.py [--sessions 20] [--words 0 40] [--navi]

What runs, each part in its own process, as conc.py runs navi:

- the fake LLM (``python -m navi_trio.testing.fake_llm``, its OpenAI dialect) with
  conc.py's realistic script: a chunk every 20 ms, `--words` words of text, then one
  ``echo`` call, looping;
- ``langgraph dev --no-reload --no-browser`` (langgraph-api's in-memory server, as
  `langgraph dev` runs it) serving a ReAct graph (`create_react_agent`, ChatOpenAI
  streaming from the fake LLM) with the same ``echo`` tool; ``--n-jobs-per-worker`` is
  the session count, so every run runs at once, as every navi session does;
- the clients: `--sessions` threads, each one run streamed with langgraph-sdk
  (``stream_mode="messages-tuple"``: one event per token chunk, as navi sends one frame
  per delta), 10 rounds each (``recursion_limit`` 21: ten model steps and ten tool
  steps, then an eleventh model step, whose call the graph makes and then ends the run
  for want of steps; its GraphRecursionError is counted as the end, not as an error).

Reported per `--words`: the server's CPU (every process of its tree, /proc) over the
runs, per round (a ``tool`` message streamed back) and, from two word counts, per token:
(CPU per round at the larger count - at the smaller) / the difference in text chunks
per round (the eleventh model call streams its words too: they are counted). With
``--navi``, conc.py runs navi on the same load in the same sitting, alternated, and its
figures are printed beside. Its packages (langgraph-cli[inmem], langgraph-sdk,
langchain-openai) go into a venv of their own, ``scripts/bench/.venv-lgserver`` (made on
first use unless ``--no-install``), never into navi's dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-lgserver"
PACKAGES = ["langgraph-cli[inmem]", "langgraph-sdk", "langchain-openai", "langgraph"]
ROUNDS = 10
START_LIMIT = 120.0  # seconds for the server to say it serves
TICK = os.sysconf("SC_CLK_TCK")

GRAPH = '''
import os

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


@tool
def echo(text: str) -> str:
    """Return the text as it is."""
    return text


model = ChatOpenAI(
    base_url=os.environ["FAKE_LLM_URL"] + "/v1", model="fake-model", api_key="none",
    streaming=True, max_retries=0,
)
graph = create_react_agent(model, [echo])
'''

CLIENT = """
import asyncio, json, sys, time

from langgraph_sdk import get_client

URL, SESSIONS, ROUNDS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


async def one(client, out):
    thread = await client.threads.create()
    async for part in client.runs.stream(
        thread["thread_id"], "agent",
        input={"messages": [{"role": "user", "content": "call echo until told otherwise"}]},
        stream_mode="messages-tuple", config={"recursion_limit": 2 * ROUNDS + 1},
    ):
        if part.event == "messages":
            chunk = part.data[0]
            if chunk.get("type") == "tool":
                out["rounds"] += 1
            elif chunk.get("content"):
                out["text_chunks"] += 1
        elif part.event == "error":
            if part.data.get("error") != "GraphRecursionError":  # the planned end
                out["errors"].append(str(part.data)[:200])


async def main():
    client = get_client(url=URL)
    out = {"rounds": 0, "text_chunks": 0, "errors": []}
    start = time.perf_counter()
    await asyncio.gather(*(one(client, out) for _ in range(SESSIONS)))
    out["seconds"] = time.perf_counter() - start
    print(json.dumps(out), flush=True)


asyncio.run(main())
"""


def ensure_venv(install: bool) -> Path:
    """The bench venv's python, made (with `PACKAGES`) when missing and allowed."""
    python = VENV / "bin" / "python"
    if python.exists():
        return python
    if not install:
        raise SystemExit(f"{VENV} is missing (run without --no-install)")
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, *PACKAGES], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise SystemExit(f"cannot install {PACKAGES}: {why}")
    return python


def _tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and every process below it (Linux /proc)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue  # ended meanwhile
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(proc: subprocess.Popen[str], text: str, limit: float) -> str:
    """Lines of `proc` until one holds `text` (within `limit` seconds); all it said."""
    assert proc.stdout is not None
    said, deadline = [], time.monotonic() + limit
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([proc.stdout], [], [], left)
        line = proc.stdout.readline() if ready else ""
        if not line:
            break
        said.append(line)
        if text in line:
            return "".join(said)
    tail = "".join(said)[-3000:]
    raise RuntimeError(f"no {text!r} within {limit:.0f} s (exit {proc.poll()}):\n{tail}")


def _drain(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for _ in proc.stdout:
        pass


def _stop(proc: subprocess.Popen[str]) -> None:
    """End `proc` and its process group (started with a session of its own)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure(python: Path, sessions: int, words: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from conc import _script  # the same LLM script as navi's realistic pace

    script = _script(argparse.Namespace(pace="realistic", words=words))
    tmp = Path(tempfile.mkdtemp(prefix="navi-lgserver-"))
    procs: list[subprocess.Popen[str]] = []
    try:
        (tmp / "script.json").write_text(json.dumps(script))
        (tmp / "agent.py").write_text(GRAPH)
        (tmp / "client.py").write_text(CLIENT)
        (tmp / "langgraph.json").write_text(
            json.dumps({"dependencies": ["."], "graphs": {"agent": "./agent.py:graph"}})
        )
        fake = subprocess.Popen(
            [sys.executable, "-m", "navi_trio.testing.fake_llm", "--loop", "--script",
             str(tmp / "script.json")], stdout=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        procs.append(fake)
        llm_url = _until(fake, "listening on", 30).split("listening on", 1)[1].strip()
        port = _free_port()
        env = {**os.environ, "FAKE_LLM_URL": llm_url, "LANGSMITH_TRACING": "false",
               "LANGGRAPH_CLI_NO_ANALYTICS": "1", "NO_COLOR": "1"}  # fmt: skip
        server = subprocess.Popen(
            [str(python.parent / "langgraph"), "dev", "--no-browser", "--no-reload",
             "--port", str(port), "--n-jobs-per-worker", str(sessions),
             "--server-log-level", "WARNING"],
            cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        procs.append(server)
        _until(server, "background workers", START_LIMIT)
        # Its log goes on (a line per request): read and dropped, else the pipe fills
        # and the server blocks on a write.
        threading.Thread(target=_drain, args=(server,), daemon=True).start()
        url = f"http://127.0.0.1:{port}"
        # Warm-up: one run (the graph's first call loads what it loads), not measured.
        warm = [str(python), str(tmp / "client.py"), url, "1", str(ROUNDS)]
        subprocess.run(warm, check=True, capture_output=True, timeout=300)
        cpu0, llm0 = _tree_cpu_s(server.pid), _tree_cpu_s(fake.pid)
        done = subprocess.run(
            [str(python), str(tmp / "client.py"), url, str(sessions), str(ROUNDS)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        cpu, llm = _tree_cpu_s(server.pid) - cpu0, _tree_cpu_s(fake.pid) - llm0
        if done.returncode != 0:
            raise RuntimeError(f"the clients failed: {done.stderr[-2000:]}")
        out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        rounds = out["rounds"]
        return {
            "words": words, "sessions": sessions, **out, "server_cpu_s": cpu, "llm_cpu_s": llm,
            "cpu_ms_per_round": 1000 * cpu / rounds if rounds else None,
            "tokens_per_round": out["text_chunks"] / rounds if rounds else None,
            "server_rounds_per_s": rounds / out["seconds"] if out["seconds"] else None,
        }  # fmt: skip
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def navi(sessions: int, words: int) -> dict[str, Any]:
    """conc.py's figures for navi on the same load (this Python, this checkout)."""
    cmd = [sys.executable, str(HERE / "conc.py"), "--sessions", str(sessions), "--pace",
           "realistic", "--words", str(words)]  # fmt: skip
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "words": words, "tokens_per_round": words,
        "cpu_ms_per_round": figures["cpu_ms_per_round"],
        "rounds": figures["rounds"], "p99_gap_in_flow_ms": figures["p99_gap_in_flow_ms"],
        "errors": figures["errors"],
    }  # fmt: skip


def per_token(runs: list[dict[str, Any]]) -> float | None:
    """CPU µs per streamed token: the slope of CPU per round between two word counts."""
    if len(runs) < 2 or any(r["cpu_ms_per_round"] is None for r in runs):
        return None
    low, high = min(runs, key=lambda r: r["words"]), max(runs, key=lambda r: r["words"])
    tokens = float(high["tokens_per_round"] - low["tokens_per_round"])
    if tokens <= 0:
        return None
    return 1000 * float(high["cpu_ms_per_round"] - low["cpu_ms_per_round"]) / tokens


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--words", type=int, nargs="+", default=[0, 40])
    p.add_argument("--navi", action="store_true", help="run conc.py for navi, alternated")
    p.add_argument("--no-install", action="store_true", help="never create the bench venv")
    a = p.parse_args()
    if not 1 <= a.sessions <= 500:
        p.error(f"--sessions must be 1-500, got {a.sessions}")
    python = ensure_venv(not a.no_install)
    peer, ours = [], []
    for words in a.words:
        if a.navi:
            ours.append(navi(a.sessions, words))
        peer.append(measure(python, a.sessions, words))
    out: dict[str, Any] = {
        "langgraph_server": peer, "langgraph_cpu_us_per_token": per_token(peer),
        "cores": os.cpu_count(), "loadavg": os.getloadavg()[0],
    }  # fmt: skip
    if a.navi:
        out |= {"navi": ours, "navi_cpu_us_per_token": per_token(ours)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
