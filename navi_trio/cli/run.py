"""`navi run "message"`: one turn, always through a daemon's protocol.

To the daemon when one answers: it owns the run and its background jobs, which go on
after `navi run` exits. Else to a private daemon of this process, whose background jobs
end with it, so `navi run` waits for the turn's ones before it exits. `--db`,
`--config`, `--llm-url` and `--backend` configure a private daemon, so giving one of
them means "in this process".

The first Ctrl-C, SIGTERM or SIGHUP stops the run cleanly (the partial answer saved); a
second one quits at once. A tool call that needs approval is asked on the terminal when
there is one, else denied at once with a line saying so.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import attrs
import trio

from navi_trio import wire
from navi_trio.api.endpoint import Endpoint, open_endpoint
from navi_trio.approval_text import grant_line, part_lines
from navi_trio.cli.common import (
    DEBUG_HINT,
    EXIT_ERROR,
    EXIT_OK,
    InThread,
    chosen_llm_settings,
    config_source,
    load_settings,
    one_line,
    run_target,
)
from navi_trio.cli.runner import RemoteRun, RunRequest, follow, new_session_id, private_endpoint
from navi_trio.errors import ConfigError, StoreError, UsageError
from navi_trio.events import (
    AgentEvent,
    BudgetExhausted,
    ErrorEvent,
    StreamEnd,
    TextDelta,
    WarningEvent,
    event_from_dict,
)
from navi_trio.llm.factory import make_backend, make_client
from navi_trio.profiles import ConfigSource
from navi_trio.settings import Settings
from navi_trio.text import TerminalStream, terminal_safe
from navi_trio.tools.runas import run_as
from navi_trio.tools.sandbox import sandbox_available
from navi_trio.wire import Frame

if TYPE_CHECKING:
    from navi_trio.api.redial import Redialing


@attrs.define
class RunOutcome:
    end: StreamEnd | None = None
    error: str | None = None  # the last top-level error message, already printed
    budget: str | None = None  # what the top-level budget_exhausted event said
    signal: int | None = None  # the first stop signal (SIGINT, SIGTERM, SIGHUP)
    printed_text: bool = False


# Stop signals are handled alike: the first stops the run cleanly (partial answer saved,
# tool processes killed), a second one quits without waiting for that.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code_for(signum: int) -> int:
    """The shell's convention: 128 + the signal number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + signum


def _say(err: TextIO, text: str) -> None:
    # the terminal is gone (SIGHUP): stopping cleanly matters more than saying so
    with contextlib.suppress(OSError, ValueError):
        print(text, file=err, flush=True)


def _message_text(args: argparse.Namespace) -> str:
    text = sys.stdin.read() if args.message == "-" else args.message
    if not text.strip():
        raise UsageError("the message is empty")
    return str(text)


def _output_gone(*streams: TextIO) -> tuple[TextIO, TextIO]:
    """After a hang-up the terminal is gone: send the rest of the output nowhere. The
    descriptors point at /dev/null too, so flushing what is still buffered cannot fail a
    run that is stopping cleanly.
    """
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in streams:
            # not a real file (a test's StringIO): nothing to redirect
            with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
                os.dup2(null, stream.fileno())
    finally:
        os.close(null)
    sink = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives until exit
    return sink, sink


