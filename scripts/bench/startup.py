"""Start-up timings (issue 11, benchmark 6): standard library only.

    python scripts/bench/startup.py [--tries N] [--navi "CMD"] [--cwd DIR] [--only run|serve]
                                    [--same-db]

- ``navi serve`` until it accepts a connection (its "listening on" line, then a connect);
- ``navi run hi`` until its first request byte reaches the LLM: a one-shot listener on
  127.0.0.1 stands in for Ollama (OLLAMA_HOST), and the run is killed once it has it.

Each try gets a fresh data folder and database (the first run on a machine creates them
too); with `--same-db`, every try of `navi run` uses the ones its warm-up run made, as a
user's later runs do. One untimed warm-up run of each comes first, and PYTHONDONTWRITEBYTECODE is
dropped from the children's environment: an installed navi runs from compiled bytecode,
so the figures do not include compiling navi_trio's modules. `--navi` is the command to
time (default: this Python's ``-m navi_trio``); `--cwd` runs it in another checkout (with
``-m navi_trio`` the checkout in the working folder is the one imported), which is how an
old and a new tree are compared in one sitting. Prints one JSON object: each try in ms
and the medians, and also the CPU ms each had used by then (`navi run` at its first
request, `navi serve` at the accepted connection; user + system, every thread; steadier
than the wall time on a busy machine).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

TIMEOUT = 30.0


def _env(tmp: str, llm_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(NAVI_DB=f"{tmp}/navi.db", NAVI_DATA_DIR=f"{tmp}/d",
               OLLAMA_HOST=f"http://127.0.0.1:{llm_port}")  # fmt: skip
    return env


def serve_accepting_ms(
    navi: list[str], cwd: str | None, cpu: list[float] | None = None
) -> float | None:
    """`navi serve --port 0` started → a connection to it accepted, in ms (None: failed).

    With `cpu`, the CPU ms the daemon had used by then is appended to it."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [*navi, "serve", "--port", "0"], env=_env(tmp, 9), cwd=cwd, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
            line = proc.stdout.readline() if ready else ""
            if "listening on ws://" not in line:
                return None
            port = int(line.rsplit(":", 1)[1].strip("/\n"))
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                wall = (time.perf_counter() - t0) * 1000
                used = _cpu_ms(proc.pid)
                if cpu is not None and used is not None:
                    cpu.append(used)
                return wall
        finally:
            proc.terminate()
            proc.wait(10)


def _cpu_ms(pid: int) -> float | None:
    """User + system CPU of process `pid` so far, its threads included (Linux; 10 ms steps)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def run_first_request_ms(
    navi: list[str], cwd: str | None, cpu: list[float] | None = None, data: str | None = None
) -> float | None:
    """`navi run hi` started → its first request byte at the LLM's socket, in ms.

    With `cpu`, the CPU ms the run had used by then is appended to it: on a busy machine
    that figure moves less than the wall time. With `data`, the database and data folder
    are in that folder (kept from try to try), else in a new one.
    """
    with tempfile.TemporaryDirectory() as new, socket.socket() as lsock:
        tmp = data or new
        lsock.bind(("127.0.0.1", 0))
        lsock.listen()
        lsock.settimeout(TIMEOUT)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [*navi, "run", "hi"], env=_env(tmp, lsock.getsockname()[1]), cwd=cwd,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            conn, _ = lsock.accept()
            with conn:
                conn.settimeout(TIMEOUT)
                if not conn.recv(4096):
                    return None
                wall = (time.perf_counter() - t0) * 1000
                used = _cpu_ms(proc.pid)
                if cpu is not None and used is not None:
                    cpu.append(used)
                return wall
        except TimeoutError:
            return None
        finally:
            proc.kill()
            proc.wait(10)


def measure(
    navi: list[str], tries: int, cwd: str | None = None, only: str = "", same_db: bool = False
) -> dict[str, Any]:
    """Both timings `tries` times (after one warm-up each); ms per try and the medians."""
    out: dict[str, Any] = {}
    cpu: list[float] = []
    serve_cpu: list[float] = []
    with tempfile.TemporaryDirectory() as kept:
        data = kept if same_db else None
        for name, fn in (("serve_accepting_ms", serve_accepting_ms),
                         ("run_first_request_ms", run_first_request_ms)):  # fmt: skip
            if only and not name.startswith(only):
                continue
            if fn is run_first_request_ms:
                run_first_request_ms(navi, cwd, None, data)  # warm-up: the bytecode, the cache
                got = [run_first_request_ms(navi, cwd, cpu, data) for _ in range(tries)]
            else:
                serve_accepting_ms(navi, cwd)
                got = [serve_accepting_ms(navi, cwd, serve_cpu) for _ in range(tries)]
            _summary(out, name, got)
    if serve_cpu:
        _summary(out, "serve_accepting_cpu_ms", list(serve_cpu))
    if cpu:
        _summary(out, "run_first_request_cpu_ms", list(cpu))
    return out


def _summary(out: dict[str, Any], name: str, got: list[float | None]) -> None:
    ok = [round(ms, 1) for ms in got if ms is not None]
    out[name] = ok
    out[name.replace("_ms", "_median_ms")] = round(statistics.median(ok), 1) if ok else None
    if len(ok) < len(got):
        out[name.replace("_ms", "_failed")] = len(got) - len(ok)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tries", type=int, default=15)
    p.add_argument("--navi", default=f"{shlex.quote(sys.executable)} -m navi_trio")
    p.add_argument("--cwd", help="run the command in this folder (another checkout)")
    p.add_argument("--only", choices=("run", "serve"), default="")
    p.add_argument(
        "--same-db", action="store_true", help="navi run's tries on the database its warm-up made"
    )
    a = p.parse_args()
    print(json.dumps(measure(shlex.split(a.navi), a.tries, a.cwd, a.only, a.same_db)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
