"""The session's profile on the chat's status line: the daemon's word for it.

The chat asks for it (``sessions list``) when a session is adopted or resumed, and
when a run ends that may have switched it: one ask at a time, under its own id
(`PROFILE_ASK`), whose reply updates the status line and is not shown.
"""

from __future__ import annotations

import itertools

from navi_trio import wire
from navi_trio.wire import Frame

PROFILE_ASK = "chat-profile-"


class ProfileAsk:
    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.waiting: str | None = None  # id of the list request waiting for its reply
        self.wanted = False  # ask as soon as no request waits (and we are connected)
        self.due = False  # ask when the current run ends

    @staticmethod
    def is_ask(frame: Frame) -> bool:
        """A frame of ours asking (or its reply, or its refusal)."""
        return str(frame.get("id") or "").startswith(PROFILE_ASK)

    @property
    def holding(self) -> bool:
        """The status line under a run's end waits for an answer."""
        return self.wanted or self.waiting is not None

    def lost(self) -> None:
        """The ask or its reply is lost (not sent, the connection dropped): again once back."""
        self.waiting, self.wanted = None, True

    def forget(self) -> None:
        """Another session now: a reply still on its way is about the old one."""
        self.waiting = None
        self.wanted = self.due = False

    def run_ended(self) -> None:
        if self.due:
            self.due, self.wanted = False, True

    def ask(self) -> Frame | None:
        """The frame asking now, when one is wanted and none waits."""
        if not self.wanted or self.waiting is not None:
            return None
        self.wanted = False
        self.waiting = f"{PROFILE_ASK}{next(self._ids)}"
        return {**wire.sessions_list(), "id": self.waiting}

    def answered(self, frame: Frame) -> bool:
        """Whether `frame` answers the ask that waits (else it is about a session we left)."""
        if frame.get("id") != self.waiting:
            return False
        self.waiting = None
        return True
