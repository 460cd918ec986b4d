"""Notices to a user's connected clients: what concerns them but no session they follow.

A scheduled run ends (core/triggers/schedules.py): its owner's clients are told (`ScheduleRun`),
whatever session they are in or none. `UserNotices` is the hub: every connection of a
user subscribes (`subscribe`, a bounded channel), the core publishes (`publish`, never
blocks: a client too slow to take its notices loses those past its bound, and the daemon
logs each). The core publishes data, not frames: api/ builds them. Out of band: no
seq, no replay; a client that was away learns the results from the history and
``schedule list``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
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


class UserNotices:
    def __init__(self) -> None:
        self._subs: dict[str, set[trio.MemorySendChannel[Notice]]] = {}

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
        """Send `notice` to every connection of the user; how many got it."""
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
