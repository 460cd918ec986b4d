"""The daemon's subcommands of ``navi``: serve, status, stop, users, sessions, tasks,
approvals, schedule.

`users` works on the store directly (the daemon need not run). `sessions`, `tasks`,
`approvals` and `schedule` go where `navi run` goes: the daemon, else a private one of
the command on the local database (it runs no background tasks and no schedules).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from typing import Any, TextIO

import trio

from navi_trio import wire
from navi_trio.api.auth import is_loopback, new_token
from navi_trio.api.remote import request
from navi_trio.cli.common import (
    Command,
    UsageError,
    add_client_options,
    config_source,
    lazy_command,
    llm_settings,
    load_settings,
    run_target,
)
from navi_trio.text import terminal_safe, usage_table

LOG_LEVELS = ("debug", "info", "warning", "error")


def add_parsers(sub: Any, endpoint_options: Callable[[argparse.ArgumentParser], None]) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the WebSocket daemon in the foreground",
        description="Run the daemon: session actors, background jobs and the WebSocket "
        "server. Loopback only unless --allow-remote. SIGTERM/Ctrl-C stop it cleanly; "
        "SIGHUP reloads the config.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8765, help="port (0: any free one)")
    serve.add_argument(
        "--allow-remote", action="store_true", help="allow a --host that is not loopback"
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="run N daemon processes on the port (needs NAVI_DB=postgresql://…)",
    )
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # a worker
    serve.add_argument("--supervisor-fd", type=int, help=argparse.SUPPRESS)  # its lifeline
    serve.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    serve.add_argument("--log-json", action="store_true", help="log JSON lines")
    endpoint_options(serve)

    status = sub.add_parser(
        "status",
        help="which navi daemons run: where, since when, pid, backend, log",
        description="List the navi daemons of this data folder (NAVI_DATA_DIR) and what "
        "answers on --port: address, pid, since when, LLM backend and log. Exit 1 when "
        "none runs.",
    )
    status.add_argument(
        "--port", type=int, default=8765, help="also say what answers on this port (8765)"
    )
    stop = sub.add_parser(
        "stop",
        help="stop a navi daemon (SIGTERM) and wait for its shutdown",
        description="Send SIGTERM to the navi daemon of this data folder on --port (the one "
        "running when there is one) and wait for its clean shutdown: background tasks get "
        "NAVI_SHUTDOWN_WAIT_TASKS_SEC to finish, running turns are saved as stopped.",
    )
    stop.add_argument("--port", type=int, help="the daemon's port (default: the one running)")

    users = sub.add_parser("users", help="manage users and their tokens")
    users.add_argument("action", choices=("add", "list", "remove", "rotate"))
    users.add_argument("name", nargs="?", help="the user's name (add, remove, rotate)")
    users.add_argument("--role", choices=("admin", "user"), default="user")
    users.add_argument(
        "--db", metavar="PATH|URL", help="SQLite file or postgresql:// URL (env NAVI_DB)"
    )

    sessions = sub.add_parser("sessions", help="list, show or delete sessions (via the daemon)")
    sessions.add_argument(
        "action", nargs="?", default="list", choices=("list", "history", "delete")
    )
    sessions.add_argument("session_id", nargs="?", metavar="ID")
    add_client_options(sessions)

    tasks = sub.add_parser("tasks", help="list, check or cancel background tasks (via the daemon)")
    tasks.add_argument("action", nargs="?", default="list", choices=("list", "check", "cancel"))
    tasks.add_argument("task_id", nargs="?", metavar="ID")
    tasks.add_argument("--session", metavar="ID", help="only this session's tasks")
    add_client_options(tasks)

    usage = sub.add_parser(
        "usage",
        help="what the runs spent: tokens, LLM and tool time, cost (via the daemon)",
        description="The accounts: tokens in and out, time waiting for the model and for "
        "tools, and the cost where config.json prices the model (models.NAME.price_in / "
        "price_out per million tokens). Yours; an admin sees everyone's. Sub-agents and "
        "background jobs are billed to the session that started them, on lines of their own.",
    )
    usage.add_argument("--user", metavar="NAME", help="only this user's (an admin's choice)")
    usage.add_argument("--session", metavar="ID", help="only this session's")
    usage.add_argument("--since", metavar="WHEN", help="7d, 12h, 30m, a date, or epoch seconds")
    usage.add_argument(
        "--by",
        default="model",
        choices=("model", "profile", "day", "session", "user"),
        help="one line per (default: model)",
    )
    add_client_options(usage)
    grants = sub.add_parser(
        "approvals",
        help="list or revoke the approvals granted for a session or always (via the daemon)",
    )
    grants.add_argument("action", nargs="?", default="list", choices=("list", "revoke"))
    grants.add_argument("grant_id", nargs="?", metavar="ID")
    add_client_options(grants)

    sched = sub.add_parser(
        "schedule",
        help="run a message on a schedule (via the daemon)",
        description="Scheduled runs, in the daemon: a message that runs by itself on a cron "
        "expression (the daemon's local time), every N minutes or once at a time; headless "
        "(approvals by the profile's headless_allow) and within its budget. A due time "
        "missed while no daemon ran runs once at start-up (--no-catch-up: skipped).",
    )
    actions = sched.add_subparsers(dest="action", metavar="ACTION")
    add = actions.add_parser("add", help="add a schedule")
    add.add_argument("rest", metavar="MESSAGE", help="what each run is asked")
    where = add.add_mutually_exclusive_group(required=True)
    where.add_argument("--session", metavar="ID", help="run in this session of yours")
    where.add_argument("--new", action="store_true", help="run in a new session each time")
    add.add_argument("--profile", metavar="P", help="profile of the new sessions")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help='five fields, like "*/30 * * * *"')
    when.add_argument("--every", metavar="DURATION", help="like 10m, 2h, 1d (at least 1m)")
    when.add_argument("--at", metavar="ISO", help="once, like 2030-01-31T09:00")
    add.add_argument(
        "--no-catch-up", action="store_true", help="skip a due time missed while no daemon ran"
    )
    add.add_argument(
        "--budget", metavar="JSON", help='lower the run\'s budgets: {"turn": {"tokens": 20000}}'
    )
    add_client_options(add)
    add_client_options(actions.add_parser("list", help="list your schedules"))
    for name, what in (("remove", "remove"), ("pause", "pause"), ("resume", "resume")):
        one = actions.add_parser(name, help=f"{what} a schedule")
        one.add_argument("rest", metavar="ID", help="the schedule's id")
        add_client_options(one)
    add_client_options(sched)  # `navi schedule` alone lists


class _JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "ts": round(record.created, 3),
                "level": record.levelname.lower(),
                "logger": record.name,
                "message": record.getMessage(),
            }
        )


def cmd_serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from navi_trio.cli.serve import serve_daemon

    if not is_loopback(args.host):
        if not args.allow_remote:
            raise UsageError(
                f"--host {args.host} is not a loopback address: anyone who can reach it may "
                "connect; add --allow-remote if you mean it"
            )
        print(
            f"navi: warning: listening on {args.host}: reachable from other machines; "
            "every client still needs a token",
            file=err,
            flush=True,
        )
    from navi_trio.cli.daemons import PidFile, address_in_use, check_port, port_in_use

    data_dir = load_settings(args).data_dir
    if not args.reuse_port:  # a worker shares the port with its siblings on purpose
        check_port(args.host, args.port, data_dir)  # before the backend is chosen and said
    settings = llm_settings(args, err)
    root = logging.getLogger()
    level = getattr(logging, args.log_level.upper())
    root.setLevel(level)
    for handler in root.handlers:
        handler.setLevel(level)
        if args.log_json:
            handler.setFormatter(_JsonLines())
    pid_files: list[PidFile] = []

    def serving(port: int) -> None:
        """Listening on `port`: the pid file says so (`navi status`, `navi stop`)."""
        if not args.reuse_port:
            pid_files.append(PidFile(settings.data_dir, port))
            pid_files[-1].write()

    try:
        if args.workers != 1:  # N daemons on the port, supervised (cli/workers.py)
            from navi_trio.cli.workers import check_workers, serve_workers

            check_workers(args.workers, settings)
            return serve_workers(
                args.raw_argv, args.workers, args.host, args.port, out, ready=serving
            )
        source = config_source(settings)

        def ready(port: int) -> None:
            serving(port)
            print(f"navi: listening on ws://{args.host}:{port}/", file=out, flush=True)

        where = {
            "host": args.host,
            "port": args.port,
            "reuse_port": args.reuse_port,
            "supervisor_fd": args.supervisor_fd,
        }
        try:
            trio.run(lambda: serve_daemon(settings, source, ready=ready, **where))
        except BaseException as exc:
            if address_in_use(exc):  # taken since check_port looked
                raise UsageError(port_in_use(args.host, args.port, settings.data_dir)) from None
            raise
        return 0
    finally:
        for pid_file in pid_files:
            pid_file.remove()


def cmd_users(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:

    if args.action != "list" and not args.name:
        raise UsageError(f"users {args.action} needs a NAME")
    settings = load_settings(args)
    return trio.run(_users, settings, args, out)


async def _users(settings: Any, args: argparse.Namespace, out: TextIO) -> int:
    from navi_trio.errors import NaviError
    from navi_trio.store.factory import open_store

    async with open_store(settings) as store:
        if args.action == "list":
            for u in await store.list_users():
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(u["created_at"]))
                print(f"{u['name']}\t{u['role']}\t{u['id']}\tcreated {when}", file=out)
            return 0
        existing = await store.get_user_by_name(args.name)
        if args.action == "add":
            if existing is not None:
                raise NaviError(f"a user named {args.name!r} exists already")
            token = new_token()
            await store.create_user(args.name, token, args.role)
            print(f"user {args.name} ({args.role}) added; the token is shown once:", file=out)
            print(token, file=out)
            return 0
        if existing is None:
            raise NaviError(f"no user named {args.name!r} (see `navi users list`)")
        if args.action == "remove":
            await store.remove_user(args.name)
            print(f"user {args.name} removed (their sessions stay)", file=out)
            return 0
        token = new_token()
        await store.rotate_user_token(args.name, token)
        print(f"new token for {args.name} (the old one no longer works):", file=out)
        print(token, file=out)
        return 0


def _call(args: argparse.Namespace, frame: dict[str, Any]) -> dict[str, Any]:
    """The daemon's reply to `frame` (a private daemon's when none answers and no --url
    names one)."""
    from navi_trio.api.endpoint import open_endpoint
    from navi_trio.cli.runner import private_endpoint

    settings = load_settings(args)
    target = run_target(args, settings)

    async def call() -> dict[str, Any]:
        async with open_endpoint(
            target, lambda: private_endpoint(settings, config_source(settings))
        ) as endpoint:
            return await request(endpoint.url, endpoint.token, frame)

    return trio.run(call)


def cmd_sessions(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.action != "list" and not args.session_id:
        raise UsageError(f"sessions {args.action} needs a session ID")
    reply = _call(args, wire.sessions(args.action, args.session_id))
    if args.json:
        print(json.dumps(reply), file=out)
    elif args.action == "list":
        for s in reply["sessions"]:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s["updated_at"]))
            busy = "  (running)" if s["busy"] else ""
            line = f"{s['session_id']}\t{s['user']}\t{s['profile']}\t{when}\t{s['title']}{busy}"
            print(terminal_safe(line), file=out)
        if not reply["sessions"]:
            print("no sessions", file=out)
    elif args.action == "history":
        for m in reply["messages"]:
            content = m.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            print(terminal_safe(f"{m.get('role', '?')}: {text}"), file=out)
            error = m.get("error")
            if m.get("role") == "assistant" and isinstance(error, str) and error:
                # Why the turn failed (an LLM error, a daemon that died under it).
                print(terminal_safe(f"  ✗ error: {error}"), file=out)
    else:
        print(f"session {args.session_id} deleted", file=out)
    return 0


def cmd_tasks(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.action != "list" and not args.task_id:
        raise UsageError(f"tasks {args.action} needs a task ID")
    reply = _call(args, wire.tasks(args.action, args.session, args.task_id))
    if args.json:
        print(json.dumps(reply), file=out)
    elif args.action == "list":
        for t in reply["tasks"]:
            print(
                terminal_safe(
                    f"{t['task_id']}\t{t['status']}\t{t['tool']}\t"
                    f"{t['age_sec']:.0f} s\t{t['session_id']}"
                ),
                file=out,
            )
        if not reply["tasks"]:
            print("no tasks" + (f" in session {args.session}" if args.session else ""), file=out)
    elif args.action == "check":
        t = reply["task"]
        print(
            terminal_safe(f"{t['task_id']} {t['status']} ({t['tool']}, {t['age_sec']:.0f} s)"),
            file=out,
        )
        if "result" in t:
            print(terminal_safe(str(t["result"])), file=out)
    else:
        print(
            f"task {args.task_id} " + ("cancelled" if reply["cancelled"] else "was not running"),
            file=out,
        )
    return 0


def cmd_usage(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    frame = wire.usage(args.by, session_id=args.session, user=args.user, since=args.since)
    reply = _call(args, frame)
    if args.json:
        print(json.dumps(reply), file=out)
        return 0

    for line in usage_table(reply):
        print(terminal_safe(line), file=out)
    return 0


def cmd_approvals(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The approvals granted "for the session" or "always" (an admin's: everyone's)."""
    if args.action == "revoke" and not args.grant_id:
        raise UsageError("approvals revoke needs a grant ID (approvals list shows them)")
    reply = _call(args, wire.grants(args.action, args.grant_id))
    if args.json:
        print(json.dumps(reply), file=out)
        return 0
    for g in reply["grants"]:
        where = f"session {g['session_id']}" if g["scope"] == "session" else "always"
        line = f"{g['id']}\t{where}\t{g['user_id']}\tmode {g['mode']}\t{g['grants']}"
        print(terminal_safe(("revoked " if args.action == "revoke" else "") + line), file=out)
    if not reply["grants"]:
        print("no approvals granted", file=out)
    return 0


