"""scripts/bench: the figures and verdicts run.py prints (no benchmark runs here).

The benchmark itself is not in CI (issue 11); what is checked is the arithmetic that
turns raw runs into the table: the warm-up run is dropped, a runner that did not play
every round is an error and not a figure, and each target is judged on wall and CPU.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_summary_drops_the_warm_up_run_and_rejects_short_runs() -> None:
    run = _load("run")
    warm = [100.0] * 20
    steady = [1.0] * 10 + [2.0] * 10
    got = run.summarize_loop({"runs": [warm, steady, steady], "cpu": [warm, steady]}, 20)
    assert got["ms_per_round"] == 1.5 and got["first10"] == 1.0 and got["last10"] == 2.0
    assert got["cpu_first10"] == 1.0 and got["cpu_last10"] == 2.0 and got["runs"] == 2
    short = run.summarize_loop({"runs": [steady, steady[:-1]]}, 20)
    assert "expected 20 rounds" in short["error"]
    assert run.summarize_loop({"error": "unavailable: pip"}, 20) == {"error": "unavailable: pip"}


def _loop(wall: float, cpu: float) -> dict[str, float]:
    return {"ms_per_round": wall, "first10": wall, "last10": wall, "cpu_ms_per_round": cpu,
            "cpu_first10": cpu, "cpu_last10": cpu}  # fmt: skip


def test_table_judges_targets_on_wall_and_cpu() -> None:
    report = _load("report")
    res = {
        "loop50": {
            "plain_httpx": _loop(1.0, 0.3),
            "navi_inproc": _loop(2.0, 1.0),  # / plain: wall 2.0 (met), CPU 3.3 (missed)
            "langgraph_memory": _loop(3.0, 3.0),  # navi / LG: wall 0.67 (missed), CPU 0.33
            "pydantic_ai": {"error": "unavailable: pip install failed: no network"},
        }
    }
    text = report.table(res)
    assert "target navi / plain loop <= 2.5: wall 2.00x, CPU 3.33x  MISSED" in text
    assert "target WebSocket" not in text  # no WebSocket runner, no verdict
    assert "target navi / LangGraph in memory <= 0.5: wall 0.67x, CPU 0.33x  MISSED" in text
    assert "pydantic_ai       unavailable: pip install failed: no network" in text


def test_concurrency_rows_give_the_daemon_cpu_and_judge_500_sessions() -> None:
    conc = _load("conc")  # the orchestrator imports the standard library only
    gaps = conc._pcts([float(i) for i in range(1, 201)])
    assert (gaps["p50_gap_ms"], gaps["p99_gap_ms"], gaps["max_gap_ms"]) == (100.5, 199.0, 200.0)
    row = {"rounds_per_s": 300.0, "p50_gap_ms": 300.0, "p99_gap_ms": 2000.0,
           "max_gap_ms": 4000.0, "cpu_util": {"daemon": 0.95, "clients": 0.07},
           "rss_start_kb": 100 << 10, "rss_peak_kb": 180 << 10}  # fmt: skip
    text = _load("report").table({"concurrency": {"100": row, "500": row}})
    assert "100 sessions: 300 rounds/s" in text and "daemon cpu 0.95" in text
    assert "RSS 100 -> 180 MB  target p99<50 ms MISSED" in text
