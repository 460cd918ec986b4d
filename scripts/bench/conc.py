"""Benchmark 4, concurrency: N sessions each running a 10-round tool loop at once.

    python scripts/bench/conc.py --sessions 500 [--client-procs 2] [--py-spy OUT.txt]
    python scripts/bench/conc.py --sessions 500 --daemons 2 [--pg postgresql://…]
    python scripts/bench/conc.py --sessions 50 --pace realistic [--transport h11|httpx]

Every part in its own process, so that neither the CPU nor the figures of one are
charged to another: the fake LLM server (``python -m navi_trio.testing.fake_llm``, 5 ms
before each chunk), the daemon (``conc.py daemon``: the full runtime with the bench
profile and an ApiServer on 127.0.0.1) and the WebSocket clients (``conc.py clients``,
split over ``--client-procs`` processes). Each session runs exactly 10 rounds: the LLM
always answers one ``echo`` call and the bench profile stops at ``max_iterations`` 10.

The clients connect and say hello first; then all start at once. A client records the
gap between consecutive frames of its session, from the ``ok`` of its message to
``stream_end``. Reported: rounds/s over the whole run, p50/p99/max gap (and p99 without
each session's first gap, the start when all ask at once), the CPU seconds
and utilisation (CPU s / wall s; 1.0 = one core busy throughout) of the daemon, the
clients and the fake server, the daemon's RSS before the run (everyone connected) and
its peak. ``--py-spy OUT`` samples the daemon alone (``py-spy record --threads``,
collapsed stacks) while the sessions run. Prints one JSON object.

``--pace realistic`` (issue 20): the LLM streams as a served model does, 50 tokens/s (20
ms before every chunk, the first included): `--words` words of text, then the one
``echo`` call. Beside rounds/s and the gaps it reports ``cpu_ms_per_round`` (the
daemon's CPU over the rounds: the cost of a round once waiting is no part of it).
``--transport`` picks the daemon's LLM transport (NAVI_LLM_TRANSPORT; default: the
setting's default).

The gaps in flow are of two kinds that a user sees differently, each with its p99 beside
the whole one: in a stream (a text delta after a text delta: the answer as it is
typed) and at a round's end (every other gap: the end of the model's stream, the
round's saves, the tool, the next request and the model's wait before its first word).

``--phases`` (realistic pace, bench only): the daemon notes the collector's passes,
how late its trio loop runs and each round's parts (conc_parts.py `Probe`); reported
under "phases": the collector's pauses per generation, their share of the gaps in flow
over ``--limit-ms``, and a round end split into its parts (p50 / p99 of each).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
SLOW = {"delay_first": 0.005, "delay_chunk": 0.005}
ECHO = {"tool_calls": [{"name": "echo", "arguments": {"text": "ping"}}], **SLOW}
TICK = os.sysconf("SC_CLK_TCK")
REALISTIC_S = 0.020  # 50 tokens/s: one chunk (a word) each 20 ms
REALISTIC_WORDS = 10  # text words before each round's tool call


def _script(a: argparse.Namespace) -> list[dict[str, Any]]:
    """The LLM's one looping reply: `ECHO` at the bench's fast pace, or (``--pace
    realistic``) `--words` words of text then the call, a chunk every 20 ms."""
    if a.pace == "fast":
        return [ECHO]
    text = " ".join(f"word{i}" for i in range(a.words))
    pace = {"delay_first": REALISTIC_S, "delay_chunk": REALISTIC_S}
    return [{"text": text, "tool_calls": ECHO["tool_calls"], **pace}]


def _pace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pace", default="fast", choices=["fast", "realistic"])
    p.add_argument("--words", type=int, default=REALISTIC_WORDS, help="realistic: words/round")
    p.add_argument("--transport", default="", help="the daemon's NAVI_LLM_TRANSPORT")


def _daemon_pace(a: argparse.Namespace) -> list[str]:
    """The daemon's arguments that the pace mode adds."""
    return [f"--transport={a.transport}"] if a.transport else []


