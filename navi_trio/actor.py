"""The nursery-holding actor: an object that starts tasks in a nursery it owns.

Several actors (the task supervisor, the process pool, the session registry, the MCP
servers, the peer links) only hold a nursery for the tasks they start later, from
synchronous methods. Their body is always the same: open the nursery, keep it while
they run, say `started()`, wait to be cancelled, forget the nursery on the way out.
`NurseryHolder` is that body, once::

    class ProcessPool(NurseryHolder):
        def open(self, ...) -> None:
            self.nursery.start_soon(...)

    await parent.start(pool.run)

`on_start` runs inside the nursery before `started()` (an actor's start-up work, such
as reporting what a previous process left behind). `nursery` raises `RuntimeError`
when the actor is not running, so a late caller learns it at once instead of starting
a task nobody owns.
"""

from __future__ import annotations

import trio


class NurseryHolder:
    _nursery: trio.Nursery | None = None

    @property
    def running(self) -> bool:
        return self._nursery is not None

    @property
    def nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError(f"{type(self).__name__} is not running")
        return self._nursery

    async def on_start(self) -> None:
        """Start-up work inside the actor's nursery, before it takes requests."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery until cancelled; the tasks in it are cancelled with it."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self.on_start()
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