@attrs.define(eq=False)
class _StopHandler:
    """What the first stop signal does right now: stop the run, later cancel the jobs."""

    outcome: RunOutcome
    outer: trio.CancelScope
    err: TextIO
    action: Callable[[], object] = lambda: None
    what: str = "the run"

    async def watch(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if self.outcome.signal is not None:
                self.outer.cancel()  # the second signal: stop waiting for the clean stop
                return
            self.outcome.signal = signum
            self.action()
            if signum == signal.SIGINT:
                name, again = "Ctrl-C", "Ctrl-C again to quit now"
            else:
                name, again = signal.Signals(signum).name, "a second signal quits at once"
            _say(self.err, f"navi: {name}: stopping {self.what} ({again})")

    def switch(self, action: Callable[[], object], what: str) -> None:
        self.action, self.what = action, what
        if self.outcome.signal is not None:
            action()  # a signal already came: do not start waiting at all


@attrs.define(eq=False)
class _Printer:
    """Shows the session's frames: the answer on stdout, warnings and errors on stderr."""

    as_json: bool
    outcome: RunOutcome
    out: TextIO
    err: TextIO
    answer: TerminalStream = attrs.field(factory=TerminalStream, init=False)

    def show(self, frame: Frame) -> bool:
        """Print one session frame; True at this run's top-level stream_end."""
        if frame.get("type") == "resync":  # cut off and the replay was gone
            _say(
                self.err,
                "navi: warning: some output was skipped (navi fell behind); "
                "the session's history has all of it",
            )
            return False
        # As `navi run` always printed them: the epoch only matters to a client that
        # subscribes again, which navi run never does.
        frame = {k: v for k, v in frame.items() if k != "epoch"}
        event = event_from_dict(frame)
        try:
            self._show(frame, event)
        except OSError:
            if self.outcome.signal is None:
                raise
            self.out, self.err = _output_gone(self.out, self.err)
        return isinstance(event, StreamEnd) and not event.is_subagent

    def _show(self, frame: Frame, event: AgentEvent) -> None:
        outcome, out, err = self.outcome, self.out, self.err
        top = not event.is_subagent
        if isinstance(event, StreamEnd) and top:
            outcome.end = event
        if isinstance(event, BudgetExhausted) and top:
            outcome.budget = one_line(event.message) or None
        if self.as_json:
            print(json.dumps(frame), file=out, flush=True)
            if isinstance(event, ErrorEvent) and top:
                outcome.error = one_line(event.message)  # stdout only: cmd_run repeats it
            return
        who = "" if top else f"[{event.agent_id or 'sub-agent'}] "
        message = one_line(getattr(event, "message", ""))
        if isinstance(event, TextDelta) and top:
            out.write(self.answer.feed(event.text))
            out.flush()
            outcome.printed_text = outcome.printed_text or bool(event.text)
        elif isinstance(event, StreamEnd) and top:
            if not outcome.printed_text and event.text:
                out.write(terminal_safe(event.text))
                outcome.printed_text = True
            if outcome.printed_text:
                out.write(self.answer.end() + "\n")
                out.flush()
        elif isinstance(event, WarningEvent):
            print(f"navi: warning: {who}{message}", file=err, flush=True)
        elif isinstance(event, ErrorEvent):
            hint = f" {DEBUG_HINT}" if event.code == "internal" else ""
            print(f"navi: error: {who}{message}{hint}", file=err, flush=True)
            if top:
                outcome.error = message


def _ask_line(prompt: str) -> str:
    """Blocking: one answer typed on the terminal (run in a worker thread)."""
    print(prompt, end="", file=sys.stderr, flush=True)
    return sys.stdin.readline()


async def decide_approval(frame: Frame, err: TextIO, *, interactive: bool) -> tuple[bool, str]:
    """(approve, scope) for an `approval_request` frame: asked on the terminal, or no."""
    tool, summary = frame.get("tool", "?"), one_line(str(frame.get("summary", "")))
    rule = frame.get("rule", "")
    if not interactive:
        _say(
            err,
            terminal_safe(
                f"navi: denied {tool} ({summary}): it needs approval ({rule}) and there is no "
                "terminal to ask; run it with a terminal, or allow it with a rule"
            ),
        )
        return False, "once"
    for line in [*part_lines(frame), grant_line(frame, "[s]ession")]:
        if line:  # a terminal line's parts, and what a session grant covers
            _say(err, terminal_safe(f"navi:   {line}"))
    asked = f"navi: approve {tool}: {summary}  [{rule}]? [y]es / [s]ession / [a]lways / [N]o: "
    line = await trio.to_thread.run_sync(_ask_line, terminal_safe(asked), abandon_on_cancel=True)
    choice = line.strip().lower()[:1]
    scope = {"y": "once", "s": "session", "a": "always"}.get(choice)
    return (scope is not None), (scope or "once")


def _interactive() -> bool:
    try:
        return sys.stdin.isatty()
    except (ValueError, OSError):
        return False


async def run_remote(
    url: str, token: str, req: RunRequest, out: TextIO, err: TextIO, *, private: bool = False
) -> RunOutcome:
    """Run `req` in the daemon at `url` and print it; `private`: this process's own
    daemon, so the turn's background jobs are waited for before it ends (`_BackgroundWait`)."""
    outcome = RunOutcome()
    printer = _Printer(req.as_json, outcome, out, err)
    run = RemoteRun(req, printer, say=lambda line: _say(err, line))
    with trio.CancelScope() as outer, trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        stopper = _StopHandler(outcome, outer, err, run.stop)
        after = _BackgroundWait(req.session_id, stopper, err).run if private else None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stopper.watch, signals)
            await follow(
                Endpoint(url, token, private),
                run,
                lambda f: decide_approval(f, err, interactive=_interactive()),
                on_accepted=lambda: print(f"session: {req.session_id}", file=err, flush=True),
                after=after,
            )
            nursery.cancel_scope.cancel()
    if (outer.cancelled_caught or run.abandoned) and outcome.signal is None:
        outcome.signal = signal.SIGINT
    return outcome


