"""The ``navi`` command: `main` parses the arguments and runs one subcommand.

Every failure becomes one line ``navi: error: ...`` on stderr and a non-zero exit code
(1; 128 + the signal when a run was stopped by Ctrl-C, SIGTERM or SIGHUP). A traceback
is printed only with ``NAVI_DEBUG=1``: the person at the shell needs the reason, not our
stack. Each family of subcommands is a module of this package, imported when its
command runs, so `navi --help` stays light.
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
from typing import Any, NoReturn, TextIO

import trio

from navi_trio import __version__
from navi_trio.api.remote import DEFAULT_URL
from navi_trio.cli.acp import add_acp_parser, cmd_acp
from navi_trio.cli.chat import serve_args_for_chat as serve_args_for_chat
from navi_trio.cli.common import DEBUG_HINT as _DEBUG_HINT
from navi_trio.cli.common import EXIT_ERROR as EXIT_ERROR
from navi_trio.cli.common import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from navi_trio.cli.common import EXIT_OK as EXIT_OK
from navi_trio.cli.common import Command, add_token_option, lazy_command, llm_given
from navi_trio.cli.common import UsageError as UsageError
from navi_trio.cli.common import config_source as config_source
from navi_trio.cli.common import llm_settings as llm_settings
from navi_trio.cli.common import load_settings as load_settings
from navi_trio.cli.common import one_line as one_line
from navi_trio.cli.daemon import COMMANDS as DAEMON_COMMANDS
from navi_trio.cli.daemon import add_parsers as add_daemon_parsers
from navi_trio.cli.mcp import add_mcp_parser, cmd_mcp
from navi_trio.cli.profiles import add_profiles_parser, cmd_profiles
from navi_trio.cli.rewind import add_parsers as add_rewind_parsers
from navi_trio.errors import NaviError, RemoteError, leaves
from navi_trio.imports import start_up_collections
from navi_trio.llm.factory import (
    BACKENDS,
    backend_configured,
)
from navi_trio.wire import ON_BUSY


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _debug() -> bool:
    return os.environ.get("NAVI_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def _add_endpoint_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--db", metavar="PATH|URL", help="SQLite file or postgresql:// URL (env NAVI_DB)"
    )
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


def _add_doctor(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="report the config, the DB and whether the LLM answers",
        description="Report the config, the DB and whether the LLM endpoint answers. "
        "Exit 1 when the config or the DB is broken (a down LLM is only a warning).",
    )
    _add_endpoint_options(doctor)
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.add_argument("--url", default=DEFAULT_URL, help="the daemon to look for")
    doctor.add_argument(
        "--cwd",
        type=Path,
        default=None,
        help="the folder whose project files (AGENTS.md, skills) are listed (default: this one)",
    )


def _add_run(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="run one turn and print the answer",
        description="Run one turn of the agent and print the final answer as it streams: "
        "in the daemon when one answers (--url, default the local one), else in a private "
        "daemon of this process, which then waits for the turn's background tasks before "
        "it exits. "
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
    add_token_option(run)
    run.add_argument(
        "--mode",
        choices=("read-only", "workspace", "full"),
        help="safety mode for this run, within what your role allows (default: the profile's)",
    )
    run.add_argument(
        "--on-busy",
        choices=ON_BUSY,
        help="when the session is running a turn: enqueue (wait), reject, interrupt (stop it "
        "and run this next) or steer (join the running turn); default: the profile's",
    )
    _add_endpoint_options(run)


def _add_compact(sub: Any) -> None:
    compact = sub.add_parser(
        "compact",
        help="compress a session's context (the way out of context_too_large)",
        description="Summarise the older part of a session's context with the LLM and cut "
        "any kept message too big to fit, so the next turn fits the model's window. "
        "The display history keeps every message.",
    )
    compact.add_argument("--session", metavar="ID", required=True, help="the session")
    compact.add_argument(
        "--url", help=f"compact it in this daemon (default: {DEFAULT_URL} if it answers)"
    )
    add_token_option(compact)
    _add_endpoint_options(compact)


def _add_chat(sub: Any) -> None:
    chat = sub.add_parser(
        "chat",
        help="chat with the daemon in this terminal",
        description="Chat with the navi daemon at --url (one is started in the background "
        "when none answers). Ctrl-C stops a run; /help lists the commands.",
    )
    chat.add_argument("--url", default="ws://127.0.0.1:8765", help="daemon WebSocket URL")
    chat.add_argument("--session", metavar="ID", help="resume this session (default: new)")
    chat.add_argument("--profile", metavar="P", help="profile for new messages")
    add_token_option(chat)
    _add_local_options(chat)


def _add_web(sub: Any) -> None:
    web = sub.add_parser(
        "web",
        help="print the browser page's address with a one-time sign-in link",
        description="Ask the running daemon for a one-time sign-in code and print the "
        "page's address with it: opened within a minute it signs the browser in (once); "
        "the token itself is never in the link.",
    )
    web.add_argument("--url", help=f"the daemon (default: {DEFAULT_URL})")
    add_token_option(web)


_OWN_PARSERS: dict[str, Callable[[Any], None]] = {
    "doctor": _add_doctor,
    "run": _add_run,
    "compact": _add_compact,
    "chat": _add_chat,
    "web": _add_web,
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """navi's parser. For a `command` of this module's own (`_OWN_PARSERS`: `navi run`...)
    only that subcommand's parser is built, the same one, in a third of the whole
    parser's time; `navi --help`, every other command and a wrong name get the whole."""
    parser = _Parser(prog="navi", description="navi_trio: a local LLM agent on trio.")
    parser.add_argument("--version", action="version", version=f"navi {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, add in _OWN_PARSERS.items():
        if command not in _OWN_PARSERS or command == name:
            add(sub)
    if command in _OWN_PARSERS:
        return parser
    add_rewind_parsers(sub, _add_endpoint_options)
    add_daemon_parsers(sub, _add_endpoint_options)
    add_mcp_parser(sub, _add_endpoint_options)
    add_profiles_parser(sub, _add_endpoint_options)
    add_acp_parser(sub, _add_endpoint_options)
    return parser


def cmd_doctor(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: the doctor pulls in much that `navi run` / `navi serve` do not need.
    from navi_trio.cli.doctor import collect_doctor, print_doctor
    from navi_trio.client.daemon import host_port

    host_port(args.url)  # a bad --url is named here, not by the WebSocket library
    settings = load_settings(args)
    configured = backend_configured(os.environ, given=llm_given(args))
    report = trio.run(
        lambda: collect_doctor(settings, args.url, configured=configured, cwd=args.cwd)
    )
    if args.json:
        print(json.dumps(report, indent=None), file=out)
    else:
        print_doctor(report, out)
    if report["errors"]:
        print(f"navi: error: {one_line(report['errors'][0])}", file=err)
        return EXIT_ERROR
    return EXIT_OK


_COMMANDS: dict[str, Command] = {
    "doctor": cmd_doctor,
    "run": lazy_command("run", "cmd_run"),
    "compact": lazy_command("compact", "cmd_compact"),
    "rewind": lazy_command("rewind", "cmd_rewind"),
    "fork": lazy_command("rewind", "cmd_fork"),
    "chat": lazy_command("chat", "cmd_chat"),
    "web": lazy_command("web", "cmd_web"),
    "mcp": cmd_mcp,
    "acp": cmd_acp,
    "profiles": cmd_profiles,
    **DAEMON_COMMANDS,
}


def _refusal(exc: RemoteError, token_given: bool) -> str:
    """A refusal of the daemon in words: its message (the wire code is for --events),
    and for a refused token where the right one is."""
    if exc.code != "unauthorized":
        return one_line(exc.detail)
    from navi_trio.client.daemon import token_hint
    from navi_trio.settings import Settings

    refused = f"the daemon refused the token ({one_line(exc.detail)})"
    try:
        data_dir = Settings.from_env(os.environ).data_dir
    except NaviError:
        return refused
    return f"{refused}; {token_hint(data_dir, token_given)}"


def _describe(exc: BaseException, *, token_given: bool = False) -> tuple[str, bool]:
    """The one-line message for `exc`, and whether it was expected (no debug hint).
    `token_given`: the command had --token or NAVI_TOKEN (said when one is refused)."""
    found = leaves(exc)
    # A daemon's "internal" refusal is a bug of ours there: its traceback is in its log
    # (a private daemon's shows with NAVI_DEBUG=1, as any of this process).
    expected = all(
        isinstance(e, NaviError | OSError | UsageError)
        and not (isinstance(e, RemoteError) and e.code == "internal")
        for e in found
    )
    parts = []
    for e in found:
        text = one_line(str(e))
        if isinstance(e, RemoteError):
            parts.append(_refusal(e, token_given))
        elif isinstance(e, NaviError | UsageError) and text:
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
    """The ``navi`` console script: returns the exit code. Its start-up (the command's
    imports, a runtime's opening) runs with fewer garbage collections (navi_trio/imports.py)."""
    with start_up_collections():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    out, err = sys.stdout, sys.stderr
    debug = _debug()
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(words[0] if words else None).parse_args(words)
        # As given: `navi serve --workers N` starts its workers with the same arguments.
        args.raw_argv = words
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
        if all(isinstance(e, KeyboardInterrupt) for e in leaves(exc)):
            return EXIT_INTERRUPTED
        if not isinstance(exc, Exception):
            raise  # SystemExit and friends are not ours to report
        given = bool(getattr(args, "token", None) or os.environ.get("NAVI_TOKEN"))
        message, _ = _describe(exc, token_given=given)
        if debug:
            traceback.print_exception(exc, file=err)
        print(f"navi: error: {message}", file=err)
        return EXIT_ERROR
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        err.flush()
