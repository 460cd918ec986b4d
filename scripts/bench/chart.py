"""Draw bench.png from results.json (runs in the bench venv, needs matplotlib).

    python scripts/bench/chart.py OUT_DIR

Left: ms per round against round number, one line per runner (50-round loop, and the
long loop dashed). Right: stop latency per phase (p50 bar, p99 whisker).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    out = Path(sys.argv[1])
    res = json.loads((out / "results.json").read_text())
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("chart: matplotlib not available in the bench venv; no PNG")
        return 0
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    (left, cpu_ax), (mid, right) = axes
    for name, s in res.get("loop50", {}).items():
        if "curve" in s:
            left.plot(range(1, len(s["curve"]) + 1), s["curve"], label=name, lw=1.4)
        if s.get("cpu_curve"):
            cpu_ax.plot(range(1, len(s["cpu_curve"]) + 1), s["cpu_curve"], label=name, lw=1.4)
    left.set(title="50-round tool loop, wall", xlabel="round", ylabel="ms per round",
             yscale="log")  # fmt: skip
    cpu_ax.set(title="50-round tool loop, CPU of the runner process", xlabel="round",
               ylabel="CPU ms per round", yscale="log")  # fmt: skip
    left.legend(fontsize=7)
    cpu_ax.legend(fontsize=7)
    for name, s in res.get("loop_long", {}).items():
        if s.get("cpu_curve"):
            mid.plot(range(1, len(s["cpu_curve"]) + 1), s["cpu_curve"], label=name, lw=0.8)
    mid.set(title="long tool loop, CPU", xlabel="round", ylabel="CPU ms per round",
            yscale="log")  # fmt: skip
    mid.legend(fontsize=7)
    stop = {k: v for k, v in res.get("stop", {}).items() if "stop_to_stream_end_ms" in v}
    names = list(stop)
    p50 = [stop[n]["stop_to_stream_end_ms"].get("p50", 0) for n in names]
    p99 = [stop[n]["stop_to_stream_end_ms"].get("p99", 0) for n in names]
    right.bar(names, p50, label="p50")
    right.scatter(names, p99, color="red", marker="_", s=300, label="p99")
    right.axhline(10, color="gray", ls="--", lw=1, label="target p99 10 ms")
    right.set(title="stop -> stream_end over WebSocket", ylabel="ms")
    right.tick_params(axis="x", rotation=30, labelsize=7)
    right.legend(fontsize=7)
    fig.suptitle(f"navi_trio benchmarks ({res.get('started', '')}, "
                 f"{'--quick' if res.get('quick') else 'full'})")  # fmt: skip
    fig.tight_layout()
    fig.savefig(out / "bench.png", dpi=60)
    print(f"chart: {out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
