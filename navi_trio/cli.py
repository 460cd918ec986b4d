"""The ``navi`` command.

    navi --help | --version
    navi doctor [--db PATH] [--config PATH] [--llm-url URL] [--backend B] [--json]
    navi run [--session ID] [--profile P] [--cwd DIR] [--events] [--local] ... "message"
    navi compact --session ID [--db PATH] [--config PATH] [--llm-url URL] [--backend B]
    navi chat [--url URL] [--session ID] [--profile P] [--token T] [--local [--model-file PATH]]
    navi serve | users | sessions | tasks        (the daemon: see cli_daemon.py)
    navi mcp list [--config PATH]                (MCP servers: see cli_mcp.py)
    navi mcp serve [--url URL] [--profile P] [--mode M] ...   (navi as an MCP server)

`main` parses the arguments, runs the subcommand under `trio.run` and turns every
failure into one line ``navi: error: ...`` on stderr and a non-zero exit code (1; 128 +
the signal when a run was stopped by Ctrl-C, SIGTERM or SIGHUP). A traceback is printed
only with ``NAVI_DEBUG=1``: the person at the shell needs the reason, not our stack.
Each subcommand is one entry of `_COMMANDS`; `run` lives in cli_run.py, the daemon's
commands in cli_daemon.py, and what they all share in cli_common.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TextIO

import trio

from navi_trio import __version__
from navi_trio.api.remote import DEFAULT_URL
from navi_trio.cli_common import DEBUG_HINT as _DEBUG_HINT
from navi_trio.cli_common import EXIT_ERROR as EXIT_ERROR
from navi_trio.cli_common import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from navi_trio.cli_common import EXIT_OK as EXIT_OK
from navi_trio.cli_common import UsageError as UsageError
from navi_trio.cli_common import config_source as config_source
from navi_trio.cli_common import llm_given
from navi_trio.cli_common import llm_settings as llm_settings
from navi_trio.cli_common import load_settings as load_settings
from navi_trio.cli_common import one_line as one_line
from navi_trio.cli_daemon import COMMANDS as DAEMON_COMMANDS
from navi_trio.cli_daemon import add_parsers as add_daemon_parsers
from navi_trio.cli_mcp import add_mcp_parser, cmd_mcp
from navi_trio.errors import NaviError
from navi_trio.events import ErrorEvent
from navi_trio.llm.factory import (
    BACKENDS,
    backend_configured,
)
from navi_trio.profiles import ConfigSource
from navi_trio.settings import Settings


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _debug() -> bool:
    return os.environ.get("NAVI_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


# ------------------------------------------------------------------------- parser


def _add_endpoint_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=Path, metavar="PATH", help="SQLite file (env NAVI_DB)")
    p.add_argument("--config", type=Path, metavar="PATH", help="config.json (env NAVI_CONFIG)")
    p.add_argument("--llm-url", metavar="URL", help="LLM endpoint (env OLLAMA_HOST)")
    p.add_argument("--backend", choices=BACKENDS, help="LLM dialect (env NAVI_LLM_BACKEND)")
    _add_local_options(p)


def _add_local_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--local",
        action="store_true",
        help="the embedded local model (llama.cpp in a process of its own; the `local` profile "
        "for new sessions, num_ctx 4096 unless OLLAMA_NUM_CTX)",
    )
    p.add_argument(
        "--model-file", type=Path, metavar="PATH", help="GGUF for --local (env NAVI_MODEL_FILE)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="navi", description="navi_trio: a local LLM agent on trio.")
    parser.add_argument("--version", action="version", version=f"navi {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    doctor = sub.add_parser(
        "doctor",
        help="report the config, the DB and whether the LLM answers",
        description="Report the config, the DB and whether the LLM endpoint answers. "
        "Exit 1 when the config or the DB is broken (a down LLM is only a warning).",
    )
    _add_endpoint_options(doctor)
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.add_argument("--url", default=DEFAULT_URL, help="the daemon to look for")

    run = sub.add_parser(
        "run",
        help="run one turn and print the answer",
        description="Run one turn of the agent and print the final answer as it streams: "
        "in the daemon when one answers (--url, default the local one), else in this "
        "process, which then waits for the turn's background tasks before it exits. "
        "Ctrl-C, SIGTERM or SIGHUP stops the run cleanly (the partial answer is saved).",
    )
    run.add_argument("message", help="the user message ('-' reads it from stdin)")
    run.add_argument("--session", metavar="ID", help="continue this session (default: new)")
    run.add_argument("--profile", metavar="P", help="profile for the session")
    run.add_argument("--cwd", type=Path, metavar="DIR", help="working directory for tools")
    run.add_argument(
        "--events", action="store_true", help="print every event as one JSON line instead"
    )
    run.add_argument("--url", help=f"run it in this daemon (default: {DEFAULT_URL} if it answers)")
    run.add_argument("--token", metavar="T", help="token (env NAVI_TOKEN, else local-token)")
    run.add_argument(
        "--mode",
        choices=("read-only", "workspace", "full"),
        help="safety mode for this run, within what your role allows (default: the profile's)",
    )
    _add_endpoint_options(run)

    compact = sub.add_parser(
        "compact",
        help="compress a session's context (the way out of context_too_large)",
        description="Summarise the older part of a session's context with the LLM and cut "
        "any kept message too big to fit, so the next turn fits the model's window. "
        "The display history keeps every message.",
    )
    compact.add_argument("--session", metavar="ID", required=True, help="the session")
    _add_endpoint_options(compact)
    chat = sub.add_parser(
        "chat",
        help="chat with the daemon in this terminal",
        description="Chat with the navi daemon at --url (one is started in the background "
        "when none answers). Ctrl-C stops a run; /help lists the commands.",
    )
    chat.add_argument("--url", default="ws://127.0.0.1:8765", help="daemon WebSocket URL")
    chat.add_argument("--session", metavar="ID", help="resume this session (default: new)")
    chat.add_argument("--profile", metavar="P", help="profile for new messages")
    chat.add_argument("--token", metavar="T", help="token (env NAVI_TOKEN, else local-token)")
    _add_local_options(chat)
    add_daemon_parsers(sub, _add_endpoint_options)
    add_mcp_parser(sub, _add_endpoint_options)
    return parser


# ------------------------------------------------------------------------- doctor


def cmd_doctor(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: the doctor pulls in much that `navi run` / `navi serve` do not need.
    from navi_trio.doctor import collect_doctor, print_doctor

    settings = load_settings(args)
    configured = backend_configured(os.environ, given=llm_given(args))
    report = trio.run(lambda: collect_doctor(settings, args.url, configured=configured))
    if args.json:
        print(json.dumps(report, indent=None), file=out)
    else:
        print_doctor(report, out)
    if report["errors"]:
        print(f"navi: error: {one_line(report['errors'][0])}", file=err)
        return EXIT_ERROR
    return EXIT_OK


# ------------------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`navi run`: through the daemon or an embedded runtime (cli_run.py)."""
    from navi_trio.cli_run import cmd_run as run

    return run(args, out, err)


