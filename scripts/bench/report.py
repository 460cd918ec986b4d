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
        add("1. Tool loop, 50 rounds, ms per round (median of runs after a warm-up). Wall time")
        add("   at the runner, and CPU time of the runner's process (all threads: steadier on a")
        add("   busy machine). Ratios are between runners of this same run.")
        add(f"   {'runner':<18}{'wall':>7}{'r1-10':>7}{'r41-50':>7}{'CPU':>7}{'r1-10':>7}"
            f"{'r41-50':>7}{'flat':>6}{'xplain':>8}{'xLGmem':>8}{'CPU xplain':>11}"
            f"{'CPU xLG':>8}")  # fmt: skip
        base = loop.get("plain_httpx", {})
        lg = loop.get("langgraph_memory", {})

        def ratio(s: dict[str, Any], ref: dict[str, Any], k: str) -> float | None:
            return s[k] / ref[k] if s.get(k) and ref.get(k) else None

        for name, s in loop.items():
            if "error" in s:
                add(f"   {name:<18}{s['error'][:100]}")
                continue
            flat = ratio({"x": s.get("cpu_last10")}, {"x": s.get("cpu_first10")}, "x")
            add(
                f"   {name:<18}{_f(s['ms_per_round']):>7}{_f(s['first10']):>7}"
                f"{_f(s['last10']):>7}{_f(s.get('cpu_ms_per_round')):>7}"
                f"{_f(s.get('cpu_first10')):>7}{_f(s.get('cpu_last10')):>7}{_f(flat):>6}"
                f"{_f(ratio(s, base, 'ms_per_round')):>8}{_f(ratio(s, lg, 'ms_per_round')):>8}"
                f"{_f(ratio(s, base, 'cpu_ms_per_round')):>11}"
                f"{_f(ratio(s, lg, 'cpu_ms_per_round')):>8}"
            )
        navi = loop.get("navi_inproc", {})
        ws = loop.get("navi_ws", {})

        def target(label: str, wall: float | None, cpu: float | None, limit: float) -> None:
            got = [v for v in (wall, cpu) if v is not None]
            verdict = _verdict(bool(got) and all(v <= limit for v in got))
            add(f"   target {label} <= {limit}: wall {_f(wall)}x, CPU {_f(cpu)}x  {verdict}")

        if "ms_per_round" in navi:
            target("navi / LangGraph in memory", ratio(navi, lg, "ms_per_round"),
                   ratio(navi, lg, "cpu_ms_per_round"), 0.5)  # fmt: skip
            target("navi / plain loop", ratio(navi, base, "ms_per_round"),
                   ratio(navi, base, "cpu_ms_per_round"), 2.5)  # fmt: skip
            target("navi rounds 41-50 / 1-10", navi["last10"] / navi["first10"],
                   ratio({"x": navi.get("cpu_last10")}, {"x": navi.get("cpu_first10")}, "x"),
                   1.15)  # fmt: skip
            if "ms_per_round" in ws:
                target("WebSocket / in-process", ratio(ws, navi, "ms_per_round"),
                       ratio(ws, navi, "cpu_ms_per_round"), 1.3)  # fmt: skip
    long = res.get("loop_long", {})
    if long:
        add("   Long loop: ms per round, rounds 1-10 -> last 10 (wall; CPU)")
        for name, s in long.items():
            if "error" in s:
                add(f"   {name:<26}{s['error'][:90]}")
                continue
            g = s["last10"] / s["first10"]
            cg = s["cpu_last10"] / s["cpu_first10"] if s.get("cpu_first10") else None
            extra = ""
            if "tool_rounds" in s:
                n = s.get("compressions", 0)
                extra = f" ({s['tool_rounds']} tool rounds, {n} compressions)"
            add(f"   {name:<24} wall {_f(s['first10'])} -> {_f(s['last10'])} ({_f(g)}x); "
                f"CPU {_f(s.get('cpu_first10'))} -> {_f(s.get('cpu_last10'))} ({_f(cg)}x)"
                f"{extra}")  # fmt: skip
        s = long.get("navi_inproc", {})
        if s.get("cpu_first10"):
            g = s["cpu_last10"] / s["cpu_first10"]
            add(f"   target navi flat within 1.25x at the long loop (CPU): {_f(g)}x "
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
        add(
            "4. Concurrency (10-round tool loops, 5 ms between chunks; daemon, clients and LLM "
            "in separate processes; cpu = CPU s / wall s of the daemon)"
        )
        for n, s in conc.items():
            if n == "idle":
                kb = s.get("rss_per_idle_session_kb")
                heap = s.get("python_heap_per_idle_session_kb")
                add(f"   RSS per idle session: {_f(kb, 1)} KB (Python heap {_f(heap, 1)} KB, "
                    f"tracemalloc)  target < 100 KB "
                    f"{_verdict(kb is not None and kb < 100)}")  # fmt: skip
                continue
            if "error" in s:
                add(f"   {n:>4} sessions: {s['error']}")
                continue
            add(
                f"   {n:>4} sessions: {_f(s['rounds_per_s'], 0)} rounds/s, frame gap p50 "
                f"{_f(s['p50_gap_ms'])} p99 {_f(s['p99_gap_ms'])} max {_f(s['max_gap_ms'])} ms, "
                f"daemon cpu {_f(s.get('cpu_util', {}).get('daemon'))}, "
                f"RSS {s['rss_start_kb'] // 1024} -> {s['rss_peak_kb'] // 1024} MB"
                + (f"  target p99<50 ms {_verdict(s['p99_gap_ms'] < 50)}" if n == "500" else "")
            )
    gr = res.get("growth", {})
    if gr and "error" not in gr:
        add("5. Growth (ms, median): one round's save; a round's context build + size check "
            "(a turn's first round); load")  # fmt: skip
        for n, s in gr.items():
            first = f" ({_f(s['first_build_ms'], 3)})" if "first_build_ms" in s else ""
            add(f"   {n:>6} messages: save {_f(s['save_ms'])}  build {_f(s['build_ms'], 3)}"
                f"{first}  load_session {_f(s['load_session_ms'])}")  # fmt: skip
        if "10" in gr and "10000" in gr:
            for k in ("save_ms", "build_ms"):
                r = gr["10000"][k] / gr["10"][k]
                add(f"   target {k[:-3]} 10 -> 10,000 within 2x: {_f(r, 1)}x {_verdict(r <= 2)}")
    elif gr:
        add(f"5. Growth: {gr['error']}")
    wi = res.get("whatif", {})
    if wi:
        add("   What-if (same run): the store's synchronous=FULL (as shipped) vs OFF (no fsync)")
        for k in ("FULL", "OFF"):
            lo, co = wi.get(f"loop50_sync_{k}", {}), wi.get(f"concurrency100_sync_{k}", {})
            add(f"   {k:<5} loop50 wall {_f(lo.get('ms_per_round'))} CPU "
                f"{_f(lo.get('cpu_ms_per_round'))} ms/round; 100 sessions "
                f"{_f(co.get('rounds_per_s'), 0)} rounds/s, frame gap p99 "
                f"{_f(co.get('p99_gap_ms'))} ms")  # fmt: skip
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
