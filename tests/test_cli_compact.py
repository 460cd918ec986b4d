"""``navi compact --session ID``: the way out of context_too_large from the shell.

Rules: as tests/test_cli.py (real subprocesses forked from the warm fork server, the
fake LLM on 127.0.0.1, port 0, an absolute deadline per command, the DB under tmp_path).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import ANSWER, _one_error_line, fake_llm, forked, messages

from navi_trio.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow  # its tests start processes


async def _seed(db: Path, session_id: str) -> None:
    earlier = {"role": "user", "content": "earlier"}
    async with SQLiteStore.open(db) as store:
        await store.create_session(session_id, profile_id="general")
        await store.append(session_id, messages=[earlier], context=[earlier])


async def test_a_stuck_session_is_compacted_from_the_cli_and_works_again(
    env: dict[str, str], tmp_path: Path
) -> None:
    db = tmp_path / "navi.db"
    env = {**env, "OLLAMA_NUM_CTX": "1024"}
    huge = "START " + "word " * 1500 + "END"
    await _seed(db, "s-stuck")
    async with fake_llm(tmp_path, [{"text": ANSWER}]) as url:
        opts = ("--llm-url", url)
        done = await forked("run", *opts, "--session", "s-stuck", huge, env=env, cwd=tmp_path)
        assert done.code == 1, done
        assert "navi compact --session s-stuck" in done.out

        done = await forked("compact", *opts, "--session", "s-stuck", env=env, cwd=tmp_path)
        assert done.code == 0, done
        assert "compacted: 0 older messages summarised" in done.out and " -> ~" in done.out

        done = await forked("run", *opts, "--session", "s-stuck", "go on", env=env, cwd=tmp_path)
        assert done.code == 0, done
        assert done.out.strip() == ANSWER
    history = await messages(db, "s-stuck")
    assert any(m["content"] == huge for m in history)  # the display history keeps it all


async def test_compact_names_an_unknown_session_and_nothing_to_compact(
    env: dict[str, str], tmp_path: Path
) -> None:
    db = tmp_path / "navi.db"
    await _seed(db, "s-short")
    async with fake_llm(tmp_path, [{"text": ANSWER}]) as url:
        opts = ("--llm-url", url)
        done = await forked("compact", *opts, "--session", "s-nope", env=env, cwd=tmp_path)
        assert done.code == 1
        assert f"unknown session 's-nope' (in {db})" in _one_error_line(done)

        done = await forked("compact", *opts, "--session", "s-short", env=env, cwd=tmp_path)
        assert done.code == 1
        assert "nothing to compact" in _one_error_line(done)

        done = await forked("compact", *opts, env=env, cwd=tmp_path)
        assert done.code == 1 and "--session" in _one_error_line(done)
