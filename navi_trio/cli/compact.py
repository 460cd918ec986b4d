"""`navi compact --session ID`: compress a session's context in this process.

The way out of ``context_too_large``: the older part of the context is summarised with
the LLM and any kept message too big to fit is cut, so the next turn fits the model's
window. The display history keeps every message.
"""

from __future__ import annotations

import argparse
from typing import TextIO

import trio

from navi_trio.cli.common import EXIT_ERROR, EXIT_OK, config_source, llm_settings, one_line
from navi_trio.errors import UsageError
from navi_trio.profiles import ConfigSource
from navi_trio.settings import Settings


async def compact_session(
    settings: Settings, source: ConfigSource, session_id: str, out: TextIO
) -> str | None:
    """Forced compression of one session; prints what it did. Returns an error or None."""
    from navi_trio.events import CompressionStarted, ContextCompressed, ErrorEvent
    from navi_trio.runtime import open_runtime

    async with open_runtime(settings, config=source) as rt:
        if await rt.store.get_session(session_id) is None:
            raise UsageError(f"unknown session {session_id[:64]!r} (in {settings.db_path})")
        error: str | None = None
        async with rt.agent.compact_stream(session_id) as events:
            async for event in events:
                if isinstance(event, CompressionStarted):
                    print(f"compacting session {session_id} (~{event.tokens_before} tokens)…",
                          file=out, flush=True)  # fmt: skip
                elif isinstance(event, ContextCompressed):
                    print(
                        f"compacted: {event.messages_summarised} older messages summarised, "
                        f"~{event.tokens_before} -> ~{event.tokens_after} tokens",
                        file=out,
                        flush=True,
                    )
                elif isinstance(event, ErrorEvent):
                    error = one_line(event.message)
    return error


def cmd_compact(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if not args.session.strip():
        raise UsageError("--session is empty")
    settings = llm_settings(args, err)
    source = config_source(settings)
    error = trio.run(compact_session, settings, source, args.session, out)
    if error is not None:
        print(f"navi: error: compacting failed, the context was left as it was: {error}",
              file=err)  # fmt: skip
        return EXIT_ERROR
    return EXIT_OK
