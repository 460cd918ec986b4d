"""Reliability: a daemon's memory stays bounded under hostile output (issue 11).

A real `navi serve` subprocess; its peak resident set (the kernel's VmHWM, no sampling)
stays under 200 MB while, one after the other in one session: the terminal tool runs a
command printing 50 MB of short lines, the filesystem tool reads a 300 MB file with no
newline (sparse: a text head, then a hole), and the LLM streams without end until the
answer cap. Each ends with a clear result and the session answers normally after.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client
from reliability import clean_env, navi_serve, peak_rss_mb

from navi_trio import wire
from navi_trio.settings import default_config_path
from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow
LIMIT_MB = 200
PRINT_BYTES = 50_000_000
FILE_BYTES = 300_000_000


def _config(tmp_path: Path) -> Path:
    """The shipped config with no first-message plan (the script has no plan replies)."""
    folder = tmp_path / "config"
    shutil.copytree(default_config_path().parent, folder)
    path = folder / default_config_path().name
    data = json.loads(path.read_text(encoding="utf-8"))
    data["profiles"]["general"]["planning_first_message"] = False
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


async def _turn(
    c: Client, sid: str | None, text: str, cwd: Path
) -> tuple[str, list[dict[str, Any]]]:
    frame: dict[str, Any] = {"type": "message", "content": text, "cwd": str(cwd)}
    if sid is not None:
        frame["session_id"] = sid
    got = await c.request(frame)
    sid = str(got["session_id"])
    frames: list[dict[str, Any]] = []
    while True:
        f = await c.until(lambda f: f.get("session_id") == sid and wire.is_session_frame(f))
        frames.append(f)
        if f["type"] == "stream_end" and not f["is_subagent"]:
            return sid, frames


async def test_peak_rss_stays_bounded_under_hostile_output(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    big = work / "big.txt"
    with big.open("wb") as f:
        f.write(b"a" * (1 << 20))  # a text head, then a hole of zeros: no newline at all
        f.truncate(FILE_BYTES)
    endless_word = "y" * 1000
    replies = [
        _call("terminal", action="run",
              command=f"yes 0123456789abcdef | head -c {PRINT_BYTES}", timeout=120),
        {"text": "printed"},
        _call("filesystem", action="read", path="big.txt"),
        {"text": "read"},
        {"text": endless_word, "endless": True},
        {"text": "still fine"},
    ]  # fmt: skip
    # A window large enough that no compression call takes a reply of the script.
    env = clean_env(tmp_path, NAVI_CONFIG=str(_config(tmp_path)), OLLAMA_NUM_CTX="2000000")
    with trio.fail_after(240):
        async with open_fake_llm(replies, n_ctx=2_000_000) as llm:
            async with navi_serve(env, llm.url, tmp_path / "serve.log") as d, d.connect() as c:
                base = peak_rss_mb(d.pid)
                sid, frames = await _turn(c, None, "print a lot", work)
                (result,) = [f for f in frames if f["type"] == "tool_result"]
                assert result["name"] == "terminal" and result["ok"], result
                assert frames[-1]["text"] == "printed"
                after_print = peak_rss_mb(d.pid)

                _, frames = await _turn(c, sid, "read the big file", work)
                (result,) = [f for f in frames if f["type"] == "tool_result"]
                assert result["name"] == "filesystem", result
                assert frames[-1]["text"] == "read"
                after_read = peak_rss_mb(d.pid)

                _, frames = await _turn(c, sid, "say everything", work)
                (err,) = [f for f in frames if f["type"] == "error"]
                assert "answer" in err["message"], err
                assert frames[-1]["reason"] == "error"
                after_endless = peak_rss_mb(d.pid)

                _, frames = await _turn(c, sid, "are you there", work)
                assert frames[-1]["text"] == "still fine", [
                    (f.get("code"), f.get("message"), f.get("reason")) for f in frames
                ]
                peak = peak_rss_mb(d.pid)
    print(
        f"memory suite: peak RSS MB: start {base:.0f}, after 50 MB print {after_print:.0f}, "
        f"after 300 MB read {after_read:.0f}, after endless {after_endless:.0f}, end {peak:.0f}"
    )
    assert peak < LIMIT_MB, f"peak RSS {peak:.0f} MB"
