"""`ChatApp`: the `navi chat` program, wiring a `Connection`, a `Reader` and a `Renderer`.

Three tasks in one nursery: the connection actor (frames in), the frame loop (frames to
the renderer; replies to requests), and the input loop (lines to messages and slash
commands, client/commands.py). The app keeps the session's state: which session, what
waits (queued messages, approval requests, a new session's id, the profile asked for:
client/profile.py), what a resync's history replay may skip. A SIGINT that reaches the
process (no prompt in raw mode at that moment) is handled like Ctrl-C typed at the
prompt: stop the run, or quit on a second press at an idle prompt. What each frame
from the daemon does to that state is client/frames.py (`FrameHandling`, a base of the app).
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import AsyncIterator

import attrs
import trio

from navi_trio import wire
from navi_trio.client.commands import ANSWERS, SlashCommands
from navi_trio.client.connection import BACKOFF_FIRST, RETRIES, TOKEN_HINT, Connection
from navi_trio.client.frames import COMMANDS_ID, FrameHandling, Unanswered
from navi_trio.client.profile import ProfileAsk
from navi_trio.client.reader import InputEvent, Reader
from navi_trio.client.render import WAITING, Renderer
from navi_trio.client.rewind import RewindFlow
from navi_trio.errors import DaemonUnreachableError
from navi_trio.wire import Frame


@attrs.define
class ChatOptions:
    url: str
    token: str
    session_id: str | None = None
    profile: str | None = None
    cwd: str | None = None
    token_hint: str = TOKEN_HINT  # what to do when the daemon refuses the token
    retries: int = RETRIES  # reconnects before giving up
    backoff: float = BACKOFF_FIRST  # first reconnect delay, doubled each time (capped)
    # End of input (a script piped in) waits for the run to finish before quitting;
    # Ctrl-D at a terminal quits at once.
    finish_runs_on_eof: bool = False


MESSAGE_ID = "chat-message-"  # the ids of our messages (their replies echo them)
UNANSWERED_MAX = 64


class ChatApp(FrameHandling):
    def __init__(self, options: ChatOptions, renderer: Renderer, reader: Reader) -> None:
        self.options = options
        self.renderer = renderer
        self.reader = reader
        self.session_id: str | None = None
        self.profile = options.profile
        self.mode: str | None = None  # the `mode` field of our messages (/mode)
        self._role = "user"  # ours, from the welcome
        # Approval requests of our session still waiting, oldest first (call id -> frame).
        self._approvals: dict[str, Frame] = {}
        self.last_seq: int | None = None
        self.epoch: str | None = None
        self.resuming: str | None = None  # /resume target awaiting its history
        self._creating = False  # a message went out without a session: adopt the new one
        self._created = trio.Event()  # set when that session is known (or its creation failed)
        self._queued = 0  # messages waiting in the daemon's queue of our session
        self._interrupted = False  # Ctrl-C pressed once on an idle prompt
        self._settled = trio.Event()  # set when a frame leaves us with no run going
        self._quiet_tasks = False  # the next tasks list is a resync: show it only if not empty
        # What a resync's history replay may skip: the user messages of the session the
        # last history showed, plus one per top-level run whose end we saw live since.
        self._synced_users = 0
        self._ended_runs = 0
        self._rewritten = False  # our rewind's resync: reload without replaying
        self._rewound = False  # a rewind was published: its resync is not news
        # The session's profile is the daemon's to say (client/profile.py).
        self._profile = ProfileAsk()
        self._conn: Connection | None = None
        self.profiles: list[str] | None = None  # the daemon's, from its welcome
        # Our messages the daemon has not answered yet (request id -> text): a refused
        # one goes back on the prompt, never lost.
        self._unanswered: dict[str, Unanswered] = {}
        self._message_ids = itertools.count(1)
        self._quit = trio.CancelScope()
        self.rewinds = RewindFlow(self)  # /rewind, /fork (client/rewind.py)
        self._commands = SlashCommands(self)
        renderer.status.profile = self.profile

    # ------------------------------------------------------------------ life

    async def run(self) -> None:
        """Connect and chat until /quit, Ctrl-D or a second Ctrl-C; a `NaviError` (the daemon
        unreachable, the token refused) when it can't."""
        send, recv = trio.open_memory_channel[Frame](256)
        self._conn = Connection(
            self.options.url,
            self.options.token,
            send,
            resume=self.resume,
            retries=self.options.retries,
            backoff=self.options.backoff,
            token_hint=self.options.token_hint,
        )
        try:
            with self._quit, trio.open_signal_receiver(signal.SIGINT) as sigint:
                async with trio.open_nursery() as nursery:
                    welcome = await nursery.start(self._conn.run)
                    self._welcome(welcome)
                    await self.send({**wire.commands(self.run_cwd()), "id": COMMANDS_ID})
                    nursery.start_soon(self._frame_loop, recv)
                    nursery.start_soon(self._input_loop)
                    nursery.start_soon(self._signal_loop, sigint)
                    if self.options.session_id:
                        await self._commands.resume(self.options.session_id)
        finally:
            self.reader.abort()  # leave the prompt so the terminal is restored
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await trio.to_thread.run_sync(self.reader.wait_idle, 2.0)

    def quit(self) -> None:
        self._quit.cancel()

    def resume(self) -> list[Frame]:
        """Frames to send after a reconnect: subscribe from the last seq seen, and ask for
        the tasks list (task updates are out-of-band: the ones sent while we were away
        are gone)."""
        if self.session_id is None:
            return []
        self._quiet_tasks = True
        return [
            wire.subscribe(self.session_id, self.last_seq, self.epoch),
            wire.tasks_list(self.session_id),
        ]

    def _welcome(self, welcome: Frame) -> None:
        self.renderer.status.connected = True
        self.welcomed(welcome)
        user = welcome.get("user") or {}
        self._role = str(user.get("role") or "user")
        self.renderer.notice(
            f"connected to {welcome.get('server', 'navi')} at {self.options.url} as "
            f"{user.get('name', '?')} — /help lists the commands"
        )

    async def send(self, frame: Frame) -> bool:
        assert self._conn is not None
        try:
            await self._conn.send(frame)
        except DaemonUnreachableError as exc:
            if self._profile.is_ask(frame):
                self._profile.lost()  # asked again once back
                self.renderer.release_status()
            else:
                self.renderer.error(str(exc))
            return False
        return True

    # ------------------------------------------------------------------ input

    async def _input_loop(self) -> None:
        while True:
            event: InputEvent = await trio.to_thread.run_sync(
                self.reader.read, abandon_on_cancel=True
            )
            if event.kind == "eof":
                if self.options.finish_runs_on_eof:
                    await self._wait_settled()
                self.quit()
                return
            if event.kind == "interrupt":
                await self.interrupt()
                continue
            if event.kind == "rewind":  # a double Esc
                await self.double_escape()
                continue
            if event.kind == "compact":  # Ctrl+X C
                if event.text:
                    self.prefill(event.text)  # what was typed waits on the next prompt
                await self._commands.run("compact", "")
                continue
            self._interrupted = False
            await self.line(event.text, "steer" if event.kind == "steer" else None)

    async def _signal_loop(self, sigint: AsyncIterator[int]) -> None:
        async for _ in sigint:
            await self.interrupt()

    async def interrupt(self) -> None:
        """Ctrl-C: stop the active run; on an idle prompt, a second one quits."""
        if self.renderer.busy and self.session_id:
            self._interrupted = False
            if await self.send(wire.stop(self.session_id)):
                self.renderer.notice("stopping the run… (Ctrl+C twice on an idle prompt quits)")
            return
        if self._interrupted:
            self.quit()
            return
        self._interrupted = True
        self.renderer.notice("press Ctrl+C again or Ctrl+D to quit")

    async def double_escape(self) -> None:
        """A double Esc on the prompt opens /rewind when no run is active."""
        if self.renderer.busy:
            self.renderer.notice("a run is active: Ctrl+C stops it, then Esc Esc rewinds")
            return
        await self._commands.run("rewind", "")

    def run_cwd(self) -> str | None:
        """The cwd our messages carry. The shell's folder goes along for an admin; an
        ordinary user's cwd must lie in their workspace_roots, so theirs is sent only
        when asked for (--cwd)."""
        return self.options.cwd or (os.getcwd() if self._role == "admin" else None)

    def set_cwd(self, folder: str) -> None:
        """Where the next messages' tools work (a fork's copy of the files)."""
        self.options.cwd = folder

    def history_rewritten(self) -> None:
        """Our rewind rewrote the history: the resync's reload shows nothing again (the
        rewind's result said what changed), it only counts what is there now."""
        self._rewritten = True

    def prefill(self, text: str) -> None:
        """Put `text` on the next prompt (a message a rewind removed), when the reader can."""
        prefill = getattr(self.reader, "prefill", None)
        if prefill is not None:
            prefill(text)

    async def line(self, text: str, on_busy: str | None = None, *, literal: bool = False) -> None:
        """One line typed: an approval's answer, a slash command, or a message (sent with
        `on_busy`: what it does when the session is running a turn; None: queued).
        `literal`: a message whatever it starts with (a command's expanded prompt)."""
        text = text.strip()
        if not text:
            return
        if not literal and await self._typed(text, on_busy):
            return
        if self._creating:
            # Lines typed (or piped) before the daemon named the new session go to it,
            # not to a second new session.
            await self._created.wait()
        cwd = self.run_cwd()
        frame = wire.message(text, self.session_id, self.profile, cwd, self.mode, on_busy)
        frame["id"] = f"{MESSAGE_ID}{next(self._message_ids)}"
        self._unanswered[frame["id"]] = Unanswered(text, self.renderer.busy)
        while len(self._unanswered) > UNANSWERED_MAX:  # answers lost to a dropped connection
            del self._unanswered[next(iter(self._unanswered))]
        if self.session_id and self.profile and self.profile != self.renderer.status.profile:
            self._profile.due = True  # the daemon switches the session to it for this run
        if self.session_id is None:
            self._creating, self._created = True, trio.Event()
        if await self.send(frame):
            self.renderer.busy = self.session_id is not None or self.renderer.busy
            if not self.renderer.status.activity:
                self.renderer.status.activity = WAITING  # until the run shows something
            return
        self._unanswered.pop(frame["id"], None)
        self.prefill(text)  # not sent: back on the prompt
        if self.session_id is None:
            self._creation_over()

    async def _typed(self, text: str, on_busy: str | None) -> bool:
        """A line that is an answer (a rewind's confirmation, an approval's) or a slash
        command, done; False for a message."""
        if self.rewinds.confirming is not None and await self.rewinds.answer(text):
            return True
        answer = ANSWERS.get(text.lower())
        if answer is not None and self._approvals and on_busy is None:
            await self._answer(*answer)
            return True
        if text.startswith("/") and on_busy is None:
            name, _, arg = text[1:].partition(" ")
            await self._commands.run(name, arg.strip())
            return True
        return False

    async def _answer(self, approve: bool, scope: str) -> None:
        """Answer the oldest waiting approval request of our session."""
        call_id, request = next(iter(self._approvals.items()))
        sid = str(request.get("session_id") or self.session_id)
        if await self.send(wire.approval(approve, sid, call_id, scope)):
            self._approvals.pop(call_id, None)
            if self._approvals:
                self.renderer.notice(f"{len(self._approvals)} more approval request(s) waiting")

    # ------------------------------------------------------------------ frames

    async def _frame_loop(self, recv: trio.MemoryReceiveChannel[Frame]) -> None:
        async for frame in recv:
            for reply in self.on_frame(frame):
                await self.send(reply)
            if not self._running():
                self._settled.set()

    def _running(self) -> bool:
        return (
            self.renderer.busy
            or self._creating
            or self._queued > 0
            or self.resuming is not None
            or self._profile.waiting is not None  # a run's status line waits for it
        )

    async def _wait_settled(self) -> None:
        while self._running():
            self._settled = trio.Event()
            await self._settled.wait()


__all__ = ["ChatApp", "ChatOptions"]
