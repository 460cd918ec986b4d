"""scripts/bench/conc.py: how a run's frames and the daemon's notes become its figures
(no benchmark runs here).

The gaps in flow split into a stream's (word to word) and a round end's; a round end is
cut into its parts at the daemon's notes; the collector's pauses are charged to the long
gaps they overlap and to nothing else.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench"


def _conc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_conc", BENCH / "conc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


TD = "text_delta"
# One session's frames: three words, the round's end (the tool starts and ends), two words
# of the next round, the end of the stream. The first gap is the start (left out of flow).
AT = [1.000, 1.020, 1.040, 1.090, 1.091, 1.115, 1.135, 1.180]
KINDS = [TD, TD, TD, "tool_started", "tool_result", TD, TD, "stream_end"]
GAPS = [30.0] + [1000 * (b - a) for a, b in zip(AT, AT[1:], strict=False)]
RESULT = {"gaps_ms": [GAPS], "kinds": [KINDS], "at": [AT], "sids": ["s"]}
PROBE: dict[str, Any] = {
    # sid, start, first chunk, end of each LLM call; the echo tool's run
    "calls": [["s", 1.093, 1.113, 1.170], ["s", 0.970, 1.000, 1.085]],
    "tools": [["s", 1.088, 1.0885]],
    # start, seconds, generation, freed, in the trio thread, CPU seconds; the last is
    # outside the measured time
    "gc": [[1.045, 0.010, 2, 5, True, 0.009], [1.150, 0.001, 0, 0, True, 0.001],
           [2.000, 0.050, 2, 0, True, 0.050]],  # fmt: skip
    "late": [[1.060, 0.005]],  # woke at, seconds late
    "gc_threshold": [700, 10, 10], "gc_frozen": 0, "gc_objects": [1, 2, 3],
    "gc_objects_at_listen": [1, 1, 1], "gc_old_types": [["dict", 3]],
}  # fmt: skip


def test_gaps_in_flow_split_into_a_stream_s_and_a_round_end_s() -> None:
    got = _conc()._flow_kinds([RESULT])
    # Word to word: three gaps of 20 ms; the rest (50, 1, 24, 45 ms) are the round end's.
    assert got["gaps_in_stream"] == 3 and got["gaps_round_end"] == 4
    assert got["p99_gap_in_stream_ms"] == pytest.approx(20.0)
    assert got["p99_gap_round_end_ms"] == pytest.approx(50.0)


def test_a_round_end_is_cut_at_the_daemon_s_notes() -> None:
    got = _conc()._round_ends([RESULT], PROBE)
    want = {"stream_tail": 45.0, "to_tool": 3.0, "tool": 0.5, "to_request": 4.5,
            "to_first_chunk": 20.0, "relay_first": 2.0, "whole": 75.0}  # fmt: skip
    assert got["rounds"] == 1
    for part, ms in want.items():
        assert got[part]["p50"] == pytest.approx(ms), part


def test_the_collector_s_pauses_are_charged_to_the_long_gaps_they_overlap() -> None:
    got = _conc()._phases([RESULT], PROBE, 0.99, 1.2, 40.0)
    # Long gaps (over 40 ms): 1.040-1.090 and 1.135-1.180, both at a round end (95 ms).
    assert got["gaps_over_limit"] == 2 and got["gaps_over_limit_at_round_end"] == 2
    # The full pass (1.045-1.055) falls in the first, the young one (1.150) in the
    # second; the one at 2.0 is outside the measured time.
    assert got["gaps_over_limit_with_gc"] == 2
    assert got["gaps_over_limit_with_a_full_pass"] == 1
    assert got["gc_share_of_gaps_over_limit"] == pytest.approx(11 / 95)
    assert got["late_share_of_gaps_over_limit"] == pytest.approx(5 / 95)
    assert got["gc"]["2"]["count"] == 1 and got["gc"]["2"]["max_ms"] == pytest.approx(10.0)
    assert got["gc"]["0"]["count"] == 1 and got["gc"]["1"]["count"] == 0
    assert got["gc_cpu_ms_per_s"] == pytest.approx(1000 * 0.010 / 0.21)
    assert got["gc_old_types"] == [["dict", 3]]
