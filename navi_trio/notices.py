"""Notices to a user's connected clients: what concerns them but no session they follow.

A scheduled run ends (core/triggers/schedules.py): its owner's clients are told (`ScheduleRun`),
whatever session they are in or none. `UserNotices` is the hub: every connection of a
user subscribes (`subscribe`, a bounded channel), the core publishes (`publish`, never
blocks: a client too slow to take its notices loses those past its bound, and the daemon
logs each). The core publishes data, not frames: api/ builds them. Out of band: no
seq, no replay; a client that was away learns the results from the history and
``schedule list``.

With several daemons on one database (core/cluster/), a notice published on one is
passed to the others (`elsewhere`, set by the cluster), each of which hands it to its
own clients of the user (`publish_here`): a user's clients get it on whichever daemon
they are connected to, once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import attrs
import trio

log = logging.getLogger(__name__)

NOTICES_MAX = 64  # a connection's notices not yet sent


@attrs.frozen
class ScheduleRun:
    """A scheduled run ended (`reason` is its stream_end's), or was skipped ("skipped",
    `text` saying why, no session)."""

    schedule_id: str
    session_id: str | None
    reason: str
    text: str
    at: float  # time.time() when it ended


Notice = ScheduleRun
TEXT_MAX_CHARS = 2000  # what a notice from another daemon may carry of its text


def notice_data(notice: Notice) -> dict[str, object]:
    """A notice as JSON data, for another daemon (`notice_of` reads it back)."""
    return attrs.asdict(notice)


def notice_of(data: object) -> Notice | None:
    """The notice another daemon sent (its JSON: each field checked), or None."""
    if not isinstance(data, dict):
        return None
    sid, session, reason, text, at = (
        data.get(k) for k in ("schedule_id", "session_id", "reason", "text", "at")
    )
    if not (isinstance(sid, str) and isinstance(reason, str) and isinstance(text, str)):
        return None
    if not (session is None or isinstance(session, str)) or not isinstance(at, int | float):
        return None
    return ScheduleRun(
        sid[:100], session and session[:128], reason[:40], text[:TEXT_MAX_CHARS], float(at)
    )


class UserNotices:
    def __init__(self) -> None:
        self._subs: dict[str, set[trio.MemorySendChannel[Notice]]] = {}
        # Passes a notice published here to the other daemons (core/cluster/cluster.py).
        self.elsewhere: Callable[[str, Notice], None] | None = None

    @contextmanager
    def subscribe(self, user_id: str) -> Iterator[trio.MemoryReceiveChannel[Notice]]:
        send, recv = trio.open_memory_channel[Notice](NOTICES_MAX)
        self._subs.setdefault(user_id, set()).add(send)
        try:
            with recv:
                yield recv
        finally:
            subs = self._subs.get(user_id, set())
            subs.discard(send)
            if not subs:
                self._subs.pop(user_id, None)
            send.close()

    def publish(self, user_id: str, notice: Notice) -> int:
        """Send `notice` to every connection of the user, on this daemon and the others;
        how many here got it."""
        if self.elsewhere is not None:
            self.elsewhere(user_id, notice)
        return self.publish_here(user_id, notice)

    def publish_here(self, user_id: str, notice: Notice) -> int:
        """Send `notice` to every connection of the user on this daemon; how many got it."""
        sent = 0
        for send in list(self._subs.get(user_id, ())):
            try:
                send.send_nowait(notice)
                sent += 1
            except trio.WouldBlock:
                log.warning("a client of user %s takes no notices: one dropped", user_id)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subs.get(user_id, set()).discard(send)
        return sent
