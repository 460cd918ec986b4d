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
        daemon = _spawn(daemon_args + ([f"--sync={a.sync}"] if a.sync else []))
        procs.append(daemon)
        hello = json.loads(_line(daemon, 60, "the daemon"))
        tokens = tmp / "tokens.json"
        tokens.write_text(json.dumps(hello["tokens"]))
        common = ["conc.py", "clients", "--ws", hello["ws"], "--tokens", str(tokens)]

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
        t0 = time.monotonic()
        for c in clients:
            _tell(c, "go")
        results = [json.loads(_line(c, a.timeout, "a client process")) for c in clients]
        wall = time.monotonic() - t0
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
        return {
            "sessions": a.sessions, "client_procs": len(clients), "rounds": rounds,
            "seconds": wall, "rounds_per_s": rounds / wall, **_pcts(gaps),
            "p99_gap_in_flow_ms": _pcts(flow)["p99_gap_ms"],
            "cpu_s": cpu, "cpu_util": {k: v / wall for k, v in cpu.items()},
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
