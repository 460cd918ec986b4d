"""The text table of a results.json (standard library only; used by run.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _f(x: Any, nd: int = 2) -> str:
    return f"{x:.{nd}f}" if isinstance(x, int | float) else "-"


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def table(res: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    loop = res.get("loop50", {})
    if loop:
        add("1. Tool loop, 50 rounds (ms per round; median of runs after a warm-up)")
        add(f"   {'runner':<22}{'ms/round':>9}{'r1-10':>8}{'r41-50':>8}{'41-50/1-10':>11}"
            f"{'x plain':>9}{'x LG mem':>9}{'CPU ms':>8}{'CPU x LG':>9}")  # fmt: skip
        base = loop.get("plain_httpx", {}).get("ms_per_round")
        lg = loop.get("langgraph_memory", {}).get("ms_per_round")
        lgc = loop.get("langgraph_memory", {}).get("cpu_ms_per_round")
        for name, s in loop.items():
            if "error" in s:
                add(f"   {name:<22}unavailable: {s['error'][:90]}")
                continue
            m = s["ms_per_round"]
            add(
                f"   {name:<22}{_f(m):>9}{_f(s['first10']):>8}{_f(s['last10']):>8}"
                f"{_f(s['last10'] / s['first10']):>11}"
                f"{_f(m / base if base else None):>9}{_f(m / lg if lg else None):>9}"
                f"{_f(s.get('cpu_ms_per_round')):>8}"
                f"{_f(cpu / lgc if lgc and (cpu := s.get('cpu_ms_per_round')) else None):>9}"
            )
        navi = loop.get("navi_inproc", {})
        ws = loop.get("navi_ws", {})
        if "ms_per_round" in navi:
            m = navi["ms_per_round"]
            if lg:
                add(f"   target <= 0.5x LangGraph in memory: {_f(m / lg)}x "
                    f"{_verdict(m <= 0.5 * lg)}")  # fmt: skip
            if base:
                add(f"   target <= 2.5x plain loop: {_f(m / base)}x {_verdict(m <= 2.5 * base)}")
            flat = navi["last10"] / navi["first10"]
            add(f"   target flat (41-50 within 1.15x of 1-10): {_f(flat)}x "
                f"{_verdict(flat <= 1.15)}")  # fmt: skip
            if "ms_per_round" in ws:
                r = ws["ms_per_round"] / m
                add(f"   target WebSocket <= 1.3x in-process: {_f(r)}x {_verdict(r <= 1.3)}")
    long = res.get("loop_long", {})
    if long:
        add("   Long loop (ms per round, first 10 -> last 10 rounds)")
        for name, s in long.items():
            if "error" in s:
                add(f"   {name:<26}{s['error'][:90]}")
                continue
            g = s["last10"] / s["first10"]
            extra = ""
            if "tool_rounds" in s:
                n = s.get("compressions", 0)
                extra = f" ({s['tool_rounds']} tool rounds, {n} compressions)"
            add(f"   {name:<26}{_f(s['ms_per_round']):>7} ms/round  {_f(s['first10'])} -> "
                f"{_f(s['last10'])}  growth {_f(g)}x{extra}")  # fmt: skip
        s = long.get("navi_inproc", {})
        if "first10" in s:
            g = s["last10"] / s["first10"]
            add(f"   target navi flat within 1.25x at the long loop: {_f(g)}x "
                f"{_verdict(g <= 1.25)}")  # fmt: skip
    stop = res.get("stop", {})
    if stop:
        add("2. Stop over WebSocket: stop frame -> stream_end (ms); LLM connection closed (ms)")
        add(f"   {'phase':<18}{'n':>4}{'p50':>8}{'p95':>8}{'p99':>8}{'close p50':>10}"
            f"{'close p99':>10}  target p99<10")  # fmt: skip
        for name, s in stop.items():
            if not isinstance(s, dict) or "error" in s:
                add(f"   {name:<18}{(s or {}).get('error', s)}")
                continue
            a, d = s["stop_to_stream_end_ms"], s["llm_disconnect_ms"]
            ok = a.get("p99", 1e9) < 10 and (not d or d.get("p99", 1e9) < 10)
            add(f"   {name:<18}{a.get('n', 0):>4}{_f(a.get('p50')):>8}{_f(a.get('p95')):>8}"
                f"{_f(a.get('p99')):>8}{_f(d.get('p50')):>10}{_f(d.get('p99')):>10}  "
                f"{_verdict(ok)}")  # fmt: skip
    st = res.get("stream", {})
    if st:
        add("3. Stream throughput (words/s reaching the client)")
        plain = st.get("plain_httpx", {}).get("words_per_s")
        navi = st.get("navi_ws", {}).get("words_per_s")
        for name, s in st.items():
            add(f"   {name:<14}{s.get('error') or _f(s.get('words_per_s'), 0)} "
                f"({s.get('words', '?')} words, {s.get('frames', '-')} frames)")  # fmt: skip
        if plain and navi:
            add(f"   target WebSocket >= 0.7x plain: {_f(navi / plain)}x "
                f"{_verdict(navi >= 0.7 * plain)}")  # fmt: skip
    conc = res.get("concurrency", {})
    if conc:
        add("4. Concurrency (10-round tool loops, 5 ms between chunks; RSS includes the clients)")
        for n, s in conc.items():
            if n == "idle":
                kb = s.get("rss_per_idle_session_kb")
                add(f"   RSS per idle session: {_f(kb, 1)} KB  target < 100 KB "
                    f"{_verdict(kb is not None and kb < 100)}")  # fmt: skip
                continue
            if "error" in s:
                add(f"   {n:>4} sessions: {s['error']}")
                continue
            add(
                f"   {n:>4} sessions: {_f(s['rounds_per_s'], 0)} rounds/s, frame gap p50 "
                f"{_f(s['p50_gap_ms'])} p99 {_f(s['p99_gap_ms'])} max {_f(s['max_gap_ms'])} ms, "
                f"RSS {s['rss_start_kb'] // 1024} -> {s['rss_peak_kb'] // 1024} MB"
                + (f"  target p99<50 ms {_verdict(s['p99_gap_ms'] < 50)}" if n == "500" else "")
            )
    gr = res.get("growth", {})
    if gr and "error" not in gr:
        add("5. Growth (ms, median): one round's save; context build + size check; load")
        for n, s in gr.items():
            add(f"   {n:>6} messages: save {_f(s['save_ms'])}  build {_f(s['build_ms'], 3)}  "
                f"load_session {_f(s['load_session_ms'])}")  # fmt: skip
        if "10" in gr and "10000" in gr:
            for k in ("save_ms", "build_ms"):
                r = gr["10000"][k] / gr["10"][k]
                add(f"   target {k[:-3]} 10 -> 10,000 within 2x: {_f(r, 1)}x {_verdict(r <= 2)}")
    elif gr:
        add(f"5. Growth: {gr['error']}")
    su = res.get("startup", {})
    if su:
        s, r = su.get("serve_accepting_ms", []), su.get("run_first_request_ms", [])
        add("6. Start-up (ms, each try)")
        add(f"   navi serve -> accepting: {s}  target < 500 "
            f"{_verdict(bool(s) and sorted(s)[len(s) // 2] < 500)}")  # fmt: skip
        add(f"   navi run -> first LLM request: {r}  target < 300 "
            f"{_verdict(bool(r) and sorted(r)[len(r) // 2] < 300)}")  # fmt: skip
    for k, why in res.get("unavailable", {}).items():
        add(f"   unavailable: {k}: {why}")
    load = res.get("loadavg")
    add(f"({'--quick, ' if res.get('quick') else ''}{res.get('seconds', '?')} s, "
        f"{res.get('started', '')}"
        + (f", load average {load[0][0]} -> {load[1][0]} on {load[2]} CPUs" if load else "")
        + ")")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
