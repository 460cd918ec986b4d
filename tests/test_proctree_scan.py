"""The stray scan reads environments only of processes younger than the leader (profile 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from navi_trio.tools import proctree

pytestmark = [
    pytest.mark.slow,  # its tests start processes
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or not Path("/proc/self/stat").exists(),
        reason="needs Linux /proc",
    ),
]

TAG_VAR = "NAVI_PROC_TAG_TEST"


def _ours() -> list[int]:
    uid = os.getuid()
    pids = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                pids.append(int(name))
        except OSError:
            pass
    return pids


def test_environ_is_read_only_for_processes_started_after_the_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Old processes of ours to skip: they exist before the leader starts.
    olds = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    env = dict(os.environ, **{TAG_VAR: "t1"})
    # The leader, a child below it by parent id, and a tagged grandchild in its own
    # session whose parent exits (reparented, found by its environment only).
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 30 & (setsid sleep 30 &); echo ok; wait"],
        env=env,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    reads: list[int] = []
    real = proctree._has_tag

    def counting(pid: int, needle: bytes) -> bool:
        reads.append(pid)
        return real(pid, needle)

    monkeypatch.setattr(proctree, "_has_tag", counting)
    try:
        assert leader.stdout is not None and leader.stdout.readline() == b"ok\n"
        since = proctree.start_time(leader.pid)
        assert since is not None
        older = {p for p in _ours() if (proctree.start_time(p) or since) < since}
        older.discard(os.getpid())  # never read anyway
        assert older  # the three old sleeps at least (or the shell that ran pytest)
        found: set[int] = set()
        for _ in range(200):  # the setsid'd sleep may still be starting: bounded retries
            reads.clear()
            found = proctree.stray_pids(leader.pid, TAG_VAR, "t1")
            if len(found) >= 2:
                break
        assert len(found) >= 2, found  # the child by parent id, the setsid'd one by tag
        assert not found & {o.pid for o in olds}
        assert reads  # the scan did look at the young ones
        assert not older & set(reads), older & set(reads)  # older: environ never read
    finally:
        for pid in proctree.stray_pids(leader.pid, TAG_VAR, "t1"):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        for p in [leader, *olds]:
            p.kill()
            p.wait()
