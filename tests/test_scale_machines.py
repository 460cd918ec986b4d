"""Daemons with data folders of their own on one database, as machines are (docs/pages/
scaling.md): each folder's local admin token opens every daemon, and starting or
restarting one daemon never breaks another's token file.

Real `navi serve` processes on one PostgreSQL; waits are for lines and frames; every
test under `trio.fail_after`; every process is killed on the way out.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from daemons import connect_as, no_plan_config, pg_daemons
from pg_server import pg_url_with_schema as pg_url_with_schema
from reliability import Daemon, clean_env, navi_serve

from navi_trio.api.auth import read_local_token
from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow

TIMEOUT = 120


async def admitted_everywhere(daemons: list[Daemon], tokens: list[str]) -> None:
    for d in daemons:
        for token in tokens:
            async with connect_as(d.url, token) as c:
                assert c.frames[-1]["user"]["role"] == "admin", c.frames[-1]


async def test_each_folders_local_token_opens_every_daemon_across_restarts(
    tmp_path: Path, pg_url: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm([{"text": "hi"}], loop=True) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 2, separate=True, forked=True) as (a, b),
        ):
            tokens = [read_local_token(d.data_dir) for d in (a, b)]
            assert None not in tokens and tokens[0] != tokens[1], tokens
            kept = [t for t in tokens if t is not None]
            await admitted_everywhere([a, b], kept)
            # A again, on its own folder: both folders' tokens still open both daemons.
            a.proc.kill()
            await a.proc.wait()
            env = clean_env(tmp_path, NAVI_CONFIG=str(no_plan_config(tmp_path)))
            env.update(NAVI_DB=pg_url, NAVI_DATA_DIR=str(a.data_dir))
            async with navi_serve(env, llm.url, tmp_path / "again.log") as again:
                assert [read_local_token(d.data_dir) for d in (again, b)] == kept
                await admitted_everywhere([again, b], kept)
