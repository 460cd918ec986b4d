"""`ChatApp`: the `navi chat` program, wiring a `Connection`, a `Reader` and a `Renderer`.

Three tasks in one nursery: the connection actor (frames in), the frame loop (frames to
the renderer; replies to requests), and the input loop (lines to messages and slash
commands). The app keeps the session state the frames change: which session, the
approval requests waiting, the messages queued, where the stream is (seq, epoch), and
what a resync's history replay may skip. A SIGINT that reaches the process (no prompt
in raw mode at that moment) is handled like Ctrl-C typed at the prompt: stop the run,
or quit on a second press at an idle prompt.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import AsyncIterator

import attrs
import trio

from navi_trio import wire
from navi_trio.client.awaited import Awaited
from navi_trio.client.commands import ANSWERS, SlashCommands
from navi_trio.client.connection import BACKOFF_FIRST, RETRIES, TOKEN_HINT, Connection
from navi_trio.client.profile import ProfileAsk
from navi_trio.client.reader import InputEvent, Reader
from navi_trio.client.render import WAITING, Renderer
from navi_trio.client.rewind import RewindFlow
from navi_trio.errors import DaemonUnreachableError
from navi_trio.text import usage_table
from navi_trio.wire import Frame

COMMANDS_ID = "chat-commands"  # the id of our request for the commands kept as files


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
    # End of input (a script piped in) waits, before quitting, for the answer to every
    # message sent (client/awaited.py) and for the run going; Ctrl-D at a terminal quits
    # at once.
    finish_runs_on_eof: bool = False


MESSAGE_ID = "chat-message-"  # the ids of our messages (their replies echo them)


class ChatApp:
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
        # Our messages the daemon has not answered yet (a refused one goes back on the
        # prompt, never lost), and the runs of those it took, until their end.
        self._awaited = Awaited()
        # A reconnect under way: from the drop to the reply to the subscribe that resumes
        # the session, and then (`_catch_up`) until its replay reached the seq that
        # reply names. Until then what is going on in the session is not known here.
        self._away = False
        self._catch_up: int | None = None
        self._message_ids = itertools.count(1)
        self._quit = trio.CancelScope()
        self.rewinds = RewindFlow(self)  # /rewind, /fork (client/rewind.py)
        self._commands = SlashCommands(self)
        renderer.status.profile = self.profile

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
            self._awaited.resend(None)  # (lets go those sent to the session left)
            return []
        self._quiet_tasks = True
        return [
            wire.subscribe(self.session_id, self.last_seq, self.epoch),
            wire.tasks_list(self.session_id),
            # After the subscribe: the replay shows the runs of those the daemon took.
            *self._awaited.resend(self.session_id),
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
        # Its key makes sending it again after a reconnect safe: the daemon runs it once.
        key = wire.message_key()
        frame = wire.message(text, self.session_id, self.profile, cwd, self.mode, on_busy, key=key)
        frame["id"] = f"{MESSAGE_ID}{next(self._message_ids)}"
        self._awaited.sent(frame["id"], text, self.renderer.busy, frame)
        if self.session_id and self.profile and self.profile != self.renderer.status.profile:
            self._profile.due = True  # the daemon switches the session to it for this run
        if self.session_id is None:
            self._creating, self._created = True, trio.Event()
        if await self.send(frame):
            self.renderer.busy = self.session_id is not None or self.renderer.busy
            if not self.renderer.status.activity:
                self.renderer.status.activity = WAITING  # until the run shows something
            return
        self._awaited.refused(frame["id"])
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
            or self._awaited.waiting
            or self._away
            or self._catch_up is not None
        )

    async def _wait_settled(self) -> None:
        while self._running():
            self._settled = trio.Event()
            await self._settled.wait()

    def welcomed(self, welcome: Frame) -> None:
        """What a welcome tells: the profiles a message may name."""
        profiles = welcome.get("profiles")
        if isinstance(profiles, list):
            self.profiles = [str(p) for p in profiles]

    def _refused(self, frame: Frame) -> None:
        """A message of ours refused: back on the prompt, to send again as it is or
        edited."""
        sent = self._awaited.refused(str(frame.get("id")))
        if sent is not None:
            if not sent.busy:  # no run of ours goes on after all
                self.renderer.busy = False
                self.renderer.status.activity = ""
            self.prefill(sent.text)
            self.renderer.notice("your message is back on the prompt")

    def _creation_over(self) -> None:
        self._creating = False
        self._created.set()

    def set_session(self, session_id: str | None) -> None:
        if session_id != self.session_id:
            self.last_seq = self.epoch = None
            self._queued = 0
            self.renderer.reset()
            self._synced_users = self._ended_runs = 0
            self._rewound = False
            self._approvals.clear()
            self._profile.forget()
            self.rewinds.reset()
            self._awaited.forget_runs()  # their frames no longer come here
            self._catch_up = None
        self.session_id = self.renderer.status.session_id = session_id

    def on_frame(self, frame: Frame) -> list[Frame]:
        """Handle one frame; returns the frames to send in answer (e.g. subscribe)."""
        replies = self._on_frame(frame)
        if self.session_id is not None and self._conn is not None and self._conn.connected:
            ask = self._profile.ask()
            if ask is not None:
                replies.append(ask)
        return replies

    def _on_profile(self, frame: Frame) -> None:
        """The reply to our own `sessions list` (or its refusal): the session's profile."""
        if not self._profile.answered(frame):
            return  # a reply about a session we left
        self._profile_from(list(frame.get("sessions") or []))
        if not self._profile.wanted:
            self.renderer.release_status()

    def _profile_from(self, sessions: list[Frame]) -> None:
        """Our session's profile, from a sessions list (the daemon's word for it)."""
        for row in sessions:
            if isinstance(row, dict) and row.get("session_id") == self.session_id:
                self.renderer.status.profile = str(row.get("profile"))

    def _on_frame(self, frame: Frame) -> list[Frame]:
        kind = frame["type"]
        r = self.renderer
        if frame.get("id") == COMMANDS_ID and kind == "error":
            # A daemon that lists no commands kept as files (an older one: unknown_type)
            # is no fault; a folder it refuses is said on the first message anyway.
            if frame.get("code") != "unknown_type":
                r.notice(f"commands kept as files are not offered: {frame.get('message')}")
            return []
        if str(frame.get("id")) in self._awaited.unanswered and kind in ("ok", "error"):
            if kind == "ok":
                self._awaited.taken(str(frame["id"]), frame, self.session_id, self.epoch)
                return []
            r.frame(frame)  # the refusal first, then the message back on the prompt
            self._refused(frame)
            if self._creating and self.session_id is None:
                self._creation_over()  # the new session's message was refused
            return []
        if kind == "_disconnected":
            if self._creating:
                self._creation_over()  # its session frame may be lost: stop waiting for it
            if self._profile.waiting is not None:  # its reply is lost: ask again once back
                self._profile.lost()
            again, lost = self._awaited.lost()
            self._away = True
            r.release_status()
            r.status.connected = False
            r.warning(
                f"connection lost ({frame.get('reason')}); reconnecting in "
                f"{frame.get('retry_in')}s (try {frame.get('attempt')})…"
            )
            if again:
                r.notice(
                    f"{again} message(s) sent had no answer yet: sent again once reconnected "
                    "(the daemon runs each once)"
                )
            if lost:
                r.notice(
                    f"{lost} message(s) sent had no answer yet: whether the daemon took them "
                    "is not known here (the session's history will tell)"
                )
        elif kind == "_reconnected":
            self._away = self.session_id is not None  # until the subscribe's reply
            r.status.connected = True
            self.welcomed(frame.get("welcome") or {})
            r.notice("reconnected")
        elif kind == "session":
            self._awaited.in_session(str(frame.get("id")), str(frame["session_id"]))
            if self.session_id is None:
                self._adopt(str(frame["session_id"]))
        elif kind == "sessions" and self._profile.is_ask(frame):
            self._on_profile(frame)
        elif kind == "sessions":
            return self._on_sessions(frame)
        elif kind == "tasks":
            self._on_tasks(frame)
        elif kind == wire.USAGE:
            for line in usage_table(frame):
                r.notice(line)
        elif kind == wire.COMMANDS:
            self._commands.listed(frame)
        elif kind in (wire.CHECKPOINTS, wire.REWIND, wire.FORK):
            return self.rewinds.on_reply(frame)
        elif kind in ("schedules", "schedule_run"):
            r.frame(frame)
        elif kind == "resync":
            if frame.get("session_id") == self.session_id:
                self.epoch = frame.get("epoch")
                self.last_seq = frame.get("seq")
                r.reset()  # a run half-shown may be gone (a restarted daemon): drop its text
                self._awaited.forget_runs()  # frames are missing: their ends may be too
                self._away, self._catch_up = False, None  # the live frames go on from here
                if not self._rewound:
                    r.frame(frame)  # a rewind's own reload is no fault: nothing to say
                self._rewound = False
                return [wire.history(str(self.session_id))]
        elif kind == "lagged":
            r.frame(frame)
        elif kind == "ok":
            self._on_waiting(frame)
        elif kind == "welcome":
            pass
        elif kind == "error" and self._profile.is_ask(frame):
            self._profile.wanted = False  # refused (rate limit…): the line shows what we know
            self._on_profile(frame)
        elif kind == "error" and not isinstance(frame.get("seq"), int):
            if frame.get("session_id") in (None, self.session_id):
                self._away = False  # the resuming subscribe refused, maybe: no replay comes
            # A refused request (never a run's error, those have a seq): always shown,
            # also when it names a session we are not on (/resume of a wrong id).
            if self.resuming is not None and frame.get("session_id") in (None, self.resuming):
                self.resuming = None
            if self._creating and self.session_id is None:
                self._creation_over()  # the new session's message was refused
            if self.rewinds.waiting:
                self.rewinds.failed()
            r.frame(frame)
        elif wire.is_session_frame(frame):
            self._on_session_frame(frame)
        elif frame.get("session_id") in (None, self.session_id):
            r.frame(frame)  # errors, task updates of ours or of the connection
        return []

    def _adopt(self, session_id: str) -> None:
        """The session the server created for our first message."""
        self._creation_over()
        self.set_session(session_id)
        self._profile.wanted = True  # the daemon named its profile (ours, or its default)
        self.renderer.busy = True  # our first message is running in it
        self.renderer.status.activity = self.renderer.status.activity or WAITING
        self.renderer.notice(f"session {session_id}")

    def _on_session_frame(self, frame: Frame) -> None:
        if self.session_id is None and self._creating and frame.get("session_id"):
            self._adopt(str(frame["session_id"]))
        if frame.get("session_id") != self.session_id:
            return  # a session we left
        # A replay overlapping what we saw never gets here: the connection's stream drops
        # the frames it delivered before (api/daemon_client.py).
        self.last_seq = int(frame["seq"])
        epoch = frame.get("epoch")
        self.epoch = epoch if isinstance(epoch, str) else self.epoch
        self._awaited.frame(frame)
        if self._catch_up is not None and self.last_seq >= self._catch_up:
            self._catch_up = None  # the replay is in: what goes on shows from here
        if frame["type"] == "approval_request":
            if str(frame.get("call_id")) in self._approvals:
                return  # already shown from the subscribe reply
            self._approvals[str(frame.get("call_id"))] = frame
        elif frame["type"] == "approval_decided":
            self._approvals.pop(str(frame.get("call_id")), None)
        if frame["type"] == "rewound":
            self._rewound = True  # the resync that follows is the rewind's reload
        if frame["type"] == "message_queued" and isinstance(frame.get("position"), int):
            self._queued = frame["position"]  # its place is the queue's length (drops counted)
        top = not frame.get("is_subagent")
        if top and frame["type"] == "tool_started" and frame.get("name") == "switch_profile":
            self._profile.due = True
        if top and frame["type"] == "stream_end":
            self._profile.run_ended()
            # The status line under the answer shows the profile the daemon reports.
            self.renderer.hold_status = self._profile.holding
        self.renderer.frame(frame)
        if frame["type"] == "stream_end" and not frame.get("is_subagent"):
            self._ended_runs += 1
            if self._queued > 0:  # the daemon runs the next queued message now
                self._queued -= 1
                self.renderer.busy = True

    def _on_waiting(self, frame: Frame) -> None:
        """The approval requests still waiting, from the `ok` to a subscribe (a reconnect or
        /resume): shown as cards again, answered like live ones."""
        waiting = frame.get("approvals")
        if frame.get("session_id") != self.session_id or not isinstance(waiting, list):
            return
        seq = frame.get("seq")
        if self._away:  # back: the replay runs from our last seq to (at least) this one
            self._away = False
            if self.last_seq is not None and isinstance(seq, int) and seq > self.last_seq:
                self._catch_up = seq
        # The daemon's list is the truth: one decided while we were away is gone from it.
        self._approvals.clear()
        for request in waiting:
            call_id = str(request.get("call_id")) if isinstance(request, dict) else ""
            if call_id:
                self._approvals[call_id] = {**request, "session_id": self.session_id}
                self.renderer.frame(request)

    def _on_sessions(self, frame: Frame) -> list[Frame]:
        action = frame.get("action")
        if action == "list":
            sessions = list(frame.get("sessions") or [])
            self._profile_from(sessions)
            self.renderer.sessions(sessions)
        elif action == "history":
            sid = str(frame.get("session_id"))
            if sid == self.resuming:
                self.resuming = None
                self.set_session(sid)
                self.renderer.status.profile = None  # until the daemon says which
                self._profile.wanted = True
                messages = list(frame.get("messages") or [])
                self.renderer.history(messages)
                self._synced_users, self._ended_runs = _users(messages), 0
                self.last_seq = frame.get("seq")
                self.epoch = frame.get("epoch")
                self.renderer.notice(f"resumed session {sid}")
                return [wire.subscribe(sid, self.last_seq, self.epoch)]
            if sid == self.session_id:  # after a resync: live frames continue on their own
                messages = list(frame.get("messages") or [])
                if self._rewritten:
                    self._rewritten = False
                    self._synced_users, self._ended_runs = _users(messages), 0
                    return []
                seen = self._synced_users + self._ended_runs
                self.renderer.history(_after_users(messages, seen), replayed_from=seen)
                self._synced_users, self._ended_runs = _users(messages), 0
        elif action == "delete":
            self.renderer.notice(f"deleted session {frame.get('session_id')}")
        return []

    def _on_tasks(self, frame: Frame) -> None:
        action = frame.get("action")
        if action == "list":
            tasks = list(frame.get("tasks") or [])
            quiet, self._quiet_tasks = self._quiet_tasks, False
            if tasks or not quiet:
                self.renderer.tasks(tasks)
        elif action == "check":
            task = frame.get("task") or {}
            self.renderer.notice(f"task {task.get('task_id')}: {task.get('status')}")
        elif action == "cancel":
            self.renderer.notice("task cancelled")


def _users(messages: list[Frame]) -> int:
    return sum(1 for m in messages if m.get("role") == "user")


def _after_users(messages: list[Frame], seen: int) -> list[Frame]:
    """`messages` from the user message after the first `seen` ones: the turns not yet
    shown in full. Fewer user messages than that (a count gone wrong): the last turn."""
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if seen < len(starts):
        return messages[starts[seen] :]
    if seen == len(starts):
        return []
    return messages[starts[-1] :] if starts else messages


__all__ = ["ChatApp", "ChatOptions"]
