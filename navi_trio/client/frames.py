"""How the chat takes the daemon's frames: `FrameHandling`, the frame half of `ChatApp`.

`on_frame` handles one frame and answers the frames to send back: a resync's history
request, a /resume's subscribe, the session's profile asked again (client/profile.py).
It keeps the session state the frames change: which session (a new one adopted, a
/resume's history, `set_session`), the approval requests still waiting, the messages
queued, where the stream is (seq, epoch), and what a resync's history replay may skip.
The state itself is set up by `ChatApp` (client/app.py), which this class is a base of.
"""

from __future__ import annotations

import attrs
import trio

from navi_trio import wire
from navi_trio.client.connection import Connection
from navi_trio.client.profile import ProfileAsk
from navi_trio.client.render import WAITING, Renderer
from navi_trio.client.rewind import RewindFlow
from navi_trio.wire import Frame


@attrs.frozen
class Unanswered:
    """A message of ours the daemon has not answered: its text, and whether a run of
    ours was going when it was sent (a refusal leaves things as they were)."""

    text: str
    busy: bool


class FrameHandling:
    """The frame handlers of `ChatApp`; the attributes are the app's (set in its init)."""

    renderer: Renderer
    session_id: str | None
    resuming: str | None
    last_seq: int | None
    epoch: str | None
    rewinds: RewindFlow
    _approvals: dict[str, Frame]
    _queued: int
    _creating: bool
    _created: trio.Event
    _quiet_tasks: bool
    _synced_users: int
    _ended_runs: int
    _rewritten: bool
    _rewound: bool
    _profile: ProfileAsk
    _conn: Connection | None

    profiles: list[str] | None
    _unanswered: dict[str, Unanswered]

    def prefill(self, text: str) -> None: ...

    def welcomed(self, welcome: Frame) -> None:
        """What a welcome tells: the profiles a message may name."""
        profiles = welcome.get("profiles")
        if isinstance(profiles, list):
            self.profiles = [str(p) for p in profiles]

    def _answered(self, frame: Frame) -> None:
        """A reply to a message of ours: taken (ok, session), or refused (back on the
        prompt, to send again as it is or edited)."""
        sent = self._unanswered.pop(str(frame.get("id")), None)
        if sent is not None and frame.get("type") == "error":
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
        if str(frame.get("id")) in self._unanswered and kind in ("ok", "session", "error"):
            if kind == "error":
                r.frame(frame)  # the refusal first, then the message back on the prompt
            self._answered(frame)
            if kind == "error":
                if self._creating and self.session_id is None:
                    self._creation_over()  # the new session's message was refused
                return []
        if kind == "_disconnected":
            if self._creating:
                self._creation_over()  # its session frame may be lost: stop waiting for it
            if self._profile.waiting is not None:  # its reply is lost: ask again once back
                self._profile.lost()
            r.release_status()
            r.status.connected = False
            r.warning(
                f"connection lost ({frame.get('reason')}); reconnecting in "
                f"{frame.get('retry_in')}s (try {frame.get('attempt')})…"
            )
        elif kind == "_reconnected":
            r.status.connected = True
            self.welcomed(frame.get("welcome") or {})
            r.notice("reconnected")
        elif kind == "session":
            if self.session_id is None:
                self._adopt(str(frame["session_id"]))
        elif kind == "sessions" and self._profile.is_ask(frame):
            self._on_profile(frame)
        elif kind == "sessions":
            return self._on_sessions(frame)
        elif kind == "tasks":
            self._on_tasks(frame)
        elif kind in (wire.CHECKPOINTS, wire.REWIND, wire.FORK):
            return self.rewinds.on_reply(frame)
        elif kind in ("schedules", "schedule_run"):
            r.frame(frame)
        elif kind == "resync":
            if frame.get("session_id") == self.session_id:
                self.epoch = frame.get("epoch")
                self.last_seq = frame.get("seq")
                r.reset()  # a run half-shown may be gone (a restarted daemon): drop its text
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