def _pace_figures(a: argparse.Namespace, rounds: int, cpu: dict[str, float]) -> dict[str, Any]:
    """The pace mode's own figures: what ran, and the daemon's CPU per round."""
    return {
        "pace": a.pace, "words": a.words if a.pace == "realistic" else 0,
        "transport": a.transport or "default",
        "cpu_ms_per_round": 1000 * cpu["daemon"] / rounds if rounds else None,
    }  # fmt: skip


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included)."""
    return _cpu_s_of(Path(f"/proc/{pid}/stat"))


def _main_thread_s(pid: int) -> float:
    """CPU seconds of a process's main thread alone (trio's: the rest is worker threads)."""
    return _cpu_s_of(Path(f"/proc/{pid}/task/{pid}/stat"))


def _cpu_s_of(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _line(proc: subprocess.Popen[str], timeout: float, what: str) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if line:
        return line
    if not ready:
        raise RuntimeError(f"{what} said nothing within {timeout:.0f} s (exit {proc.poll()})")
    try:  # its output ended: it is exiting, its traceback on stderr
        code: int | None = proc.wait(10)
    except subprocess.TimeoutExpired:
        code = None
    raise RuntimeError(f"{what} closed its output without a line (exit {code})")


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=HERE,
    )  # fmt: skip


def _tell(proc: subprocess.Popen[str], text: str) -> None:
    stdin: IO[str] | None = proc.stdin
    assert stdin is not None
    stdin.write(text + "\n")
    stdin.flush()


def stop_all(procs: list[subprocess.Popen[str]]) -> None:
    """End a run's processes: the first (the fake LLM) is terminated, the others end
    when their stdin closes; killed after 15 s."""
    for p in reversed(procs):
        if p.stdin is not None:
            p.stdin.close()
    for p in reversed(procs):
        if p is procs[0]:
            p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _pcts(gaps: list[float]) -> dict[str, float]:
    s = sorted(gaps)
    return {
        "p50_gap_ms": statistics.median(s), "p99_gap_ms": s[int(len(s) * 0.99)],
        "max_gap_ms": s[-1], "frames": len(s),
    }  # fmt: skip


def _p(values: list[float], q: float) -> float | None:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else None


def _in_stream(kinds: list[str], i: int) -> bool:
    """Whether gap `i` is inside a streamed answer: a text delta after a text delta."""
    return kinds[i] == kinds[i - 1] == "text_delta"


def _flow_kinds(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The gaps in flow split in two: in a stream (a text delta after a text delta) and
    at a round's end (every other gap); the p99 and count of each."""
    stream: list[float] = []
    ends: list[float] = []
    for r in results:
        for gaps, kinds in zip(r["gaps_ms"], r["kinds"], strict=True):
            for i in range(1, len(gaps)):
                (stream if _in_stream(kinds, i) else ends).append(gaps[i])
    return {
        "p99_gap_in_stream_ms": _p(stream, 0.99), "p99_gap_round_end_ms": _p(ends, 0.99),
        "gaps_in_stream": len(stream), "gaps_round_end": len(ends),
    }  # fmt: skip


def _overlap(spans: list[tuple[float, float]], a: float, b: float) -> float:
    """Seconds of [a, b] that `spans` (sorted (start, end), disjoint) cover."""
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e in spans if s < b and e > a)