# ------------------------------------------------------------------------- compact


async def compact_session(
    settings: Settings, source: ConfigSource, session_id: str, out: TextIO
) -> str | None:
    """Forced compression of one session; prints what it did. Returns an error or None."""
    from navi_trio.events import CompressionStarted, ContextCompressed
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


# ------------------------------------------------------------------------- chat


def serve_args_for_chat(args: argparse.Namespace, err: TextIO) -> list[str]:
    """The backend options of the daemon `navi chat` is about to start.

    `--local` is passed on; with nothing configured the choice is made here, so its one
    line shows in this terminal (not in the daemon's log), and passed on explicitly.
    """
    settings = llm_settings(args, err)
    if settings.llm_backend == "local":
        from navi_trio.llm.local import resolve_model_file

        resolve_model_file(settings.model_file)  # a missing extra or file: say so here
        extra = ["--model-file", str(settings.model_file)] if args.model_file else []
        return ["--local", *extra]
    if llm_given(args) or backend_configured(os.environ, given=False):
        return []  # configured in the environment: the daemon inherits it
    return ["--backend", "ollama"]


def cmd_chat(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from navi_trio.client.daemon import daemon_needed
    from navi_trio.client.main import chat

    settings = Settings.from_env(os.environ)
    serve_args: list[str] = []
    if trio.run(daemon_needed, args.url):
        serve_args = serve_args_for_chat(args, err)
    return chat(
        url=args.url,
        data_dir=settings.data_dir,
        session_id=args.session,
        profile=args.profile,
        token=args.token,
        err=err,
        serve_args=serve_args,
        want_backend="local" if args.local else None,
    )


# ------------------------------------------------------------------------- main

_COMMANDS: dict[str, Callable[[argparse.Namespace, TextIO, TextIO], int]] = {
    "doctor": cmd_doctor,
    "run": cmd_run,
    "compact": cmd_compact,
    "chat": cmd_chat,
    "mcp": cmd_mcp,
    **DAEMON_COMMANDS,
}


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _describe(exc: BaseException) -> tuple[str, bool]:
    """The one-line message for `exc`, and whether it was expected (no debug hint)."""
    leaves = _leaves(exc)
    expected = all(isinstance(e, NaviError | OSError | UsageError) for e in leaves)
    parts = []
    for e in leaves:
        text = one_line(str(e))
        if isinstance(e, NaviError | UsageError) and text:
            parts.append(text)
        else:
            parts.append(f"{type(e).__name__}: {text}" if text else type(e).__name__)
    message = "; ".join(dict.fromkeys(parts))
    return (message if expected else f"{message} {_DEBUG_HINT}"), expected


def _logging_handler(debug: bool) -> logging.Handler:
    class OneLine(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            if not debug:
                record.exc_info = record.exc_text = None
                record.stack_info = None
            return super().format(record)

    def reported_elsewhere(record: logging.LogRecord) -> bool:
        # A logged exception reaches the user as the command's own one error line (an
        # error event, or main's); the log record of it is for NAVI_DEBUG=1 only.
        return debug or not record.exc_info

    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(reported_elsewhere)
    handler.setFormatter(OneLine("navi: %(levelname)s: %(name)s: %(message)s"))
    handler.setLevel(logging.DEBUG if debug else logging.WARNING)
    return handler


def main(argv: Sequence[str] | None = None) -> int:
    """The ``navi`` console script: returns the exit code."""
    out, err = sys.stdout, sys.stderr
    debug = _debug()
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"navi: error: {exc}", file=err)
        return EXIT_ERROR
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK

    root = logging.getLogger()
    handler = _logging_handler(debug)
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.DEBUG if debug else logging.WARNING)
    try:
        return _COMMANDS[args.command](args, out, err)
    except BaseException as exc:
        if all(isinstance(e, KeyboardInterrupt) for e in _leaves(exc)):
            return EXIT_INTERRUPTED
        if not isinstance(exc, Exception):
            raise  # SystemExit and friends are not ours to report
        message, _ = _describe(exc)
        if debug:
            traceback.print_exception(exc, file=err)
        print(f"navi: error: {message}", file=err)
        return EXIT_ERROR
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        err.flush()