@attrs.define(eq=False)
class _BackgroundWait:
    """A private daemon ends with `navi run`: its session's background jobs are waited for,
    so that their results become task notes the next turn reads. A stop signal meanwhile
    cancels them (each still leaves a "cancelled" note)."""

    session_id: str
    stopper: _StopHandler
    err: TextIO
    cancel_wanted: trio.Event = attrs.field(factory=trio.Event)
    cancelling: bool = False

    async def run(self, daemon: Redialing) -> None:
        running = await self._running(daemon)
        if not running:
            return
        _say(
            self.err, f"navi: waiting for {len(running)} background task(s)… Ctrl-C to cancel them"
        )
        self.stopper.switch(self.cancel_wanted.set, "the background task(s)")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._cancel, daemon, running)
            while running:  # a background sub-agent may start further jobs while we wait
                while running:
                    frame = await daemon.receive()
                    if frame.get("type") != wire.TASK_UPDATE:
                        continue
                    if frame.get("session_id") != self.session_id:
                        continue
                    task_id = str(frame.get("task_id"))
                    if frame.get("status") == "running":
                        running.add(task_id)
                        if self.cancelling:
                            await daemon.send(wire.tasks("cancel", self.session_id, task_id))
                    else:
                        running.discard(task_id)
                running |= await self._running(daemon)
            nursery.cancel_scope.cancel()

    async def _running(self, daemon: Redialing) -> set[str]:
        listed = await daemon.request(wire.tasks("list", self.session_id))
        return {str(t["task_id"]) for t in listed["tasks"] if t.get("status") == "running"}

    async def _cancel(self, daemon: Redialing, running: set[str]) -> None:
        await self.cancel_wanted.wait()
        self.cancelling = True
        for task_id in sorted(running):
            await daemon.send(wire.tasks("cancel", self.session_id, task_id))


def probe_sandbox(settings: Settings) -> None:
    """Probe bwrap as the runtime will (as the tool user when navi runs as root), so
    that its check finds the answer cached instead of waiting for a probe of its own. A
    setting naming no one is left for the runtime to refuse, at its place in the start."""
    try:
        user = run_as(settings.tool_user)
    except ConfigError:
        return
    sandbox_available(settings.bwrap_path, user)


