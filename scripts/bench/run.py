"""navi_trio benchmarks side by side with peer frameworks (issue 11). Not in CI.

    python scripts/bench/run.py [--quick] [--only loop,stop,...] [--out DIR]

Creates scripts/bench/.venv on first use (navi_trio from this checkout, httpx, ollama,
LangGraph + langchain-ollama + its SqliteSaver, pydantic-ai, openai-agents, matplotlib,
each installed separately from PyPI: one that fails is reported "unavailable: why", the
rest go on). Every runner is its own process talking to navi_trio's fake LLM server
(``python -m navi_trio.testing.fake_llm``, its own process, 127.0.0.1, zero latency unless
stated). Every loop figure is the median over several runs after one warm-up run, and
every ratio is between figures of this same run. Prints a table, writes results.json and
(with matplotlib) bench.png into --out (default scripts/bench/out/, git-ignored).

This file uses the standard library only; what runs in the bench venv lives beside it:
peers.py (the peer loops), navi_runs.py, navi_more.py and conc.py (navi_trio's side),
chart.py.
Everything is bounded: each child process has a timeout, each loop a fixed round count.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VENV = HERE / ".venv"
PY = VENV / "bin" / "python"
PEERS = {
    "httpx": ["httpx"],
    "ollama": ["ollama"],
    "langgraph": ["langgraph", "langchain-ollama", "langgraph-checkpoint-sqlite"],
    "pydantic_ai": ["pydantic-ai-slim[openai]"],
    "openai_agents": ["openai-agents"],
    "matplotlib": ["matplotlib"],
    "py-spy": ["py-spy"],
}
NEEDS = {
    "ollama_client": "ollama",
    "langgraph_memory": "langgraph",
    "langgraph_sqlite": "langgraph",
    "pydantic_ai": "pydantic_ai",
    "openai_agents": "openai_agents",
}
LOOP_RUNNERS = [
    "plain_httpx", "ollama_client", "navi_inproc", "navi_ws", "navi_ws_metrics", "langgraph_memory",
    "langgraph_sqlite", "pydantic_ai", "openai_agents",
]  # fmt: skip


def echo_call() -> dict[str, Any]:
    return {"tool_calls": [{"name": "echo", "arguments": {"text": "ping"}}]}


def ensure_venv(install: bool) -> dict[str, str]:
    """Create the bench venv if missing; {peer group: "" or why it is unavailable}."""
    marker = VENV / "bench-installed.json"
    if marker.exists():
        status: dict[str, str] = json.loads(marker.read_text())
        if not install or all(k in status for k in PEERS):
            return status
    if not install:
        return {k: "bench venv missing (run without --no-install)" for k in PEERS}
    if not PY.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(PY), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-e", str(REPO)], check=True)
    status = {}
    for group, pkgs in PEERS.items():
        done = subprocess.run([*pip, *pkgs], capture_output=True, text=True, timeout=900)
        why = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        status[group] = "" if done.returncode == 0 else f"pip install failed: {why[:200]}"
    marker.write_text(json.dumps(status, indent=1))
    return status


@contextmanager
def fake_server(replies: list[dict[str, Any]]) -> Iterator[str]:
    """The fake LLM server in its own process, looping over `replies`; yields its URL."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(replies, f)
    proc = subprocess.Popen(
        [str(PY), "-m", "navi_trio.testing.fake_llm", "--port", "0", "--loop", "--script",
         f.name],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        if "listening on" not in line:
            raise RuntimeError(f"fake LLM server did not start: {line!r}")
        yield line.split("listening on", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(10)
        os.unlink(f.name)


def child(args: list[str], timeout: float) -> dict[str, Any]:
    """Run one measurement process in the bench venv; its last stdout line is JSON."""
    try:
        done = subprocess.run(
            [str(PY), *args], capture_output=True, text=True, timeout=timeout, cwd=HERE
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
        return result
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail[:300]}"}


def loop_runner(name: str, url: str, rounds: int, reps: int, timeout: float, **kw: Any) -> Any:
    if name.startswith("navi"):
        mode = "ws" if name.startswith("navi_ws") else "inproc"
        extra = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
        if name.endswith("_metrics"):  # the daemon's metrics on, as navi serve has them
            extra.append("--metrics")
        return child(
            ["navi_runs.py", "loop", "--mode", mode, "--url", url, "--rounds", str(rounds),
             "--reps", str(reps), *extra], timeout,
        )  # fmt: skip
    return child(
        ["peers.py", name, "--url", url, "--rounds", str(rounds), "--reps", str(reps)], timeout
    )


def summarize_loop(result: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Medians over the runs after the first (the warm-up)."""
    if "error" in result:
        return {"error": result["error"]}
    runs = [r for r in result["runs"] if r]
    kept = runs[1:] if len(runs) > 1 else runs
    if not kept or any(len(r) != rounds for r in kept):
        return {"error": f"expected {rounds} rounds, got {[len(r) for r in runs]}"}
    per_round = [statistics.median(r[i] for r in kept) for i in range(rounds)]
    cpu = [r for r in result.get("cpu", []) if len(r) == rounds]
    cpu = cpu[1:] if len(cpu) > 1 else cpu
    return {
        "cpu_ms_per_round": statistics.median(statistics.mean(r) for r in cpu) if cpu else None,
        "cpu_first10": statistics.median(statistics.mean(r[:10]) for r in cpu) if cpu else None,
        "cpu_last10": statistics.median(statistics.mean(r[-10:]) for r in cpu) if cpu else None,
        "cpu_curve": [statistics.median(r[i] for r in cpu) for i in range(rounds)] if cpu else [],
        "ms_per_round": statistics.median(statistics.mean(r) for r in kept),
        "first10": statistics.median(statistics.mean(r[:10]) for r in kept),
        "last10": statistics.median(statistics.mean(r[-10:]) for r in kept),
        "curve": per_round,
        "runs": len(kept),
        **({"compressions": result["compressions"]} if "compressions" in result else {}),
    }


def bench_loop(status: dict[str, str], rounds: int, reps: int, runners: list[str]) -> Any:
    out: dict[str, Any] = {}
    script = [echo_call()] * rounds + [{"text": "done"}]
    for name in runners:
        why = status.get(NEEDS.get(name, "httpx"), "")
        if why:
            out[name] = {"error": f"unavailable: {why}"}
            continue
        with fake_server(script) as url:
            res = loop_runner(name, url, rounds, reps + 1, timeout=60 + rounds * reps * 0.2)
        out[name] = summarize_loop(res, rounds)
        s = out[name]
        shown = s.get("error") or f"{s['ms_per_round']:.2f} ms/round"
        print(f"  loop{rounds} {name}: {shown}", flush=True)
    return out


def bench_loop_long(status: dict[str, str], rounds: int) -> Any:
    out: dict[str, Any] = {}
    script = [echo_call()] * rounds + [{"text": "done"}]
    # Compression asks the same fake server for a summary and takes the next reply: with
    # text beside the tool call every reply also serves as a summary (so each
    # compression costs one tool round: the figure is per tool round actually run).
    summary = [{"text": "summary of the work so far", **echo_call()}] * rounds
    plan = [
        ("navi_inproc", {}, script),
        ("navi_inproc_compression", {"num_ctx": 4096}, [*summary, {"text": "done"}]),
        ("langgraph_memory", {}, script),
    ]
    for label, kw, replies in plan:
        name = label.replace("_compression", "")
        if status.get(NEEDS.get(name, "httpx")):
            out[label] = {"error": f"unavailable: {status[NEEDS[name]]}"}
            continue
        # navi_trio warms up once first (a process's first rounds load the token encoding
        # in a thread, and its CPU would count in rounds 1-10); the first run is dropped.
        reps = 2 if name.startswith("navi") else 1
        with fake_server(replies) as url:
            res = loop_runner(name, url, rounds, reps, timeout=120 + rounds * 0.1 * reps, **kw)
        if "error" not in res and label.endswith("compression"):
            # Compression's own LLM calls take replies from the script: fewer tool rounds.
            got = len(res["runs"][-1])
            res["runs"] = [res["runs"][-1][: got - got % 10]]
            res["cpu"] = [res["cpu"][-1][: got - got % 10]] if res.get("cpu") else []
            out[label] = summarize_loop(res, len(res["runs"][0]))
            out[label]["tool_rounds"] = got
        else:
            out[label] = summarize_loop(res, rounds)
        s = out[label]
        shown = s.get("error") or f"{s['first10']:.2f} -> {s['last10']:.2f} ms/round"
        print(f"  loop{rounds} {label}: {shown}", flush=True)
    return out


def bench_stream(words: int) -> Any:
    text = " ".join(f"w{i}" for i in range(words))
    out: dict[str, Any] = {}
    with fake_server([{"text": text}]) as url:
        out["plain_httpx"] = child(["peers.py", "stream_httpx", "--url", url], 300)
        out["navi_ws"] = child(["navi_runs.py", "stream", "--url", url], 300)
    return out


def bench_concurrency(counts: list[int]) -> Any:
    """conc.py: the fake LLM server, the daemon and the clients each in its own process."""
    out: dict[str, Any] = {}
    for n in counts:
        r = child(["conc.py", "--sessions", str(n), "--timeout", "540"], 600)
        out[str(n)] = r
        print(f"  concurrency {n}: {r}", flush=True)
    with fake_server([{"text": "x"}]) as url:
        out["idle"] = child(["navi_runs.py", "idle_rss", "--url", url, "--sessions", "300"], 300)
    return out


def bench_whatif(reps: int) -> Any:
    """The same navi loops with the store's fsync off: what one commit per round costs."""
    out: dict[str, Any] = {}
    script = [echo_call()] * 50 + [{"text": "done"}]
    for sync in ("FULL", "OFF"):
        with fake_server(script) as url:
            res = loop_runner("navi_inproc", url, 50, reps + 1, 120, sync=sync)
        out[f"loop50_sync_{sync}"] = summarize_loop(res, 50)
    for sync in ("FULL", "OFF"):
        out[f"concurrency100_sync_{sync}"] = child(
            ["conc.py", "--sessions", "100", "--timeout", "240", f"--sync={sync}"], 300
        )
    print(f"  what-if: {json.dumps(out)[:300]}", flush=True)
    return out


def bench_startup(tries: int) -> Any:
    """`navi serve` until it accepts; `navi run` until its first byte reaches the LLM.

    startup.py beside this file: fresh data each try, after one warm-up, from bytecode.
    """
    from startup import measure  # noqa: I001  (beside this file)

    navi = VENV / "bin" / "navi"  # without the bench venv: this Python, this checkout
    cmd = [str(navi)] if navi.exists() else [sys.executable, "-m", "navi_trio"]
    return measure(cmd, tries, cwd=str(REPO))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer runs and sizes (~1-2 min)")
    p.add_argument(
        "--only", default="", help="comma list: loop,long,stop,stream,conc,growth,whatif,start"
    )
    p.add_argument("--out", type=Path, default=HERE / "out")
    p.add_argument("--no-install", action="store_true", help="never create the bench venv")
    p.add_argument(
        "--merge", action="store_true", help="update the sections run in OUT/results.json"
    )
    a = p.parse_args()
    only = set(filter(None, a.only.split(",")))

    def want(k: str) -> bool:
        return not only or k in only

    status = ensure_venv(not a.no_install)
    q = a.quick
    res: dict[str, Any] = {
        "quick": q,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    res["unavailable"] = {k: v for k, v in status.items() if v}
    load0 = [round(x, 2) for x in os.getloadavg()]
    t0 = time.perf_counter()
    if want("loop"):
        res["loop50"] = bench_loop(status, 50, 2 if q else 5, LOOP_RUNNERS)
    if want("long"):
        res["loop_long"] = bench_loop_long(status, 100 if q else 500)
    if want("stop"):
        res["stop"] = child(["navi_more.py", "stop", "--tries", "10" if q else "50"], 600)
    if want("stream"):
        res["stream"] = bench_stream(20_000 if q else 100_000)
    if want("conc"):
        res["concurrency"] = bench_concurrency([10, 50] if q else [10, 100, 500])
    if want("growth"):
        res["growth"] = child(["navi_more.py", "growth"] + (["--quick"] if q else []), 600)
    if want("whatif"):
        res["whatif"] = bench_whatif(1 if q else 5)
    if want("start"):
        res["startup"] = bench_startup(3 if q else 11)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["loadavg"] = [load0, [round(x, 2) for x in os.getloadavg()], os.cpu_count()]
    a.out.mkdir(parents=True, exist_ok=True)
    old = a.out / "results.json"
    if a.merge and old.exists():
        res = {**json.loads(old.read_text()), **res, "merged": True}
    (a.out / "results.json").write_text(json.dumps(res, indent=1))
    from report import table  # noqa: I001  (beside this file)

    print(table(res))
    drawn = subprocess.run([str(PY), str(HERE / "chart.py"), str(a.out)], capture_output=True,
                           text=True)  # fmt: skip
    print(drawn.stdout.strip() or drawn.stderr.strip()[-300:])
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