def schedule_frame(args: argparse.Namespace) -> dict[str, Any]:
    """The ``schedule`` frame of `navi schedule`'s arguments (the daemon checks the rest)."""
    if args.action in (None, "list"):
        args.action = "list"
        return wire.schedule("list")
    if args.action != "add":
        return wire.schedule(args.action, schedule_id=args.rest)
    budget = None
    if args.budget is not None:
        try:
            budget = json.loads(args.budget)
        except ValueError as exc:
            raise UsageError(f"--budget is not JSON: {exc}") from None
    return wire.schedule(
        "add",
        message=args.rest,
        session_id=args.session,
        new=True if args.new else None,
        profile=args.profile,
        cron=args.cron,
        every=args.every,
        at=args.at,
        catch_up=False if args.no_catch_up else None,
        budget=budget,
    )


def cmd_schedule(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    reply = _call(args, schedule_frame(args))
    if args.json:
        print(json.dumps(reply), file=out)
    elif args.action == "list":
        for s in reply["schedules"]:
            print(terminal_safe(_schedule_line(s)), file=out)
        if not reply["schedules"]:
            print("no schedules", file=out)
    elif args.action == "remove":
        print(
            f"schedule {args.rest} " + ("removed" if reply["removed"] else "was not there"),
            file=out,
        )
    else:
        print(terminal_safe(_schedule_line(reply["schedule"])), file=out)
    return 0


def _schedule_line(s: dict[str, Any]) -> str:
    due = s.get("next_due")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(due)) if due else "-"
    state = "paused" if s.get("paused") else f"next {when}"
    where = s.get("session_id") or f"new {s.get('profile') or 'session'}"
    text = str(s.get("message", "")).replace("\n", " ")
    text = text if len(text) <= 60 else text[:59] + "…"
    skipped = f"\tlast run skipped: {s['last_skip']}" if s.get("last_skip") else ""
    return (
        f"{s['schedule_id']}\t{s['kind']} {s['spec']}\t{state}\t{s.get('runs', 0)} runs\t"
        f"{where}\t{text}{skipped}"
    )


COMMANDS: dict[str, Command] = {
    "serve": cmd_serve,
    "status": lazy_command("daemons", "cmd_status"),
    "stop": lazy_command("daemons", "cmd_stop"),
    "users": cmd_users,
    "sessions": cmd_sessions,
    "tasks": cmd_tasks,
    "usage": cmd_usage,
    "approvals": cmd_approvals,
    "schedule": cmd_schedule,
}
