"""`Awaited`: the chat's messages still to be answered, from the send to their run's end.

The end of a piped script waits on these. A message sent waits for the daemon's reply:
an error (refused: nothing runs), or ``ok`` (taken: its run is then followed by an
`OurRun`, api/our_run.py, which counts the runs queued ahead of it). The ``ok`` and the
first frames of the run, even its end, can come in either order, so the frames that move
a run towards its end (`OurRun.counts`) are kept while a message is unanswered and fed
to its run when the ok comes; the ok's seq tells which of them are that run's.

Each message goes with a key of its own (the ``message`` frame's ``key``). When the
connection drops before a message's reply, whether the daemon took it is not known here:
it is sent again, as it was, once reconnected (`resend`), and the daemon, which keeps the
keys of a session's messages, runs it once (a resend of one it took gets that one's ok
again, ``duplicate``). A new session's first message is sent again only once the daemon
named the session for it (the key is the session's).
"""

from __future__ import annotations

import collections

import attrs

from navi_trio.api.our_run import Accepted, OurRun
from navi_trio.wire import Frame

UNANSWERED_MAX = 64  # messages waiting for their reply (more: the oldest is let go)
KEPT_MAX = 1000  # frames kept for runs whose ok has not come (a few per run ahead)


@attrs.define
class Sent:
    """A message of ours the daemon has not answered: its text, whether a run of ours
    was going when it was sent (a refusal leaves things as they were), and its frame
    (with its id and key), to send again after a reconnect."""

    text: str
    busy: bool
    frame: Frame = attrs.field(factory=dict, eq=False)


class Awaited:
    def __init__(self) -> None:
        self.unanswered: dict[str, Sent] = {}  # request id -> the message
        self.runs: list[OurRun] = []  # the runs of our messages taken, not ended yet
        self._kept: collections.deque[Frame] = collections.deque(maxlen=KEPT_MAX)

    @property
    def waiting(self) -> bool:
        """A message of ours is unanswered, or its run has not ended."""
        return bool(self.unanswered or self.runs)

    def sent(self, rid: str, text: str, busy: bool, frame: Frame | None = None) -> None:
        self.unanswered[rid] = Sent(text, busy, dict(frame or {}))
        while len(self.unanswered) > UNANSWERED_MAX:
            del self.unanswered[next(iter(self.unanswered))]

    def refused(self, rid: str) -> Sent | None:
        """The message `rid` was refused (or never went out): nothing to wait for."""
        sent = self.unanswered.pop(rid, None)
        self._settle()
        return sent

    def in_session(self, rid: str, session_id: str) -> None:
        """The daemon made session `session_id` for message `rid`: sent again, it goes there."""
        sent = self.unanswered.get(rid)
        if sent is not None and sent.frame:
            sent.frame["session_id"] = session_id

    def taken(self, rid: str, ok: Frame, session_id: str | None, epoch: str | None = None) -> None:
        """The daemon's ``ok`` to message `rid`: its run is followed from the frames kept,
        unless it runs in a session the chat has left (none of its frames come here), or
        it is the ok again of a message the daemon took in an earlier life (a resend
        after a restart: its `epoch` is not the session's now, and its turn is in the
        history the chat reloaded)."""
        sent = self.unanswered.pop(rid, None)
        try:
            accepted = Accepted.of([ok])
        except ValueError:
            accepted = None
        if accepted is not None and accepted.duplicate and accepted.epoch != epoch:
            accepted = None
        if sent is not None and accepted is not None and accepted.session_id == session_id:
            run = OurRun.of(accepted, sent.text)
            for frame in self._kept:
                run.ours(frame)
            if not run.ended:
                self.runs.append(run)
        self._settle()

    def frame(self, frame: Frame) -> None:
        """A frame of the session the chat follows."""
        if self.runs:
            for run in self.runs:
                run.ours(frame)
            self.runs = [run for run in self.runs if not run.ended]
        if self.unanswered and OurRun.counts(frame):
            self._kept.append(frame)

    def lost(self) -> tuple[int, int]:
        """The connection dropped: the replies not come are gone with it. The messages
        sent to a session are kept, to send again (`resend`); the others (a new
        session's first, its session not named yet) are let go, not waited for. How
        many of each. The runs go on being followed: the reconnect's replay has every
        frame since the last."""
        gone = [rid for rid, sent in self.unanswered.items() if not sent.frame.get("session_id")]
        for rid in gone:
            del self.unanswered[rid]
        self._settle()
        return len(self.unanswered), len(gone)

    def resend(self, session_id: str | None) -> list[Frame]:
        """The frames to send again once reconnected: our messages to `session_id` still
        unanswered, each with its id and key as it first went. Those to another session
        (the chat moved on after sending them: `/new`, `/resume`) are let go: their runs
        are not followed here, and their ok, lost with the connection, would be waited
        for for ever. (A new session's first message, not named yet, is `lost`'s.)"""
        kept = (session_id, None)
        self.unanswered = {
            rid: sent
            for rid, sent in self.unanswered.items()
            if sent.frame.get("session_id") in kept
        }
        self._settle()
        if session_id is None:
            return []
        return [
            dict(sent.frame)
            for sent in self.unanswered.values()
            if sent.frame.get("session_id") == session_id
        ]

    def forget_runs(self) -> None:
        """The runs can no longer be followed (the chat moved to another session, or the
        daemon's stream of the session had a gap: resync)."""
        self.runs.clear()
        self._kept.clear()

    def _settle(self) -> None:
        if not self.unanswered:
            self._kept.clear()


__all__ = ["Awaited", "Sent"]