def _phases(results: list[dict[str, Any]], probe: dict[str, Any], t0: float, t1: float,
            limit_ms: float) -> dict[str, Any]:  # fmt: skip
    """`--phases`: the collector's pauses in the measured time, their share of the gaps
    in flow over `limit_ms`, and each round end's parts (see the module's doc)."""
    gcs = [g for g in probe["gc"] if t0 <= g[0] <= t1]
    per_gen: dict[str, Any] = {}
    for gen in (0, 1, 2):
        ms = [1000 * g[1] for g in gcs if g[2] == gen]
        cpu = [1000 * g[5] for g in gcs if g[2] == gen]
        per_gen[str(gen)] = {
            "count": len(ms), "total_ms": sum(ms), "p50_ms": _p(ms, 0.5), "max_ms": _p(ms, 1),
            "cpu_ms": sum(cpu), "p50_cpu_ms": _p(cpu, 0.5), "max_cpu_ms": _p(cpu, 1),
            "freed": sum(g[3] for g in gcs if g[2] == gen),
        }  # fmt: skip
    gc_spans = sorted((g[0], g[0] + g[1]) for g in gcs)
    full_spans = sorted((g[0], g[0] + g[1]) for g in gcs if g[2] == 2)
    late = [(w - s, w) for w, s in probe["late"] if t0 <= w <= t1]
    long_gaps: list[tuple[float, float, bool]] = []  # start, end, at a round end
    for r in results:
        for gaps, kinds, at in zip(r["gaps_ms"], r["kinds"], r["at"], strict=True):
            for i in range(1, len(gaps)):
                if gaps[i] > limit_ms:
                    long_gaps.append((at[i] - gaps[i] / 1000, at[i], not _in_stream(kinds, i)))
    with_gc = [g for g in long_gaps if _overlap(gc_spans, g[0], g[1]) > 0]
    in_full = [g for g in long_gaps if _overlap(full_spans, g[0], g[1]) > 0]
    long_s = sum(b - a for a, b, _ in long_gaps)
    gc_in_long = sum(_overlap(gc_spans, a, b) for a, b, _ in long_gaps)
    late_in_long = sum(_overlap(late, a, b) for a, b, _ in long_gaps)
    return {
        "gc": per_gen, "gc_ms_per_s": 1000 * sum(g[1] for g in gcs) / (t1 - t0),
        "gc_cpu_ms_per_s": 1000 * sum(g[5] for g in gcs) / (t1 - t0),
        "gc_not_in_trio_thread": sum(not g[4] for g in gcs),
        "gc_threshold": probe["gc_threshold"], "gc_frozen": probe["gc_frozen"],
        "gc_objects_at_end": probe["gc_objects"],
        "gc_objects_at_listen": probe["gc_objects_at_listen"],
        "gc_old_types": probe["gc_old_types"],
        "loop_late_ms": {"count": len(late), "total_ms": 1000 * sum(e - s for s, e in late),
                         "max_ms": 1000 * max((e - s for s, e in late), default=0.0)},
        "gaps_over_limit": len(long_gaps),
        "gaps_over_limit_at_round_end": sum(g[2] for g in long_gaps),
        "gaps_over_limit_with_gc": len(with_gc),
        "gaps_over_limit_with_a_full_pass": len(in_full),
        "gc_share_of_gaps_over_limit": gc_in_long / long_s if long_s else None,
        "late_share_of_gaps_over_limit": late_in_long / long_s if long_s else None,
        "round_end_ms": _round_ends(results, probe),
    }  # fmt: skip


ROUND_END_PARTS = (
    "stream_tail",  # the client's last word of a round -> the daemon has the stream's end
    "to_tool",  # -> the echo tool runs (the call parsed, the answer saved)
    "tool",  # the tool's own run
    "to_request",  # -> the next LLM request starts (the result saved, the context built)
    "to_first_chunk",  # -> its first chunk is read (the model's 20 ms wait in it)
    "relay_first",  # -> the client has the first word
    "whole",  # the client's last word of a round -> its first word of the next
)


