"""A message of ours and its run: the daemon's ``ok`` (`Accepted`), then `OurRun`: the one
place that counts the runs queued ahead of our message, over the frames `open_daemon`
hands on (`navi run`, ACP, a peer daemon) or the chat's connection passes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from navi_trio import wire
from navi_trio.wire import Frame


@attrs.frozen
class Accepted:
    """The daemon's ``ok`` to a message: stored, and running or queued."""

    session_id: str
    created: bool  # the daemon made the session for this message
    queued: bool  # it waits behind the session's running turn
    # The strategy the daemon applied because the session was busy (core/turn/steering.py):
    # enqueue / interrupt (queued), steer (it joins the running turn); None: it runs now.
    on_busy: str | None = None
    mode: str | None = None  # the mode its run gets (the asked one clamped to the role)
    # The session's last seq (and its epoch) before the daemon took the message (handed
    # to the daemon that runs the session: as the daemon it was sent to saw it then, at
    # or below): every frame of its run, and its ``message_queued``, come after it.
    # None: an older daemon.
    seq: int | None = None
    epoch: str | None = None
    # Its client key was taken already, by a message sent before with it: this one does
    # not run; the fields are that message's (its run may have ended already).
    duplicate: bool = False

    @classmethod
    def of(cls, replies: Sequence[Frame]) -> Accepted:
        """From the daemon's replies to a message: a ``session`` one (it made the session),
        then the ``ok``; `ValueError` when the last is no ok."""
        ok = replies[-1]
        if ok.get("type") != wire.OK or not isinstance(ok.get("session_id"), str):
            raise ValueError(f"expected an ok to the message, got {ok}"[:300])
        created = any(r.get("type") == wire.SESSION and r.get("created") for r in replies)

        def text(key: str) -> str | None:
            value = ok.get(key)
            return value if isinstance(value, str) else None

        seq = ok.get("seq")
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
        queued = bool(ok.get("queued"))
        return cls(
            ok["session_id"],
            created,
            queued,
            text("on_busy"),
            text("mode"),
            seq,
            text("epoch"),
            bool(ok.get("duplicate")),
        )


@attrs.define(eq=False)
class OurRun:
    """Which frames of its session belong to the run of one message of ours.

    A message the daemon ran at once owns every frame of its session from the first on
    (this connection was subscribed when the daemon took the message). A queued one
    (`Accepted.queued`) waits behind the running turn and the messages queued before
    it: its ``message_queued`` frame (the first carrying our text) says how many runs
    end first (`position`); their top-level ``stream_end`` frames are counted down,
    then the frames are ours until our own top-level ``stream_end`` (`ended`). A
    ``message_dropped`` warning meanwhile (the queue's cap dropped the oldest waiting
    message) is one run fewer ahead of ours, or, when it names ours, its end (`dropped`).

    A steered one (`Accepted.on_busy` ``steer``) joins the running turn: its ``steered``
    frame (our text) makes the rest of that run ours. When that run ends without taking
    it in, it runs next, announced by a ``message_queued`` frame as a queued one is.

    A frame at or before `after` (the seq the ``ok`` names, same `epoch`) came before the
    daemon took our message: never ours, never counted. Without it (an older daemon),
    the frames are ours from the first handed on, as described above.
    """

    session_id: str
    text: str
    queued: bool
    on_queued: Callable[[int], object] = lambda position: None
    ahead: int | None = None  # runs still to end before ours (once our message_queued came)
    started: bool = False  # the frames are ours now
    ended: bool = False  # our top-level stream_end was seen (or our message was dropped)
    dropped: bool = False  # the queue's cap dropped our message: it never runs
    steered: bool = False  # sent with on_busy steer: waiting for its `steered` frame
    after: int | None = None  # the session's seq before our message was taken
    epoch: str | None = None  # the epoch `after` counts in

    def __attrs_post_init__(self) -> None:
        self.started = not self.queued and not self.steered

    @classmethod
    def of(
        cls, accepted: Accepted, text: str, on_queued: Callable[[int], object] = lambda n: None
    ) -> OurRun:
        steered = accepted.on_busy == "steer"
        return cls(
            accepted.session_id,
            text,
            accepted.queued,
            on_queued,
            steered=steered,
            after=accepted.seq,
            epoch=accepted.epoch,
        )

    @property
    def running(self) -> bool:
        """Our run is the one the session runs now (or about to)."""
        return self.started and not self.ended

    def ours(self, frame: Frame) -> bool:
        """Whether `frame` belongs to our run (counting the runs ahead of it on the way)."""
        if frame.get("session_id") != self.session_id or not wire.is_session_frame(frame):
            return False  # another session's, a reply, an out-of-band task_update, lagged
        if self._before_ours(frame):
            return False
        if not self.started:
            if self.steered and self.ahead is None:
                if frame.get("type") == wire.STEERED and frame.get("text") == self.text:
                    self.started = True  # it joined the running turn: the rest is ours
                    return True
            if self.ahead is None:
                if frame.get("type") == wire.MESSAGE_QUEUED and frame.get("text") == self.text:
                    position = frame.get("position")
                    self.ahead = position if isinstance(position, int) and position >= 0 else 1
                    self.on_queued(self.ahead)
                return False
            if wire.dropped_by_the_cap(frame):
                if wire.dropped_by_the_cap(frame, self.text):  # ours: it will not run
                    self.dropped = self.ended = True
                    return True
                self.ahead = max(self.ahead - 1, 0)  # the oldest waiting: one ahead of ours
                return False
            if self.ahead > 0:
                if wire.is_top_end(frame):
                    self.ahead -= 1
                return False
            self.started = True
        self.ended = self.ended or wire.is_top_end(frame)
        return True

    def _before_ours(self, frame: Frame) -> bool:
        """`frame` was published before the daemon took our message."""
        if self.after is None or frame["seq"] > self.after:
            return False
        epoch = frame.get("epoch")
        return self.epoch is None or not isinstance(epoch, str) or epoch == self.epoch

    @staticmethod
    def counts(frame: Frame) -> bool:
        """Whether `frame` can move a run towards its end: what a client keeps of the
        frames that came before the ``ok`` (fed these, a run ends where it would have)."""
        kind = frame.get("type")
        return (
            kind in (wire.MESSAGE_QUEUED, wire.STEERED)
            or wire.is_top_end(frame)
            or wire.dropped_by_the_cap(frame)
        )
