"""The second `SessionBroadcast`: a session's frames from whichever daemon runs it.

`RelayBroadcast` is `LocalBroadcast` plus `relay(frame)`: a frame another daemon
published, kept and fanned out as it is, seq and epoch unchanged, so a client may
reconnect to any daemon with the seq it saw. A frame out of turn (another epoch, a seq
that does not follow) first tells the subscribers ``resync``: never a silent gap. When
this daemon publishes again after relaying, its frames get a new epoch and seqs above
every seq held (`seq_floor`), after a ``resync``: no (epoch, seq) names two frames.
"""

from __future__ import annotations

from navi_trio.core.session import Frame, LocalBroadcast, ReplayBuffer, new_epoch
from navi_trio.events import AgentEvent


class RelayBroadcast(LocalBroadcast):
    relayed = False  # the last frames came from another daemon

    @property
    def seq_floor(self) -> int:
        """The highest seq this broadcast ever held (a successor starts above it)."""
        return max(self._seq, getattr(self, "_floor", 0))

    def publish(self, event: AgentEvent) -> Frame:
        if self.relayed:  # our own frames again: a name of their own, announced
            self.relayed = False
            self._epoch = new_epoch()
            self._seq = self.seq_floor
            self.resync()
        return super().publish(event)

    def relay(self, frame: Frame) -> None:
        seq, epoch = frame.get("seq"), frame.get("epoch")
        if not isinstance(seq, int) or not isinstance(epoch, str):
            self._fan_out(frame)  # out of band (task_update): never kept
            return
        self._floor = max(self.seq_floor, seq)
        if epoch != self._epoch or seq != self._seq + 1:
            self.buffer = ReplayBuffer()
            self._epoch, self._seq = epoch, seq - 1
            self._fan_out(self._resync(self.session_id, self._seq, self._epoch))
        self.relayed = True
        self._seq = seq
        self.buffer.append(frame)
        self._fan_out(frame)
