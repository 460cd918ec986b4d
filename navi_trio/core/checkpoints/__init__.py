"""Checkpoints of folders: snapshot, preview, restore, keep (issue 22's engine).

The engine knows nothing of sessions or messages: it snapshots folders for an *owner*
(a string; the caller passes the session id) and hands back checkpoint ids. The caller
records (session id, message id, checkpoint id) itself (later in the store's
checkpoints index) and turns outcomes into events.

The API (everything async, on trio)::

    async with open_checkpoints(settings) as engine:    # completes a killed restore first
        outcome = await engine.snapshot(session_id, ctx.roots(), private=private)
        # Created(checkpoint, reused, seconds) | Skipped(code, reason, seconds)
        infos = await engine.checkpoints(session_id)     # oldest first: id, created, files,
                                                         # changed, bytes, new_bytes, left_out
        preview = await engine.preview(session_id, checkpoint_id, private=private)
        # per root: restored / created / deleted / modes / dirs / bytes, kept paths and
        # why; `undo` (a checkpoint of the folders as they are now); `token`
        done = await engine.restore(session_id, checkpoint_id, private=private,
                                    confirm=preview.token)   # CheckpointChangedError if
                                                             # the folders moved since
        async with engine.calling(session_id, held_roots, private=private):
            ...                                          # a writing call: its changes are
                                                         # the owner's (`_marks`)
        # preview / restore with scope=Scope(conflicts="keep"): only the owner's own
        # changes since the checkpoint (a rewind); what others changed stays
        files, more = await engine.changes(session_id, checkpoint_id, private=private,
                                           scope=scope, max_files=50, max_file_bytes=n)
        # what a rewind with `scope` would put back, each file then and now (`_diffs`)
        made = await engine.export(session_id, checkpoint_id, root, parent, name)  # fork's
        remove_beneath(parent, name, made.ident)         # copy, and its removal (blocking)
        dropped_ids = await engine.prune(session_id)      # NAVI_CHECKPOINT_KEEP / _MAX_AGE_SEC
        await engine.delete_all(session_id)              # with the session; objects shared
                                                         # with no other checkpoint go

`roots` are absolute real paths (the session folder, the run's cwd; one may lie inside
the other: each is snapshotted without the other). `private` is
`tools.private.private_paths(settings, session_dir, config=…)`, the same value the
sandbox gets: navi's own data inside a root is never read nor restored.

How the wiring stays thin:

- **tool executor**: before the first writing call of a round, ``snapshot(...)``;
  `Created` → record the id against the round's user message and emit
  ``checkpoint_created`` (with `checkpoint.left_out` as a warning when not empty);
  `Skipped` → emit ``checkpoint_skipped`` with `reason`; the call runs either way.
  Background jobs and sub-agents call the same. A snapshot is cancellable (Stop): it
  is then abandoned and nothing of it is visible.
- **session actor, rewind files**: refuse while a run or job is active; ``preview``
  (shown to the client with `Preview.not_covered`), then ``restore(confirm=token)``.
  A restore is not cancellable once it writes (a Stop waits for it, milliseconds to
  seconds): completed, never rolled back, since undoing half a restore is itself a
  restore that can fail the same way; a crash during it is completed by the next
  `open_checkpoints` (the journal rolls forward). Before it writes (its preview scan)
  a cancel abandons it with nothing changed.
  `Preview.undo` is the checkpoint that undoes the rewind.
- **fork**: ``export`` into the new session's folder. **Delete a session**:
  ``delete_all``. At the end of a run: ``prune``.

What a checkpoint holds, per root: file contents, permission bits (``st_mode &
0o7777``) of files and folders, symlinks as links (never followed), every folder (empty
ones too). What it leaves out: `.gitignore`d paths (the root's and its sub-folders'
`.gitignore` files, git's rules), NAVI_CHECKPOINT_IGNORE names (``.git`` always: the
user's repository is never read or written), navi's own data, other file systems,
pipes and devices, and files over NAVI_CHECKPOINT_MAX_FILE_BYTES (listed in
`left_out`: the checkpoint is still made). A restore leaves all of those as they are.
Ownership and timestamps are not restored (restored files get new mtimes, as after a
``git checkout``; when the daemon runs as root, what a restore makes takes the owner of
the folder it is made in), nor a file's set-user-ID and set-group-ID bits (a restore
writes as the daemon: a setuid program of the user's would run as the daemon's account);
hard links come back as separate files.

Bounds (a snapshot over one is `Skipped`, nothing stored): new or changed content over
NAVI_CHECKPOINT_MAX_BYTES (or over the `Room` a total leaves, the caller's: a user's
checkpoints, everyone's; `stored_bytes` sums the kept ones' new content), more than
NAVI_CHECKPOINT_MAX_FILES entries, longer than NAVI_CHECKPOINT_MAX_SEC. A preview is
not bounded in time or bytes (a user asked for it): over the bytes bound it compares
without storing, and says the restore cannot be undone.

Layout under ``DATA/checkpoints/``: ``packs/`` (contents and folder listings up to
64 KiB by SHA-256, one pack per snapshot) and ``objects/`` (larger ones, one file
each), shared by every checkpoint and owner; ``owners/KEY/ID.json`` (records);
``journal/`` (restores under way); ``tmp/``; ``lock``, ``roots/*.lock``; ``gc``.

Why a store of our own and not a shadow git repository: git keeps neither empty folders
nor permission bits beyond the exec bit, so a side manifest and a walk of our own were
needed anyway; and measured on the 2-core box, an incremental ``git add -A`` +
``write-tree`` + ``commit-tree`` of a 10,000-file tree took 115-165 ms (the first one
14.7 s, zlib and one loose object per file), against the engine's few milliseconds with
inotify (`_watch`), ~100-300 ms for a full stat walk without it. Not kept across a
daemon restart: the scan cache (the first snapshot after a start reads every file
again, ~1 s for 10,000, storing nothing new).

Modules: `engine` (this API), `_snapshots` (taking one), `_scan`/`_state`/`_result`
(walking a root, what is remembered of it), `_watch` (inotify), `_marks` (who changed
what: the session's calls or someone else), `_ignore` (rules),
`_objects`/`_packs` (the store), `_records` (per-owner records), `_plan` (what a
restore changes), `_apply` (the journal), `_gc`, `_locks`, `_fsops` (fd-relative
file-system calls), `_model` (results and errors).
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