@asynccontextmanager
async def serve_run(
    settings: Settings, source: Callable[[], ConfigSource]
) -> AsyncIterator[Endpoint]:
    """A private daemon for one `navi run`. Its LLM client is built and the sandbox probed
    in threads while this thread reads the config and imports the runtime and the server
    (imported here so `navi --help` and `navi doctor` stay light)."""
    local = settings.llm_backend.strip().lower() == "local"
    building = None if local else InThread(make_client, settings)
    probing = InThread(probe_sandbox, settings)
    config = source()
    from navi_trio.api import daemon_client  # noqa: F401 - loaded here, beside the threads
    from navi_trio.cli import serve  # noqa: F401

    await probing.result()  # first: it never raises, so both threads are joined
    client = None if building is None else await building.result()
    backend = None if client is None else make_backend(settings, client)
    async with (
        client if client is not None else contextlib.nullcontext(),
        private_endpoint(settings, config, backend=backend) as endpoint,
    ):
        yield endpoint


async def run_embedded(
    settings: Settings, source: ConfigSource, req: RunRequest, out: TextIO, err: TextIO
) -> RunOutcome:
    """`req` in a private daemon of this process (`serve_run`)."""
    async with serve_run(settings, lambda: source) as endpoint:
        return await run_remote(endpoint.url, endpoint.token, req, out, err, private=True)


def daemon_target(args: argparse.Namespace, settings: Settings) -> tuple[str, str] | None:
    """(url, token) of the daemon to run in, or None for a private one."""
    return trio.run(run_target(args, settings).daemon)


@asynccontextmanager
async def _private(args: argparse.Namespace, err: TextIO) -> AsyncIterator[Endpoint]:
    """The private daemon of `navi run`: the LLM chosen here (--local, or Ollama / the
    local model when nothing is configured), with the `local` profile for --local."""
    settings = await chosen_llm_settings(args, err)

    def source() -> ConfigSource:
        config = config_source(settings)
        profiles = config.current.profiles
        if args.profile is not None and args.profile not in profiles:
            raise ConfigError(
                f"unknown profile {args.profile!r} (profiles in {settings.config_path}: "
                f"{', '.join(sorted(profiles))})"
            )
        return config

    async with serve_run(settings, source) as endpoint:
        yield endpoint


async def _run(
    args: argparse.Namespace, settings: Settings, req: RunRequest, out: TextIO, err: TextIO
) -> RunOutcome:
    target = run_target(args, settings)
    async with open_endpoint(target, lambda: _private(args, err)) as endpoint:
        return await run_remote(
            endpoint.url, endpoint.token, req, out, err, private=endpoint.private
        )


def cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.session is not None:
        from navi_trio.store.sqlite import check_session_id  # the store: imported on use

        try:
            check_session_id(args.session)
        except StoreError as exc:
            raise UsageError(f"--session: {exc}") from None
    settings = load_settings(args)
    text = _message_text(args)
    cwd = (args.cwd or Path.cwd()).expanduser().resolve()
    if not cwd.is_dir():  # before any probing
        raise UsageError(f"--cwd {cwd}: not a directory")
    session_id = args.session if args.session is not None else new_session_id()
    req = RunRequest(
        session_id,
        text,
        cwd,
        args.profile,
        args.events,
        args.mode,
        on_busy=args.on_busy,
        cwd_given=args.cwd is not None,
        commands=True,
    )
    outcome = trio.run(_run, args, settings, req, out, err)
    return exit_code(outcome, args.events, err)


def exit_code(outcome: RunOutcome, as_json: bool, err: TextIO) -> int:
    end = outcome.end
    if outcome.signal is not None:
        return exit_code_for(outcome.signal)
    if end is None:
        print("navi: error: the run ended without a result", file=err)
        return EXIT_ERROR
    if end.reason == "complete":
        return EXIT_OK
    # In plain mode the error event was already printed as the one line; in --events
    # mode it went to stdout, so say it on stderr too.
    if outcome.error is None or as_json:
        reason = outcome.error or outcome.budget or f"the run ended with reason {end.reason}"
        print(f"navi: error: {reason}", file=err)
    return EXIT_ERROR
