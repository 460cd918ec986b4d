"""The ``navi`` command.

    navi --help | --version
    navi doctor [--db PATH] [--config PATH] [--llm-url URL] [--backend B] [--json]
    navi run [--session ID] [--profile P] [--cwd DIR] [--events] ... "message"

`main` parses the arguments, runs the subcommand under `trio.run` and turns every
failure into one line ``navi: error: ...`` on stderr and a non-zero exit code (1; 130 on
Ctrl-C). A traceback is printed only with ``NAVI_DEBUG=1``: the person at the shell
needs the reason, not our stack. ``navi serve`` and ``navi chat`` will be further
subparsers; `_COMMANDS` is where they plug in.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

import attrs
import httpx
import trio

from navi_trio import __version__
from navi_trio.errors import ConfigError, NaviError
from navi_trio.events import (
    AgentEvent,
    ErrorEvent,
    StreamEnd,
    TextDelta,
    WarningEvent,
    event_to_dict,
)
from navi_trio.llm.factory import BACKENDS
from navi_trio.profiles import AgentProfile, ConfigSource, NaviConfig, load_config
from navi_trio.settings import Settings
from navi_trio.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from navi_trio.core.agent import RunControl

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
LLM_PING_TIMEOUT = 3.0
_DEBUG_HINT = "(run with NAVI_DEBUG=1 for the traceback)"

# Profile flags worth a glance in `navi doctor` (shown when on).
_FLAGS = (
    "planning_enabled",
    "planning_mandatory",
    "think_enabled",
    "iteration_budget_enabled",
    "planning_phase2_enabled",
    "goal_anchoring_enabled",
    "anti_stall_enabled",
    "step_validation_enabled",
    "adaptive_replan_enabled",
    "subagent_planning_enabled",
)


class UsageError(Exception):
    """Bad command-line arguments (argparse's own exit is replaced by this)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines too) made one space."""
    return " ".join(text.split())


def _debug() -> bool:
    return os.environ.get("NAVI_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


# ------------------------------------------------------------------------- parser


def _add_endpoint_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=Path, metavar="PATH", help="SQLite file (env NAVI_DB)")
    p.add_argument("--config", type=Path, metavar="PATH", help="config.json (env NAVI_CONFIG)")
    p.add_argument("--llm-url", metavar="URL", help="LLM endpoint (env OLLAMA_HOST)")
    p.add_argument("--backend", choices=BACKENDS, help="LLM dialect (env NAVI_LLM_BACKEND)")


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

    run = sub.add_parser(
        "run",
        help="run one turn in-process and print the answer",
        description="Run one turn of the agent in-process and print the final answer "
        "as it streams. Ctrl-C stops the run cleanly (the partial answer is saved).",
    )
    run.add_argument("message", help="the user message ('-' reads it from stdin)")
    run.add_argument("--session", metavar="ID", help="continue this session (default: new)")
    run.add_argument("--profile", metavar="P", help="profile for the session")
    run.add_argument("--cwd", type=Path, metavar="DIR", help="working directory for tools")
    run.add_argument(
        "--events", action="store_true", help="print every event as one JSON line instead"
    )
    _add_endpoint_options(run)
    return parser


def load_settings(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    """Settings from the environment, with the command-line options winning."""
    overrides: dict[str, Any] = {}
    for option, field in (
        ("db", "db_path"),
        ("config", "config_path"),
        ("llm_url", "llm_url"),
        ("backend", "llm_backend"),
    ):
        value = getattr(args, option, None)
        if value is not None:
            overrides[field] = value.expanduser() if isinstance(value, Path) else value
    settings = Settings.from_env(os.environ if environ is None else environ, **overrides)
    if settings.llm_backend.strip().lower() not in BACKENDS:
        raise ConfigError(
            f"NAVI_LLM_BACKEND={settings.llm_backend!r} is not a known LLM backend "
            f"(expected one of: {', '.join(BACKENDS)})"
        )
    if not settings.llm_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"LLM URL {settings.llm_url!r} (--llm-url or OLLAMA_HOST): expected an http:// or "
            "https:// URL"
        )
    return settings


# ------------------------------------------------------------------------- doctor


def _profile_info(p: AgentProfile, settings: Settings, default: str) -> dict[str, Any]:
    flags = [f.removesuffix("_enabled") for f in _FLAGS if getattr(p, f)]
    if p.goal_anchoring_enabled:
        flags[flags.index("goal_anchoring")] = f"goal_anchoring/{p.goal_anchoring_interval}"
    if p.anti_stall_enabled:
        flags[flags.index("anti_stall")] = f"anti_stall/{p.anti_stall_threshold}"
    parallel = p.parallel_tool_calls
    if parallel if parallel is not None else settings.parallel_tool_calls:
        flags.append("parallel_tool_calls")
    return {
        "id": p.id,
        "model": p.model or settings.default_model,
        "description": p.description,
        "default": p.id == default,
        "max_iterations": p.max_iterations,
        "flags": flags,
        "tools": list(p.get_agent_tools()),
    }


def _models_url(settings: Settings) -> str:
    base = settings.llm_url.rstrip("/")
    if settings.llm_backend.strip().lower() == "openai":
        return f"{base}/models" if base.endswith("/v1") else f"{base}/v1/models"
    return f"{base}/api/tags"


async def ping_llm(settings: Settings) -> dict[str, Any]:
    """GET the endpoint's model list: ``{"url", "ok", "models"|"error"}``."""
    timeout = LLM_PING_TIMEOUT
    url = _models_url(settings)
    headers = {"Authorization": f"Bearer {settings.llm_api_key}"} if settings.llm_api_key else {}
    result: dict[str, Any] = {"url": url, "ok": False}
    # The httpx timeout bounds each phase; the cancel scope bounds the whole exchange.
    with trio.move_on_after(timeout + 1):
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                response = await client.get(url, headers=headers)
            if response.status_code >= 400:
                result["error"] = f"HTTP {response.status_code}: {response.text.strip()[:200]}"
                return result
            data = response.json()
            if settings.llm_backend.strip().lower() == "openai":
                models = [m.get("id", "?") for m in data.get("data", [])]
            else:
                models = [m.get("name", "?") for m in data.get("models", [])]
        except httpx.HTTPError as exc:
            result["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return result
        except (ValueError, AttributeError, TypeError):
            result["error"] = "the answer is not the JSON model list this backend sends"
            return result
        result.update(ok=True, models=[str(m) for m in models])
        return result
    result["error"] = f"no answer within {timeout:g} s"
    return result


async def collect_doctor(settings: Settings) -> dict[str, Any]:
    """Everything `navi doctor` reports, as one JSON-ready dict (``ok``: config and DB fine)."""
    report: dict[str, Any] = {"version": __version__, "warnings": [], "errors": []}
    config: dict[str, Any] = {"path": str(settings.config_path), "ok": False}
    cfg: NaviConfig | None = None
    try:
        cfg = load_config(settings.config_path)
    except ConfigError as exc:
        config["error"] = str(exc)
        report["errors"].append(str(exc))
    else:
        config.update(
            ok=True,
            default_profile=cfg.default_profile,
            profiles=[
                _profile_info(p, settings, cfg.default_profile) for p in cfg.profiles.values()
            ],
        )
    report["config"] = config

    db: dict[str, Any] = {"path": str(settings.db_path), "existed": settings.db_path.exists()}
    try:
        async with SQLiteStore.open(settings.db_path) as store:
            db["tables"] = await store.stats()
        db["ok"] = True
    except NaviError as exc:
        db.update(ok=False, error=str(exc))
        report["errors"].append(str(exc))
    report["db"] = db

    llm = {"backend": settings.llm_backend, **await ping_llm(settings)}
    report["llm"] = llm
    if not llm["ok"]:
        report["warnings"].append(f"the LLM at {llm['url']} does not answer: {llm['error']}")
    elif cfg is not None:
        wanted = sorted({p["model"] for p in config["profiles"]})
        missing = [m for m in wanted if m not in llm["models"]]
        if missing:
            report["warnings"].append(
                f"model(s) {', '.join(missing)} used by the profiles are not listed by the LLM"
            )
    for key, folder in (("manuals_dir", settings.manuals_dir), ("data_dir", settings.data_dir)):
        report[key] = {"path": str(folder), "exists": folder.is_dir()}
    report["settings"] = _settings_info(settings)
    report["ok"] = not report["errors"]
    return report


def _settings_info(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in attrs.fields(Settings):
        value = getattr(settings, field.name)
        if field.name == "llm_api_key":
            value = "(set)" if value else "(not set)"  # never print a secret
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[field.name] = value
    out["message_token_budget"] = settings.message_token_budget
    return out


def _print_doctor(r: dict[str, Any], out: TextIO) -> None:
    def line(label: str, text: str) -> None:
        print(f"{label:<13}{text}", file=out)

    print(f"navi {r['version']}", file=out)
    c = r["config"]
    line("config", f"{c['path']}  " + ("OK" if c["ok"] else "BROKEN"))
    if c["ok"]:
        line("", f"default profile: {c['default_profile']}")
        for p in c["profiles"]:
            mark = " (default)" if p["default"] else ""
            line("", f"- {p['id']}{mark}: model {p['model']}, max_iterations {p['max_iterations']}")
            line("", f"    {p['description']}")
            line("", f"    flags: {', '.join(p['flags']) or '-'}")
    else:
        line("", c["error"])
    d = r["db"]
    state = "exists" if d["existed"] else "did not exist: created now"
    line("db", f"{d['path']}  ({state})")
    if d["ok"]:
        line("", "rows: " + ", ".join(f"{k}={v}" for k, v in sorted(d["tables"].items())))
    else:
        line("", f"BROKEN: {d['error']}")
    m = r["llm"]
    line("llm", f"{m['backend']} {m['url']}")
    if m["ok"]:
        line("", f"OK: models {', '.join(m['models']) or '(none)'}")
    else:
        line("", f"DOWN: {m['error']}")
    for key, label in (("manuals_dir", "manuals"), ("data_dir", "data dir")):
        line(label, r[key]["path"] + ("" if r[key]["exists"] else "  (missing)"))
    s = r["settings"]
    line("model", f"default {s['default_model']}, num_ctx {s['num_ctx']}, "
         f"per-message budget {s['message_token_budget']} tokens")
    line("timeouts", f"connect {s['llm_connect_timeout']:g} s, first chunk "
         f"{s['first_chunk_timeout']:g} s, chunk {s['chunk_timeout']:g} s, "
         f"terminal {s['terminal_timeout_sec']:g} s, spawn {s['spawn_timeout_sec']:g} s")
    line("tasks", f"per session {s['tasks_max_per_session']}, global {s['tasks_max_global']}, "
         f"spawn {s['tasks_max_spawn']}, rate {s['tasks_rate_limit']}/"
         f"{s['tasks_rate_window_sec']:g} s, ttl {s['tasks_ttl_sec']:g} s, notes/turn "
         f"{s['task_notes_per_turn']}, pending notes {s['task_notes_max_pending']}")
    line("tools", f"backgroundable {', '.join(s['backgroundable_tools'])}; parallel calls "
         f"{'on' if s['parallel_tool_calls'] else 'off'}; queue {s['message_queue_max']}")
    for w in r["warnings"]:
        print(f"warning: {w}", file=out)


def cmd_doctor(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    settings = load_settings(args)
    report = trio.run(collect_doctor, settings)
    if args.json:
        print(json.dumps(report, indent=None), file=out)
    else:
        _print_doctor(report, out)
    if report["errors"]:
        print(f"navi: error: {one_line(report['errors'][0])}", file=err)
        return EXIT_ERROR
    return EXIT_OK


# ------------------------------------------------------------------------- run


def new_session_id() -> str:
    return "s-" + uuid.uuid4().hex[:12]


@attrs.define
class _RunOutcome:
    end: StreamEnd | None = None
    error: str | None = None  # the last top-level error message, already printed
    interrupted: bool = False
    printed_text: bool = False


def _message_text(args: argparse.Namespace) -> str:
    text = sys.stdin.read() if args.message == "-" else args.message
    if not text.strip():
        raise UsageError("the message is empty")
    return str(text)


async def _watch_sigint(
    signals: AsyncIterator[int],
    control: RunControl,
    outcome: _RunOutcome,
    outer: trio.CancelScope,
    err: TextIO,
) -> None:
    async for _ in signals:
        if outcome.interrupted:
            outer.cancel()  # second Ctrl-C: stop waiting for the clean stop
            return
        outcome.interrupted = True
        control.stop()
        print("navi: stopping the run (Ctrl-C again to quit now)", file=err, flush=True)


async def run_turn(
    settings: Settings,
    source: ConfigSource,
    args: argparse.Namespace,
    text: str,
    out: TextIO,
    err: TextIO,
) -> _RunOutcome:
    # Imported here so `navi --help` and `navi doctor` stay light.
    from navi_trio.core.agent import RunControl, UserMessage
    from navi_trio.runtime import open_runtime

    session_id = args.session or new_session_id()
    control = RunControl()
    outcome = _RunOutcome()
    cwd = (args.cwd or Path.cwd()).expanduser().resolve()
    if not cwd.is_dir():
        raise UsageError(f"--cwd {cwd}: not a directory")
    with trio.CancelScope() as outer, trio.open_signal_receiver(signal.SIGINT) as signals:
        async with open_runtime(settings, config=source) as rt, trio.open_nursery() as nursery:
            nursery.start_soon(_watch_sigint, signals, control, outcome, outer, err)
            if await rt.store.get_session(session_id) is not None and args.profile:
                state = await rt.agent.cache.get(session_id)
                if state.profile_id != args.profile:
                    await rt.agent.cache.set_profile(state, args.profile)
            print(f"session: {session_id}", file=err, flush=True)
            msg = UserMessage(text, cwd=cwd, profile_id=args.profile)
            seq = 0
            async with rt.agent.run_stream(session_id, msg, control=control) as events:
                async for event in events:
                    seq += 1
                    _show(event, args.events, session_id, seq, outcome, out, err)
            nursery.cancel_scope.cancel()
    if outer.cancelled_caught:
        outcome.interrupted = True
    return outcome


def _show(
    event: AgentEvent,
    as_json: bool,
    session_id: str,
    seq: int,
    outcome: _RunOutcome,
    out: TextIO,
    err: TextIO,
) -> None:
    top = not event.is_subagent
    if isinstance(event, StreamEnd) and top:
        outcome.end = event
    if as_json:
        frame = {"type": type(event).type, "session_id": session_id, "seq": seq,
                 **event_to_dict(event)}
        print(json.dumps(frame), file=out, flush=True)
        if isinstance(event, ErrorEvent) and top:
            outcome.error = one_line(event.message)  # stdout only: cmd_run repeats it
        return
    who = "" if top else f"[{event.agent_id or 'sub-agent'}] "
    message = one_line(getattr(event, "message", ""))
    if isinstance(event, TextDelta) and top:
        out.write(event.text)
        out.flush()
        outcome.printed_text = outcome.printed_text or bool(event.text)
    elif isinstance(event, StreamEnd) and top:
        if not outcome.printed_text and event.text:
            out.write(event.text)
            outcome.printed_text = True
        if outcome.printed_text:
            out.write("\n")
            out.flush()
    elif isinstance(event, WarningEvent):
        print(f"navi: warning: {who}{message}", file=err, flush=True)
    elif isinstance(event, ErrorEvent):
        hint = f" {_DEBUG_HINT}" if event.code == "internal" else ""
        print(f"navi: error: {who}{message}{hint}", file=err, flush=True)
        if top:
            outcome.error = message


def cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    settings = load_settings(args)
    text = _message_text(args)
    source = ConfigSource(settings.config_path)
    profiles = source.current.profiles
    if args.profile is not None and args.profile not in profiles:
        raise ConfigError(
            f"unknown profile {args.profile!r} (profiles in {settings.config_path}: "
            f"{', '.join(sorted(profiles))})"
        )
    outcome = trio.run(run_turn, settings, source, args, text, out, err)
    end = outcome.end
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    if end is None:
        print("navi: error: the run ended without a result", file=err)
        return EXIT_ERROR
    if end.reason == "complete":
        return EXIT_OK
    # In plain mode the error event was already printed as the one line; in --events
    # mode it went to stdout, so say it on stderr too.
    if outcome.error is None or args.events:
        reason = outcome.error or f"the run ended with reason {end.reason}"
        print(f"navi: error: {reason}", file=err)
    return EXIT_ERROR


# ------------------------------------------------------------------------- main

_COMMANDS: dict[str, Callable[[argparse.Namespace, TextIO, TextIO], int]] = {
    "doctor": cmd_doctor,
    "run": cmd_run,
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

    handler = logging.StreamHandler(sys.stderr)
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
