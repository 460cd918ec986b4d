"""Small bugs made by hand, and whether the tests catch them.

A mutants file (TOML) lists one-line changes to the package, each with the tests that
should catch it:

    [[mutant]]
    id = "lease-expiry-inclusive"
    file = "navi_trio/store/fence.py"
    old = "if expires_at <= now:"
    new = "if expires_at < now:"
    tests = ["tests/test_store_contract.py", "tests/test_agent_fencing.py"]
    why = "a lease that expires this instant is still held"   # optional

`python scripts/mutants.py tests/mutants/FILE.toml [--only ID ...] [--workers N]`
applies each mutant in turn to this checkout (`old` must occur exactly once in
`file`), runs its tests, puts the file back, and prints one line per mutant: caught
(a test failed: its name), survived (every test passed) or broken (the tests could not
run, e.g. an import error, which counts as caught by any run). It refuses to start on a
checkout whose package has uncommitted changes, so a file it leaves behind after a kill
is plain to `git diff`. Exit status 1 when a mutant survived.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def load(path: Path) -> list[dict[str, object]]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    mutants = data.get("mutant")
    if not isinstance(mutants, list) or not mutants:
        raise SystemExit(f"{path}: no [[mutant]] tables")
    seen: set[str] = set()
    for m in mutants:
        for key in ("id", "file", "old", "new", "tests"):
            if key not in m:
                raise SystemExit(f"{path}: mutant {m.get('id', '?')!r} has no {key!r}")
        if m["id"] in seen:
            raise SystemExit(f"{path}: mutant id {m['id']!r} given twice")
        seen.add(m["id"])
        text = (ROOT / m["file"]).read_text(encoding="utf-8")
        count = text.count(m["old"])
        if count != 1:
            raise SystemExit(
                f"{path}: mutant {m['id']!r}: `old` occurs {count} times in {m['file']}"
            )
    return mutants


def run_tests(tests: list[str], workers: str, timeout: float) -> tuple[int | None, str]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-rfE",
        "-p",
        "no:cacheprovider",
        "-n",
        workers,
        *tests,
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("file", type=Path)
    parser.add_argument("--only", nargs="*", default=None, help="the ids to run (default: all)")
    parser.add_argument("--workers", default="2", help="pytest -n (default 2)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds per mutant's tests (a hang counts as caught)",
    )
    args = parser.parse_args()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "navi_trio"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if dirty.stdout.strip():
        raise SystemExit("navi_trio/ has uncommitted changes: commit or stash them first")
    mutants = load(args.file)
    if args.only is not None:
        mutants = [m for m in mutants if m["id"] in args.only]
    survived = 0
    for m in mutants:
        path = ROOT / str(m["file"])
        original = path.read_text(encoding="utf-8")
        mtime = path.stat().st_mtime_ns
        path.write_text(original.replace(str(m["old"]), str(m["new"])), encoding="utf-8")
        # Bytecode caches are keyed by the source's mtime in whole seconds and its size:
        # the mutant gets a time of its own, and the original its own time back.
        later = max(time.time_ns(), mtime + 2_000_000_000)
        os.utime(path, ns=(later, later))
        started = time.monotonic()
        try:
            code, out = run_tests([str(t) for t in m["tests"]], args.workers, args.timeout)  # type: ignore[attr-defined]
        finally:
            path.write_text(original, encoding="utf-8")
            os.utime(path, ns=(mtime, mtime))
        took = time.monotonic() - started
        if code == 0:
            verdict, detail = "survived", ""
            survived += 1
        elif code is None:
            verdict, detail = "caught", "(timed out)"
        elif code in (1, 2) and (found := FAILED.search(out)):
            verdict, detail = "caught", found.group(1)
        else:
            last = out.strip().splitlines()[-1:] or [""]
            verdict, detail = "broken", f"(pytest exit {code}: {last[0][:200]})"
        print(f"{verdict:8} {m['id']:40} {took:6.1f}s {detail}", flush=True)
    print(f"{len(mutants) - survived} of {len(mutants)} caught", flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
