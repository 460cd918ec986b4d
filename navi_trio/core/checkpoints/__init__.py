"""Checkpoints of folders: snapshot, preview, restore, keep.

The engine knows nothing of sessions or messages: it snapshots folders for an *owner*
(a string, the session id) and hands back checkpoint ids; the caller records them and
turns outcomes into events. `open_checkpoints(settings)` gives a `CheckpointEngine`
(completing a killed restore first); its methods are `snapshot`, `checkpoints`,
`preview`, `restore` (with the preview's token: `CheckpointChangedError` if the folders
moved since), `calling` (brackets an owner's writing call, so its changes are the
owner's), `changes`, `export` (a fork's copy), `prune` and `delete_all`. A preview or
restore given a `Scope` (a rewind) puts back only the owner's own changes.

`roots` are absolute real paths (one may lie inside another: each is snapshotted without
the other); `private` is the sandbox's `private_paths`: navi's own data inside a root is
never read nor restored. A restore is not cancellable once it writes: half a restore
cannot be undone safely, so it completes, and a crash during it is completed by the next
`open_checkpoints` (the journal rolls forward). What a checkpoint holds and leaves out,
and its bounds, are described in docs/pages/sessions.md.

Why a store of our own and not a shadow git repository: git keeps neither empty folders
nor permission bits beyond the exec bit, so a side manifest and a walk of our own were
needed anyway; and an incremental ``git add -A`` + ``write-tree`` + ``commit-tree`` of a
10,000-file tree took 115-165 ms on the 2-core box, against the engine's few
milliseconds with inotify (`_watch`).

Modules: `engine` (this API), `_snapshots` (taking one), `_scan`/`_state`/`_result`
(walking a root, what is remembered of it), `_watch` (inotify), `_marks` (who changed
what), `_ignore` (rules), `_objects`/`_packs` (the store), `_records` (per-owner
records), `_plan` (what a restore changes), `_apply` (the journal), `_gc`, `_locks`,
`_fsops` (fd-relative file-system calls), `_model` (results and errors).
"""

from __future__ import annotations

from navi_trio.core.checkpoints._apply import Exported as Exported
from navi_trio.core.checkpoints._apply import remove_beneath as remove_beneath
from navi_trio.core.checkpoints._diffs import ChangedFile as ChangedFile
from navi_trio.core.checkpoints._model import CONFLICTS as CONFLICTS
from navi_trio.core.checkpoints._model import NOT_COVERED as NOT_COVERED
from navi_trio.core.checkpoints._model import Change as Change
from navi_trio.core.checkpoints._model import CheckpointChangedError as CheckpointChangedError
from navi_trio.core.checkpoints._model import CheckpointDamagedError as CheckpointDamagedError
from navi_trio.core.checkpoints._model import CheckpointError as CheckpointError
from navi_trio.core.checkpoints._model import CheckpointInfo as CheckpointInfo
from navi_trio.core.checkpoints._model import Created as Created
from navi_trio.core.checkpoints._model import Kept as Kept
from navi_trio.core.checkpoints._model import LeftOut as LeftOut
from navi_trio.core.checkpoints._model import Outcome as Outcome
from navi_trio.core.checkpoints._model import Preview as Preview
from navi_trio.core.checkpoints._model import Restored as Restored
from navi_trio.core.checkpoints._model import RootChanges as RootChanges
from navi_trio.core.checkpoints._model import RootTree as RootTree
from navi_trio.core.checkpoints._model import Scope as Scope
from navi_trio.core.checkpoints._model import Skipped as Skipped
from navi_trio.core.checkpoints._model import UnknownCheckpointError as UnknownCheckpointError
from navi_trio.core.checkpoints._state import Room as Room
from navi_trio.core.checkpoints._state import size_text as size_text
from navi_trio.core.checkpoints.engine import CheckpointEngine as CheckpointEngine
from navi_trio.core.checkpoints.engine import open_checkpoints as open_checkpoints
