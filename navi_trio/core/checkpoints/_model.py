"""What the checkpoint engine answers, and the errors it raises (all frozen values)."""

from __future__ import annotations

from pathlib import Path

import attrs

from navi_trio.errors import NaviError

# What a preview says of what it cannot see (the wiring shows it with every preview).
NOT_COVERED = (
    "Only the session folder and the working folder are restored; files changed "
    "elsewhere (possible in full mode) and ignored paths (.gitignore, the ignore list) "
    "are left as they are."
)


class CheckpointError(NaviError):
    """A checkpoint request failed; the message says why in the user's words."""


class UnknownCheckpointError(CheckpointError):
    """No such checkpoint for this owner (never made, pruned, or deleted)."""


class CheckpointChangedError(CheckpointError):
    """The folders changed after the preview the restore was confirmed with."""


class CheckpointDamagedError(CheckpointError):
    """A stored object the checkpoint needs is missing or unreadable."""


class FileTooLargeError(Exception):
    """Internal: a file grew past the per-file cap while it was read."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


@attrs.frozen
class LeftOut:
    """A path a checkpoint holds no copy of (a restore leaves it as it finds it)."""

    root: Path
    path: str  # relative to `root`
    size: int
    reason: str


@attrs.frozen
class RootTree:
    """One snapshotted root: its real path, its listing's digest, its permission bits."""

    path: Path
    tree: str
    mode: int


@attrs.frozen
class CheckpointInfo:
    """One checkpoint of an owner's roots.

    `files`/`dirs`/`bytes`: what it holds. `new_bytes`: what taking it stored (the disk
    it costs, blobs shared with other checkpoints not counted). `changed`: files and
    links that differed from the previous snapshot of the same roots (by any owner).
    `created`: wall-clock seconds since the epoch.
    """

    id: str
    owner: str
    created: float
    label: str
    roots: tuple[RootTree, ...]
    files: int
    dirs: int
    bytes: int
    new_bytes: int
    changed: int
    left_out: tuple[LeftOut, ...] = ()

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(r.path for r in self.roots)


@attrs.frozen
class Created:
    """A snapshot was taken (or the owner's latest one already holds this state:
    `reused`). `checkpoint.left_out` names files it could not copy (too large, …)."""

    checkpoint: CheckpointInfo
    reused: bool
    seconds: float


@attrs.frozen
class Skipped:
    """No snapshot: `reason` says why, in words (the caller's `checkpoint_skipped`).

    `code`: ``off`` (NAVI_CHECKPOINTS=false), ``too_large`` (new content over
    NAVI_CHECKPOINT_MAX_BYTES), ``user_total`` / ``total`` (over what
    NAVI_CHECKPOINT_USER_MAX_BYTES / NAVI_CHECKPOINT_TOTAL_MAX_BYTES leave),
    ``too_many_files`` (NAVI_CHECKPOINT_MAX_FILES), ``too_slow``
    (NAVI_CHECKPOINT_MAX_SEC), ``unreadable`` (a root cannot be opened).
    """

    code: str
    reason: str
    seconds: float


Outcome = Created | Skipped


@attrs.frozen
class Change:
    """One path a restore changes: `what` is ``restored`` (content or kind), ``created``,
    ``deleted``, ``mode``, ``dir_created``, ``dir_deleted``."""

    path: str
    what: str


@attrs.frozen
class Kept:
    """A path a restore leaves as it is, and why."""

    path: str
    why: str


@attrs.frozen
class RootChanges:
    """What a restore changes in one root (counts, and the first paths of each)."""

    root: Path
    restored: int = 0
    created: int = 0
    deleted: int = 0
    modes: int = 0
    dirs_created: int = 0
    dirs_deleted: int = 0
    bytes: int = 0  # written by the restore
    changes: tuple[Change, ...] = ()  # at most `PATHS_LISTED`
    kept: tuple[Kept, ...] = ()  # at most `PATHS_LISTED`
    kept_count: int = 0
    # A selective restore (a rewind): paths both the session's calls and someone else
    # changed since (kept as they are unless conflicts are restored), and paths only
    # someone else changed (left as they are); at most `PATHS_LISTED` of each.
    conflicts: tuple[str, ...] = ()
    conflicts_count: int = 0
    others: tuple[str, ...] = ()
    others_count: int = 0

    @property
    def empty(self) -> bool:
        counts = (self.restored, self.created, self.deleted, self.modes)
        return not any(counts) and not self.dirs_created and not self.dirs_deleted


PATHS_LISTED = 200


@attrs.frozen
class Preview:
    """What restoring `checkpoint` would change, computed before anything is applied.

    `undo`: a checkpoint of the folders as they are now (taken by the preview), which a
    later restore can bring back; None when it could not be taken (`undo_skipped` says
    why: the restore then cannot be undone). `token`: pass it to `restore(confirm=…)`
    to apply exactly this (a folder changed since is refused).
    """

    checkpoint: str
    roots: tuple[RootChanges, ...]
    undo: str | None
    undo_skipped: str
    token: str
    not_covered: str = NOT_COVERED

    @property
    def empty(self) -> bool:
        return all(r.empty for r in self.roots)


CONFLICTS = ("keep", "restore")


@attrs.frozen
class Scope:
    """A selective restore (a rewind's): only what the owner's own calls changed since
    the checkpoint is put back (core/checkpoints/_marks.py); a path someone else changed
    too is a conflict, kept as it is (`conflicts` "keep") or restored ("restore");
    `roots`: which of the checkpoint's folders (None: all of them)."""

    conflicts: str = "keep"
    roots: tuple[Path, ...] | None = None

    def __attrs_post_init__(self) -> None:
        if self.conflicts not in CONFLICTS:
            raise CheckpointError(f"conflicts must be one of {', '.join(CONFLICTS)}")


@attrs.frozen
class Restored:
    """A restore that ran: what it changed (its preview), the paths it could not
    write (each with the error; the rest was restored), and its duration."""

    preview: Preview
    failed: tuple[Kept, ...]
    seconds: float
