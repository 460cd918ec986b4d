"""navi_trio/actor.py: the nursery-holding actor body shared by the daemon's actors."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from navi_trio.actor import NurseryHolder


class _Holder(NurseryHolder):
    def __init__(self) -> None:
        self.started_before_ready = False
        self.done = trio.Event()

    async def on_start(self) -> None:
        self.started_before_ready = self.running

    def spawn(self) -> None:
        self.nursery.start_soon(self._work)

    async def _work(self) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self.done.set()


async def test_a_holder_owns_its_tasks_and_refuses_work_when_not_running() -> None:
    holder = _Holder()
    with pytest.raises(RuntimeError, match="_Holder is not running"):
        holder.spawn()
    with trio.fail_after(5):
        async with trio.open_nursery() as parent:
            await parent.start(holder.run)
            assert holder.running and holder.started_before_ready
            holder.spawn()
            await trio.testing.wait_all_tasks_blocked()
            parent.cancel_scope.cancel()
    # Cancelling the actor cancelled the task it started, and it forgot its nursery.
    assert holder.done.is_set()
    assert not holder.running
    with pytest.raises(RuntimeError):
        holder.spawn()