def _round_ends(results: list[dict[str, Any]], probe: dict[str, Any]) -> dict[str, Any]:
    """Each round end of every session, split at the daemon's notes: p50 / p99 of each
    part in ms (see `ROUND_END_PARTS`). A session's k-th LLM call matches its k-th run
    of text deltas on the client."""
    calls: dict[str, list[tuple[float, float | None, float]]] = {}
    for sid, start, first, end in probe["calls"]:
        calls.setdefault(sid, []).append((start, first, end))
    tools: dict[str, list[tuple[float, float]]] = {}
    for sid, start, end in probe["tools"]:
        tools.setdefault(sid, []).append((start, end))
    parts: dict[str, list[float]] = {k: [] for k in ROUND_END_PARTS}
    for r in results:
        for sid, kinds, at in zip(r.get("sids", []), r["kinds"], r["at"], strict=True):
            runs: list[tuple[float, float]] = []  # each run of text deltas: first, last
            for i, k in enumerate(kinds):
                if k != "text_delta":
                    continue
                if i and kinds[i - 1] == "text_delta":
                    runs[-1] = (runs[-1][0], at[i])
                else:
                    runs.append((at[i], at[i]))
            cs, ts = sorted(calls.get(sid, [])), sorted(tools.get(sid, []))
            for k in range(min(len(runs), len(cs), len(ts) + 1) - 1):
                first = cs[k + 1][1]
                if first is None:
                    continue
                marks = [runs[k][1], cs[k][2], ts[k][0], ts[k][1], cs[k + 1][0], first,
                         runs[k + 1][0]]  # fmt: skip
                for name, a, b in zip(ROUND_END_PARTS, marks, marks[1:], strict=False):
                    parts[name].append(1000 * (b - a))
                parts["whole"].append(1000 * (marks[-1] - marks[0]))
    return {k: {"p50": _p(v, 0.5), "p99": _p(v, 0.99)} for k, v in parts.items()} | {
        "rounds": len(parts["whole"])
    }


def _py_spy(a: argparse.Namespace, pid: int) -> subprocess.Popen[bytes] | None:
    """`--py-spy OUT`: sample process `pid` (collapsed stacks, every thread) from now."""
    if not a.py_spy:
        return None
    beside = Path(sys.executable).parent / "py-spy"  # the bench venv's
    exe = str(beside) if beside.exists() else shutil.which("py-spy")
    if exe is None:
        raise RuntimeError("--py-spy: py-spy is not on PATH (pip install py-spy)")
    spy = subprocess.Popen(
        [exe, "record", "--threads", "--nonblocking", "--format", "raw", "--rate",
         "200", "--pid", str(pid), "-o", a.py_spy],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)  # let it attach before the load starts
    return spy


def _py_spy_end(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)


