"""Big outputs stay bounded: a command printing millions of lines gives a capped result
and a handful of coalesced progress events, in bounded memory; a file of one endless
line is read no further than the cap; tool processes never see navi's secrets.

Real processes, every test bounded by a real `trio.fail_after`; counts and memory are
asserted, never time.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import attrs
import pytest
import trio
from kvfake import Recorder, make_ctx

from navi_trio.tools.code_exec import CodeExecTool
from navi_trio.tools.filesystem import FilesystemTool
from navi_trio.tools.procs import ProcessPool, child_env, is_secret, passed_env
from navi_trio.tools.progress import OutputProgress
from navi_trio.tools.terminal import TerminalTool

pytestmark = pytest.mark.slow  # its tests start processes

MB = 1_000_000


async def test_millions_of_lines_give_a_capped_result_and_few_progress_events(
    tmp_path: Path,
) -> None:
    rec = Recorder()
    # One interval longer than any run: the first lines go out at once, the rest at the end.
    ctx = make_ctx(
        tmp_path, recorder=rec, tool_output_max_chars=1000, tool_progress_interval_sec=1e6
    )
    with trio.fail_after(60):
        result = await TerminalTool().execute(
            {"action": "run", "command": "yes | head -c 4000000"}, ctx
        )
    assert result.ok, result.content()
    assert "characters cut" in result.output and len(result.output) < 1200
    events = [d for d in rec.emitted if d.get("stream") == "output"]
    assert 1 <= len(events) <= 2, len(events)
    assert all(len(d["text"]) <= ctx.settings.tool_progress_max_chars for d in events)
    # Every line is accounted for: shown live or counted as dropped.
    assert sum(d["lines"] + d["dropped_lines"] for d in events) == 2_000_000


async def test_progress_events_are_rate_limited_while_the_command_runs(
    tmp_path: Path,
) -> None:
    rec = Recorder()
    ctx = make_ctx(tmp_path, recorder=rec, tool_progress_interval_sec=0.5)
    code = "import sys\nfor i in range(300000):\n    print(i)\n"
    with trio.fail_after(60):
        result = await CodeExecTool().execute({"code": code}, ctx)
    assert result.ok
    events = [d for d in rec.emitted if d.get("stream") == "output"]
    duration = result.data["duration_s"] if result.data else 0
    # At most one event per interval while running, plus the final flush.
    assert len(events) <= duration / 0.5 + 2, (len(events), duration)
    assert sum(d["lines"] + d["dropped_lines"] for d in events) == 300000
    assert events[-1]["text"].endswith("299999")


async def test_20_mb_of_output_costs_bounded_memory(tmp_path: Path) -> None:
    # Half a million lines of 40 characters: tracemalloc's cost is per allocation, and
    # lines of 10 (two million) took three times as long for the same bound. Measured:
    # a peak of 0.7 MB; keeping the output, or its lines, would pass 20 MB.
    ctx = make_ctx(tmp_path, tool_progress_interval_sec=0.05)
    tracemalloc.start()
    try:
        with trio.fail_after(120):
            result = await TerminalTool().execute(
                {"action": "run", "command": f"yes {'0123456789' * 4} | head -c {20 * MB}"}, ctx
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.ok, result.content()
    assert len(result.output) < ctx.settings.tool_output_max_chars + 200
    assert peak < 10 * MB, f"peak {peak / MB:.1f} MB"


def test_progress_keeps_the_newest_lines_within_its_size() -> None:
    sent: list[dict[str, object]] = []
    progress = OutputProgress(sent.append, interval=1.0, max_chars=20)
    progress.add(["one", "two", "three"])
    progress.add([f"line{i}" for i in range(1000)])
    progress.flush()
    (event,) = sent
    assert event["text"] == "line998\nline999"
    assert event["lines"] == 2 and event["dropped_lines"] == 1001
    progress.flush()
    assert len(sent) == 1  # nothing new: nothing sent


async def test_reading_a_huge_file_without_newlines_reads_no_more_than_the_cap(
    tmp_path: Path,
) -> None:
    ctx = make_ctx(tmp_path, tool_output_max_chars=5000)
    ctx.session_dir.mkdir(parents=True)
    big = ctx.session_dir / "big.txt"
    with big.open("wb") as fh:
        for _ in range(30):
            fh.write(b"x" * MB)
    tracemalloc.start()
    try:
        with trio.fail_after(60):
            result = await FilesystemTool().execute({"action": "read", "path": "big.txt"}, ctx)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.ok, result.content()
    assert result.output.startswith("x" * 5000 + "…")
    assert len(result.output) < 5100
    assert peak < 5 * MB, f"peak {peak / MB:.1f} MB"


async def test_reading_a_long_line_between_short_ones_counts_every_line(
    tmp_path: Path,
) -> None:
    ctx = make_ctx(tmp_path, tool_output_max_chars=100)
    ctx.session_dir.mkdir(parents=True)
    (ctx.session_dir / "f.txt").write_text("a\n" + "é" * 10000 + "\nb\nc")
    fs = FilesystemTool()
    with trio.fail_after(20):
        first = await fs.execute({"action": "read", "path": "f.txt"}, ctx)
        second = await fs.execute({"action": "read", "path": "f.txt", "offset": 2}, ctx)
        third = await fs.execute({"action": "read", "path": "f.txt", "offset": 3}, ctx)
    assert first.output == "a\n\n[lines 1-1 of 4; continue with offset=2]"
    assert second.output.startswith("é" * 100 + "…\n")
    assert second.output.endswith("[lines 2-2 of 4; continue with offset=3]")
    assert third.output == "b\nc\n[lines 3-4 of 4]"


# -- secrets ------------------------------------------------------------------------

SECRETS = {
    "NAVI_LLM_API_KEY": "sk-navi-llm-secret",
    "NAVI_TOKEN": "navi-token-secret",
    "OPENAI_API_KEY": "sk-openai-secret",
    "NAVI_ADMIN_TOKEN": "admin-token-secret",
}


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NAVI_MODEL", "visible-model")


def test_secret_names_are_recognised() -> None:
    assert all(is_secret(name) for name in SECRETS)
    assert is_secret("NAVI_WS_SECRET") and is_secret("navi_llm_api_key")
    assert is_secret("NAVI_SIGNING_KEY") and is_secret("NAVI_DB_PASSWORD")
    keep = ("PATH", "HOME", "NAVI_MODEL", "GH_TOKEN", "NAVI_COMPRESSION_MAX_TOKENS")
    assert not any(is_secret(n) for n in keep)


@pytest.mark.usefixtures("secret_env")
async def test_terminal_and_code_exec_do_not_see_navis_secrets(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    # An allow-list: NAVI_MODEL reaches the command only because the profile names it.
    ctx = attrs.evolve(ctx, profile=attrs.evolve(ctx.profile, env=("NAVI_MODEL",)))
    with trio.fail_after(30):
        shell = await TerminalTool().execute({"action": "run", "command": "env"}, ctx)
        python = await CodeExecTool().execute(
            {"code": "import os\nfor k, v in os.environ.items(): print(k, v)"}, ctx
        )
    for result in (shell, python):
        assert result.ok, result.content()
        assert "visible-model" in result.output  # the environment is there ...
        for value in SECRETS.values():
            assert value not in result.output  # ... without the secrets


@pytest.mark.usefixtures("secret_env")
async def test_persistent_processes_do_not_see_navis_secrets(tmp_path: Path) -> None:
    pool = ProcessPool()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            handle = await pool.open("s1", "env", tmp_path, env=passed_env(["NAVI_MODEL"]))
            assert await pool.wait_exit("s1", handle) == 0
            output = (await pool.read("s1", handle, 1_000_000)).output
            nursery.cancel_scope.cancel()
    assert "visible-model" in output
    assert not any(value in output for value in SECRETS.values())
    assert not any(name in child_env() for name in SECRETS)
