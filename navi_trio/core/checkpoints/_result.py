"""A finished scan, as the engine uses it: kept (`commit`) or dropped (`abandon`)."""

from __future__ import annotations

from navi_trio.core.checkpoints._scan import Scan
from navi_trio.core.checkpoints._state import Folder


class ScanResult:
    """A finished scan: the root's listing digest, and `commit` to keep what it saw."""

    def __init__(self, scan: Scan) -> None:
        self.scan = scan
        self.tree = scan.run()  # the root's listing digest
        self.mode = scan.root_mode

    def commit(self) -> None:
        scan, state = self.scan, self.scan.state
        watcher = state.watcher
        for rel in scan.dropped:
            state.folders.pop(rel, None)
            state.linked.discard(rel)
            if watcher is not None and rel not in scan.overlay:
                watcher.forget(rel)
        state.folders.update(scan.overlay)
        for rel, linked in scan.linked.items():
            (state.linked.add if linked else state.linked.discard)(rel)
        state.pending = set()
        state.everything = False

    def finish(self) -> None:
        """Make what it stored visible (its pack), before a record names it."""
        if self.scan.writer is not None:
            self.scan.writer.finish()

    def abandon(self) -> None:
        """Keep nothing of this scan: what it looked at is looked at again next time."""
        if self.scan.writer is not None:
            self.scan.writer.abort()
        state = self.scan.state
        state.pending |= self.scan._dirty
        state.everything = state.everything or self.scan._full

    def folder(self, rel: str) -> Folder | None:
        """The folder `rel` as this scan leaves it (None: none there)."""
        return self.scan._folder(rel)