def measure(a: argparse.Namespace) -> dict[str, Any]:
    procs: list[subprocess.Popen[str]] = []
    tmp = Path(tempfile.mkdtemp(prefix="navi-conc-"))
    try:
        script = tmp / "script.json"
        script.write_text(json.dumps(_script(a)))
        fake = _spawn(["-m", "navi_trio.testing.fake_llm", "--loop", "--script", str(script)])
        procs.append(fake)
        llm_url = _line(fake, 30, "the fake LLM server").split("listening on", 1)[1].strip()
        daemon_args = ["conc.py", "daemon", "--url", llm_url, "--users", str(a.sessions + 1)]
        daemon_args += _daemon_pace(a)
        probe = tmp / "probe.json"
        daemon_args += [f"--probe={probe}"] if a.phases else []
        daemon = _spawn(daemon_args + ([f"--sync={a.sync}"] if a.sync else []))
        procs.append(daemon)
        hello = json.loads(_line(daemon, 60, "the daemon"))
        tokens = tmp / "tokens.json"
        tokens.write_text(json.dumps(hello["tokens"]))
        common = ["conc.py", "clients", "--ws", hello["ws"], "--tokens", str(tokens)]
        common += ["--phases"] if a.phases else []

        # Warm-up: the first connection and the first LLM call, not measured.
        warm = _spawn([*common, "--first", str(a.sessions), "--count", "1"])
        procs.append(warm)
        _line(warm, 60, "the warm-up client")
        _tell(warm, "go")
        _line(warm, 120, "the warm-up client")

        per = -(-a.sessions // a.client_procs)
        clients = [
            _spawn([*common, "--first", str(i), "--count", str(min(per, a.sessions - i))])
            for i in range(0, a.sessions, per)
        ]
        procs += clients
        for c in clients:
            if _line(c, 120, "a client process").strip() != "ready":
                raise RuntimeError("a client process did not connect")
        spy = _py_spy(a, daemon.pid)
        rss0 = _status_kb(daemon.pid, "VmRSS")
        cpu0 = {"daemon": _cpu_s(daemon.pid), "llm": _cpu_s(fake.pid)}
        main0 = _main_thread_s(daemon.pid)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()  # CLOCK_MONOTONIC, as the clients' and the daemon's
        for c in clients:
            _tell(c, "go")
        results = [json.loads(_line(c, a.timeout, "a client process")) for c in clients]
        t1 = time.perf_counter()
        wall = t1 - t0
        cpu = {k: _cpu_s(p.pid) - cpu0[k] for k, p in (("daemon", daemon), ("llm", fake))}
        cpu["daemon_main_thread"] = _main_thread_s(daemon.pid) - main0
        cpu["clients"] = sum(r["cpu_s"] for r in results)
        peak = _status_kb(daemon.pid, "VmHWM")
        _py_spy_end(spy)
        gaps = [g for r in results for one in r["gaps_ms"] for g in one]
        # Without each session's first gap (its message to its first frame: the start,
        # when every session asks at once): what a session in full flow sees.
        flow = [g for r in results for one in r["gaps_ms"] for g in one[1:]]
        rounds = sum(r["rounds"] for r in results)
        phases: dict[str, Any] = {}
        if a.phases:
            stop_all(procs)  # the daemon writes its notes as it ends
            figures = json.loads(probe.read_text())
            phases = {"phases": _phases(results, figures, t0, t1, a.limit_ms)}
        return {
            "sessions": a.sessions, "client_procs": len(clients), "rounds": rounds,
            "seconds": wall, "rounds_per_s": rounds / wall, **_pcts(gaps),
            "p99_gap_in_flow_ms": _pcts(flow)["p99_gap_ms"], **_flow_kinds(results),
            **phases, "cpu_s": cpu, "cpu_util": {k: v / wall for k, v in cpu.items()},
            "rss_start_kb": rss0, "rss_peak_kb": peak, "loadavg_start": load0,
            "loadavg_end": os.getloadavg()[0], "errors": [e for r in results for e in r["errors"]],
            **_pace_figures(a, rounds, cpu),
        }  # fmt: skip
    finally:
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def measure_daemons(a: argparse.Namespace) -> dict[str, Any]:
    """`--daemons N`: the same load over N daemons sharing one PostgreSQL (issue 20).

    ``--pg URL`` names the database (else a throwaway cluster is started, as the tests
    do). Each daemon is ``conc.py daemon --db URL`` (the runtime in the cluster), the
    client processes are spread over the daemons (client process i talks to daemon
    i mod N, so each session runs where its client is). Reported as `measure`, plus the
    CPU seconds of each daemon and per round."""
    procs: list[subprocess.Popen[str]] = []
    tmp = Path(tempfile.mkdtemp(prefix="navi-conc-"))
    server = None
    try:
        url = a.pg
        if not url:
            from navi_trio.testing.postgres import PgServer

            server = PgServer.start()
            url = server.create_database()
        script = tmp / "script.json"
        script.write_text(json.dumps(_script(a)))  # --pace: fast or realistic, as with one
        fake = _spawn(["-m", "navi_trio.testing.fake_llm", "--loop", "--script", str(script)])
        procs.append(fake)
        llm_url = _line(fake, 30, "the fake LLM server").split("listening on", 1)[1].strip()
        tokens = tmp / "tokens.json"
        daemons, hellos = [], []
        for i in range(a.daemons):
            args = ["conc.py", "daemon", "--url", llm_url, "--users", str(a.sessions + 1),
                    "--db", url, "--data", str(tmp / "data")]  # fmt: skip
            daemon = _spawn(args + (["--tokens", str(tokens)] if i else []))
            procs.append(daemon)
            daemons.append(daemon)
            hellos.append(json.loads(_line(daemon, 120, f"daemon {i}")))
            if not i:
                tokens.write_text(json.dumps(hellos[0]["tokens"]))
        nprocs = max(a.client_procs, a.daemons)
        per = -(-a.sessions // nprocs)

        def client(i: int) -> subprocess.Popen[str]:
            ws = hellos[(i // per) % a.daemons]["ws"]
            count = str(min(per, a.sessions - i))
            return _spawn(["conc.py", "clients", "--ws", ws, "--tokens", str(tokens),
                           "--first", str(i), "--count", count])  # fmt: skip

        clients = [client(i) for i in range(0, a.sessions, per)]
        procs += clients
        for c in clients:
            if _line(c, 120, "a client process").strip() != "ready":
                raise RuntimeError("a client process did not connect")
        spy = _py_spy(a, daemons[0].pid)  # the first daemon
        cpu0 = [_cpu_s(d.pid) for d in daemons]
        main0 = [_main_thread_s(d.pid) for d in daemons]
        llm0 = _cpu_s(fake.pid)
        t0 = time.monotonic()
        for c in clients:
            _tell(c, "go")
        results = [json.loads(_line(c, a.timeout, "a client process")) for c in clients]
        wall = time.monotonic() - t0
        cpu = [_cpu_s(d.pid) - c0 for d, c0 in zip(daemons, cpu0, strict=True)]
        main = [_main_thread_s(d.pid) - m0 for d, m0 in zip(daemons, main0, strict=True)]
        _py_spy_end(spy)
        gaps = [g for r in results for one in r["gaps_ms"] for g in one]
        flow = [g for r in results for one in r["gaps_ms"] for g in one[1:]]
        rounds = sum(r["rounds"] for r in results)
        return {
            "daemons": a.daemons, "sessions": a.sessions, "client_procs": len(clients),
            "rounds": rounds, "seconds": wall, "rounds_per_s": rounds / wall, **_pcts(gaps),
            "p99_gap_in_flow_ms": _pcts(flow)["p99_gap_ms"],
            "cpu_s_per_daemon": cpu, "cpu_s_main_thread_per_daemon": main,
            "cpu_ms_per_round": 1000 * sum(cpu) / max(rounds, 1),
            "cpu_s": {"daemons": sum(cpu), "llm": _cpu_s(fake.pid) - llm0,
                      "clients": sum(r["cpu_s"] for r in results)},
            "cores": os.cpu_count(), "errors": [e for r in results for e in r["errors"]],
        }  # fmt: skip
    finally:
        stop_all(procs)
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("what", nargs="?", default="measure", choices=["measure", "daemon", "clients"])
    p.add_argument("--sessions", type=int, default=10)
    p.add_argument("--client-procs", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--py-spy", default="", metavar="OUT")
    p.add_argument("--sync", default="", help="what-if: the store's synchronous= (OFF, NORMAL)")
    p.add_argument("--phases", action="store_true", help="the daemon's GC and round parts")
    p.add_argument("--limit-ms", type=float, default=50.0, help="--phases: a long gap")
    p.add_argument("--probe", default="")  # daemon (internal): where its notes go
    _pace_args(p)
    # daemon / clients (internal)
    p.add_argument("--url", default="")
    p.add_argument("--users", type=int, default=1)
    p.add_argument("--ws", default="")
    p.add_argument("--tokens", default="")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--daemons", type=int, default=0, help="N daemons on one PostgreSQL")
    p.add_argument("--pg", default="", help="--daemons: postgresql:// URL (default: a throwaway)")
    p.add_argument("--db", default="")  # daemon (internal): the PostgreSQL URL
    p.add_argument("--data", default="")
    a = p.parse_args()
    if a.what == "measure" and a.daemons:
        print(json.dumps(measure_daemons(a)))
        return 0
    if a.what == "measure":
        print(json.dumps(measure(a)))
        return 0
    import conc_parts  # noqa: I001  (beside this file; needs the bench venv's navi_trio)

    return conc_parts.main(a)


if __name__ == "__main__":
    sys.exit(main())
