"""`navi compact --session ID`: compress a session's context, as the chat's /compact does.

The way out of ``context_too_large``: the older context is summarised and any kept
message too big to fit is cut, so the next turn fits the model's window (the display
history keeps every message). It prints the compaction's frames until it ends.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TextIO

import trio

from navi_trio import wire
from navi_trio.api.endpoint import Endpoint, connect, open_endpoint
from navi_trio.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    chosen_llm_settings,
    config_source,
    load_settings,
    one_line,
    run_target,
)
from navi_trio.cli.runner import private_endpoint
from navi_trio.errors import RemoteError, UsageError
from navi_trio.settings import Settings


async def compact_session(
    endpoint: Endpoint, session_id: str, out: TextIO, *, db: Path | None = None
) -> str | None:
    """Forced compression of one session; prints what it did. Returns an error or None.
    `db`: the database of a private daemon, named when the session is not in it."""
    from navi_trio.events import (
        CompressionStarted,
        ContextCompressed,
        ErrorEvent,
        event_from_dict,
    )

    async with connect(endpoint) as daemon:
        try:
            await daemon.request(wire.compact(session_id))
        except RemoteError as exc:
            if exc.code == "not_found":
                where = "`navi sessions` lists them" if db is None else f"in {db}"
                raise UsageError(f"unknown session {session_id[:64]!r} ({where})") from None
            raise
        async for frame in daemon:
            if frame.get("session_id") != session_id or not wire.is_session_frame(frame):
                continue
            event = event_from_dict({k: v for k, v in frame.items() if k != "epoch"})
            if event.is_subagent:
                continue
            if isinstance(event, CompressionStarted):
                print(
                    f"compacting session {session_id} (~{event.tokens_before} tokens)…",
                    file=out,
                    flush=True,
                )
            elif isinstance(event, ContextCompressed):
                print(
                    f"compacted: {event.messages_summarised} older messages summarised, "
                    f"~{event.tokens_before} -> ~{event.tokens_after} tokens",
                    file=out,
                    flush=True,
                )
                return None
            elif isinstance(event, ErrorEvent):
                return one_line(event.message)
    return None  # not reached: the stream ends only by an error


def cmd_compact(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if not args.session.strip():
        raise UsageError("--session is empty")
    settings = load_settings(args)
    error = trio.run(_compact, args, settings, out, err)
    if error is not None:
        print(f"navi: error: compacting failed, the context was left as it was: {error}", file=err)
        return EXIT_ERROR
    return EXIT_OK


async def _compact(
    args: argparse.Namespace, settings: Settings, out: TextIO, err: TextIO
) -> str | None:
    target = run_target(args, settings)
    async with open_endpoint(target, lambda: _private(args, err)) as endpoint:
        db = settings.db_path if endpoint.private else None
        return await compact_session(endpoint, args.session, out, db=db)


@asynccontextmanager
async def _private(args: argparse.Namespace, err: TextIO) -> AsyncIterator[Endpoint]:
    """A private daemon with the LLM chosen here, as `navi run` chooses it."""
    settings = await chosen_llm_settings(args, err)
    async with private_endpoint(settings, config_source(settings)) as endpoint:
        yield endpoint
