"""trio's import with and without `ldconfig -p`: standard library only.

    python scripts/bench/trio_import.py [--pairs N]

trio's thread cache asks ``ctypes.util.find_library("pthread")`` at import, which on
Linux forks and execs ``/sbin/ldconfig -p``. On glibc the answer is always
``libpthread.so.0``: a `navi` that imported trio while `find_library` answered that for
"pthread" would spare the fork (docs/pages/performance.md, Start-up; tried in af0cb63,
not shown at load 8-16). Each pair starts two fresh interpreters, one importing trio
each way (alternated: which goes first changes every pair), and reads the wall time of
the import alone inside them, so that the rest of an interpreter's start does not blur
it. Prints one JSON object: each side's ms per pair, the medians, and the pairs' ratios
(answered / as it is).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSWERED = (
    "import time, ctypes.util\nreal = ctypes.util.find_library\n"
    "ctypes.util.find_library = lambda n: 'libpthread.so.0' if n == 'pthread' else real(n)\n"
    "t = time.perf_counter()\nimport trio\nelapsed = time.perf_counter() - t\n"
    "assert trio._core._thread_cache.set_os_thread_name is not None\n"
    "print(elapsed * 1000)"
)
AS_IT_IS = (
    "import time, ctypes.util\n"
    "t = time.perf_counter()\nimport trio\nprint((time.perf_counter() - t) * 1000)"
)


def _ms(code: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True
    )
    return float(done.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=30)
    a = p.parse_args()
    for code in (ANSWERED, AS_IT_IS):  # warm-up: the bytecode
        _ms(code)
    answered: list[float] = []
    as_it_is: list[float] = []
    for i in range(a.pairs):
        if i % 2 == 0:
            answered.append(_ms(ANSWERED))
            as_it_is.append(_ms(AS_IT_IS))
        else:
            as_it_is.append(_ms(AS_IT_IS))
            answered.append(_ms(ANSWERED))
    ratios = [x / y for x, y in zip(answered, as_it_is, strict=True)]
    out = {
        "answered_ms": [round(x, 1) for x in answered],
        "as_it_is_ms": [round(x, 1) for x in as_it_is],
        "answered_median_ms": round(statistics.median(answered), 1),
        "as_it_is_median_ms": round(statistics.median(as_it_is), 1),
        "pairs_median_ratio": round(statistics.median(ratios), 3),
        "pairs_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "pairs_lower": sum(r < 1 for r in ratios),
        "load": [round(x, 1) for x in os.getloadavg()],
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
