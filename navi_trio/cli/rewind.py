"""`navi rewind` and `navi fork`: undo what a session did, or branch it off, from the shell.

MSG is a message id or its number in the list (1 = the first user message, -1 = the
last). A rewind always shows its preview first and applies it when the person at the
terminal says yes, or at once with ``--yes``; without a terminal and without ``--yes``
it only shows the preview, so nothing is changed headless by accident. The result
names the branch that undoes it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TextIO

import trio

from navi_trio.api.endpoint import open_endpoint
from navi_trio.cli.common import (
    EXIT_OK,
    add_client_options,
    config_source,
    load_settings,
    run_target,
)
from navi_trio.cli.rewinds import Rewinds, resolve_point
from navi_trio.cli.runner import private_endpoint
from navi_trio.client.rewind_text import (
    CLI_FORCE,
    print_done,
    print_forked,
    print_overview,
    print_preview,
)
from navi_trio.errors import NotFoundError, RemoteError, UsageError
from navi_trio.settings import Settings


def add_parsers(sub: Any, endpoint_options: Callable[[argparse.ArgumentParser], None]) -> None:
    rewind = sub.add_parser(
        "rewind",
        help="rewind a session's chat and/or files to before a message (or undo a rewind)",
        description="Rewind a session to just before one of its user messages: the "
        "conversation (chat), the files its runs changed in the session folder and the "
        "working folder (files), or both. The preview comes first; --yes applies it "
        "without asking. Every rewind can be undone with the branch it names.",
    )
    rewind.add_argument("--session", metavar="ID", required=True, help="the session")
    rewind.add_argument("--list", action="store_true", help="list messages and branches")
    rewind.add_argument("--to", metavar="MSG", help="a message id or number (1 first, -1 the last)")
    rewind.add_argument("--branch", metavar="B", help="bring back this branch (an undo)")
    rewind.add_argument("--restore", choices=("chat", "files", "both"), default="both")
    rewind.add_argument(
        "--force",
        action="store_true",
        help="also restore the conflicts: files navi and someone else both changed since "
        "(without it they are kept as they are)",
    )
    rewind.add_argument("--yes", action="store_true", help="apply the preview without asking")
    add_client_options(rewind)
    endpoint_options(rewind)

    fork = sub.add_parser(
        "fork",
        help="start a new session from a session's history up to a message",
        description="Make a new session with the history and context before --at (all "
        "of it without), the same profile and mode; --files copies the session's files "
        "as they were then into the new session's folder (the working folder into "
        "--folder, a new folder, or `workspace` inside it). Prints the new session's id.",
    )
    fork.add_argument("--session", metavar="ID", required=True, help="the session to fork")
    fork.add_argument("--at", metavar="MSG", help="a message id or number (1 first, -1 last)")
    fork.add_argument("--files", action="store_true", help="copy the files as of that message")
    fork.add_argument("--folder", metavar="DIR", help="a new folder for the working folder's copy")
    fork.add_argument("--new", metavar="ID", help="the new session's id (default: a new one)")
    add_client_options(fork)
    endpoint_options(fork)


@asynccontextmanager
async def open_rewinds(args: argparse.Namespace, settings: Settings) -> AsyncIterator[Rewinds]:
    """The daemon's rewinds when it answers (or --url), else a private daemon's."""
    target = run_target(args, settings)
    async with open_endpoint(
        target, lambda: private_endpoint(settings, config_source(settings))
    ) as endpoint:
        try:
            yield Rewinds(endpoint.url, endpoint.token)
        except RemoteError as exc:
            if not (endpoint.private and exc.code == "not_found"):
                raise
            # A database of the command's own: which one (a mistyped --db, most likely).
            raise NotFoundError(f"{exc.detail} (in {settings.db_path})") from None


def cmd_rewind(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.to is not None and args.branch is not None:
        raise UsageError("--to and --branch: name one (a message, or a branch to bring back)")
    settings = load_settings(args)
    return trio.run(_rewind, args, settings, out, err)


async def _rewind(args: argparse.Namespace, settings: Settings, out: TextIO, err: TextIO) -> int:
    sid = args.session
    async with open_rewinds(args, settings) as rewinds:
        listed = await rewinds.overview(sid)
        if args.list or (args.to is None and args.branch is None):
            _print(args, out, listed, lambda: print_overview(listed, out))
            return EXIT_OK
        to = resolve_point(listed, args.to) if args.to is not None else None
        target: dict[str, Any] = {
            "to": to,
            "branch": args.branch,
            "restore": args.restore,
            "conflicts": "restore" if args.force else "keep",
        }
        preview = await rewinds.preview(sid, target)
        if not args.json:
            print_preview(preview, out, force_hint=CLI_FORCE)
        if not args.yes and not await _confirmed(err):
            if args.json:
                print(json.dumps(preview), file=out)
            else:
                print("nothing was changed (add --yes to apply it)", file=out)
            return EXIT_OK
        done = await rewinds.apply(sid, target, str(preview["token"]))
        _print(args, out, {"preview": preview, "done": done}, lambda: print_done(done, sid, out))
    return EXIT_OK


async def _confirmed(err: TextIO) -> bool:
    """Asked on the terminal; no terminal: no (a headless rewind needs --yes)."""
    if not sys.stdin.isatty():
        return False
    print("apply it? [y/N] ", end="", file=err, flush=True)
    answer = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    return answer.strip().lower() in ("y", "yes")


def cmd_fork(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.folder is not None and not args.files:
        raise UsageError("--folder is where --files copies the working folder: add --files")
    settings = load_settings(args)
    return trio.run(_fork, args, settings, out)


async def _fork(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    async with open_rewinds(args, settings) as rewinds:
        at = None
        if args.at is not None:
            at = resolve_point(await rewinds.overview(args.session), args.at)
        folder = None if args.folder is None else str(_absolute(args.folder))
        made = await rewinds.fork(
            args.session, at=at, files=args.files, folder=folder, new_session_id=args.new
        )
    _print(args, out, made, lambda: print_forked(made, out))
    return EXIT_OK


def _absolute(folder: str) -> Any:
    from pathlib import Path

    return Path(folder).expanduser().absolute()


def _print(args: argparse.Namespace, out: TextIO, fields: Any, human: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(fields), file=out)
    else:
        human()
