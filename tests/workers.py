"""How many xdist workers `python -m pytest` starts (its `-n auto`, in pyproject.toml's
addopts, through tests/conftest.py's `pytest_xdist_auto_num_workers`).

One worker per CPU (WORKERS_PER_CPU). The suite mostly waits (daemons, terminals,
PostgreSQL, the real model), and two per CPU finished sooner, but then the tests on the
autojump clock that let it jump after 10 ms of real time (tests/test_agent_fencing.py,
tests/test_storage_full.py) found it run ahead while the store's thread waited for a
CPU. That clock is now held while a thread job runs (tests/realtime.py `held`); two per
CPU has not been measured again since. One test file, or tests of one file, runs in
the one process: starting the workers costs more than they save there.
PYTEST_XDIST_AUTO_NUM_WORKERS, or ``-n N`` (``-n 0``: one process), still decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

WORKERS_PER_CPU = 1


def auto_workers(args: Sequence[str], environ: Mapping[str, str], cpus: int) -> int | None:
    """The worker count for the command's test `args` (paths or node ids); None leaves
    it to xdist's own hook, which reads PYTEST_XDIST_AUTO_NUM_WORKERS."""
    if environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    files = {arg.split("::")[0] for arg in args}
    if len(files) == 1 and Path(next(iter(files))).is_file():
        return 0
    return WORKERS_PER_CPU * max(1, cpus)
