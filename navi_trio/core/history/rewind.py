"""Rewind a session's conversation, its files or both to just before a user message, and
undo a rewind.

    preview = await rewinder.preview(sid, Target(to=message_id, restore="both"))
    event = await rewinder.apply(sid, Target(to=message_id, restore="both"), preview.token)

Two steps, always: `preview` says what would change and changes nothing; `apply` with
its token does it, or refuses (`ChangedError`) when the history or the folders moved
since. A **chat** rewind makes the display history and the LLM context what they were
just before the message; a **files** rewind puts back what the session's own calls
changed since that message's checkpoint, through the engine's journalled restore (what
someone else changed stays; a path both changed is a conflict, kept unless the target
says ``conflicts="restore"``). Only folders the asker may use now are touched
(`Asker`); one left out is named in the preview.

Nothing is lost: every rewind leaves a branch (what it cut off, the context as it was,
the checkpoint of the files as they were), and bringing a branch back is the undo. The
history rewrite and its branch are one store transaction. The caller runs both steps
in the session actor's exclusive section; `apply` takes the session's lease too and
refuses while a background job of the session runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from navi_trio.core.checkpoints import (
    CONFLICTS,
    CheckpointChangedError,
    CheckpointEngine,
    CheckpointError,
    Preview,
    Restored,
    Scope,
    UnknownCheckpointError,
)
from navi_trio.core.history.rewind_points import (
    BRANCH_SCOPE,
    BRANCHES_MAX,
    RESTORES,
    Message,
    branches,
    context_before,
    files_checkpoint,
    find_point,
    get_branch,
    new_branch_id,
)
from navi_trio.core.turn import CwdCheck, SessionLeases, message_id
from navi_trio.errors import (
    ChangedError,
    NotFoundError,
    ProtocolError,
    RequestError,
    RestoreError,
    RootChangedError,
    SessionBusyError,
)
from navi_trio.events import Rewound
from navi_trio.profiles import ConfigSource, NaviConfig
from navi_trio.settings import Settings
from navi_trio.store.methods import SessionStore
from navi_trio.tools.private import PrivatePaths, private_paths, real_path, within

FAILED_LISTED = 20
NO_FILES = "no file was changed by navi since that message: the files stay as they are"


@attrs.frozen
class Target:
    """Rewind to just before user message `to`, or bring back branch `branch`; a file
    both the session's calls and someone else changed since is kept as it is
    (`conflicts` "keep") or restored too ("restore")."""

    restore: str = "both"  # chat | files | both
    to: str | None = None
    branch: str | None = None
    conflicts: str = "keep"

    def __attrs_post_init__(self) -> None:
        if self.restore not in RESTORES:
            raise ProtocolError(f"restore must be one of {', '.join(RESTORES)}")
        if (self.to is None) == (self.branch is None):
            raise ProtocolError("a rewind names either a message (to) or a branch, not both")
        if self.conflicts not in CONFLICTS:
            raise ProtocolError(f"conflicts must be one of {', '.join(CONFLICTS)}")

    @property
    def chat(self) -> bool:
        return self.restore in ("chat", "both")

    @property
    def files(self) -> bool:
        return self.restore in ("files", "both")


@attrs.frozen
class Asker:
    """Who asks for a rewind or a fork: the folders it acts on are checked against their
    rights now, as a message's cwd is."""

    user_id: str
    role: str


@attrs.frozen
class RewindPreview:
    """What `apply` would do. `files` is the engine's preview (None: no files part,
    `files_note` says why); `text` the user message rewound to (to offer it again)."""

    session_id: str
    target: Target
    messages_removed: int
    messages_restored: int
    text: str
    files: Preview | None
    files_note: str
    token: str
    left_out: tuple[tuple[str, str], ...] = ()  # (folder, why) not acted on


@attrs.frozen
class _Plan:
    messages: list[Message]  # the display history now
    context: list[Message]  # the LLM context now
    keep: int | None  # display messages kept; None: the chat is not touched
    tail: list[Message]  # appended after them (a branch brought back)
    new_context: list[Message]
    checkpoint: str | None  # the files' target
    files_note: str
    point: str  # the message rewound to (a branch's own, for an undo)
    branch: dict[str, Any] | None  # the branch brought back
    digest: str


@attrs.define(kw_only=True, eq=False)
class Rewinder:
    """Rewinds of one runtime's sessions (see the module docstring)."""

    settings: Settings
    store: SessionStore
    engine: CheckpointEngine
    leases: SessionLeases
    config: Callable[[], NaviConfig]
    forget: Callable[[str], None]
    jobs: Callable[[str], int]
    # The config with its pinned workspace roots (the asker's check).
    source: ConfigSource | None = None

    def private(self, session_id: str) -> PrivatePaths:
        """What no checkpoint reads or restores: navi's own data (as the sandbox masks)."""
        folder = self.settings.session_dir(session_id)
        return private_paths(self.settings, folder, config=self.config())

    async def usable(
        self, session_id: str, folders: Sequence[Path], asker: Asker | None
    ) -> tuple[tuple[Path, ...], tuple[tuple[str, str], ...]]:
        """The folders of `folders` the asker may use now, and (folder, why) for each
        left out. The session's own folder (and what is in it) is always theirs to use;
        any other is checked as a message's cwd would be (a missing one: its parent).
        No asker (the person at the shell, who owns the data folder): all of them."""
        if asker is None or self.source is None:
            return tuple(folders), ()
        own = await trio.to_thread.run_sync(real_path, self.settings.session_dir(session_id))
        check = CwdCheck(
            user_id=asker.user_id,
            role=asker.role,
            session_id=session_id,
            settings=self.settings,
            config=self.source,
            store=self.store,
        )
        ok: list[Path] = []
        left: list[tuple[str, str]] = []
        for folder in folders:
            if within(folder, own):
                ok.append(folder)
                continue
            there = await trio.to_thread.run_sync(os.path.lexists, folder)
            try:
                root = await check.open(str(folder if there else folder.parent), resolve=False)
            except (RequestError, RootChangedError) as exc:
                left.append((str(folder), f"you may not use this folder now: {exc}"))
                continue
            root.close()
            ok.append(folder)
        return tuple(ok), tuple(left)

    async def history(self, session_id: str) -> tuple[list[Message], list[Message]]:
        if await self.store.get_session(session_id) is None:
            raise NotFoundError(f"no session {session_id!r}")
        messages = await self.store.load_messages(session_id)
        return messages, await self.store.load_context(session_id)

    async def preview(
        self, session_id: str, target: Target, asker: Asker | None = None
    ) -> RewindPreview:
        """What the rewind would change; nothing is changed (a checkpoint of the folders
        as they are is taken: the restore's undo)."""
        plan = await self._plan(session_id, target)
        files: Preview | None = None
        scope, left_out = await self._scope(session_id, plan, target, asker)
        note = plan.files_note
        if plan.checkpoint is not None and scope is None:
            note = _all_left_out(left_out)
        elif plan.checkpoint is not None:
            with engine_errors():
                files = await self.engine.preview(
                    session_id, plan.checkpoint, private=self.private(session_id), scope=scope
                )
        removed = 0 if plan.keep is None else len(plan.messages) - plan.keep
        text = ""
        if target.to is not None:
            at = find_point(plan.messages, target.to, session_id)
            content = plan.messages[at].get("content")
            text = content if isinstance(content, str) else ""
        return RewindPreview(
            session_id=session_id,
            target=target,
            messages_removed=removed,
            messages_restored=len(plan.tail),
            text=text,
            files=files,
            files_note=note,
            token=f"{plan.digest}.{files.token if files is not None else ''}",
            left_out=left_out,
        )

    async def _scope(
        self, session_id: str, plan: _Plan, target: Target, asker: Asker | None
    ) -> tuple[Scope | None, tuple[tuple[str, str], ...]]:
        """What a files rewind may restore: the folders of its checkpoint the asker may
        use now (None: none of them), and the ones left out."""
        if plan.checkpoint is None:
            return None, ()
        with engine_errors():
            info = await self.engine.get(session_id, plan.checkpoint)
        roots, left_out = await self.usable(session_id, info.paths, asker)
        if not roots:
            return None, left_out
        return Scope(conflicts=target.conflicts, roots=roots), left_out

    async def apply(
        self,
        session_id: str,
        target: Target,
        confirm: str,
        asker: Asker | None = None,
        *,
        publish: Callable[[Rewound], None] | None = None,
    ) -> Rewound:
        """Do what the preview with token `confirm` showed; the `rewound` event, given to
        `publish` while the lease is still held (a daemon that runs the session next has
        it before its run)."""
        digest, _, files_token = confirm.partition(".")
        running = self.jobs(session_id)
        if running:
            raise SessionBusyError(
                f"session {session_id!r} has {running} background task(s) running: cancel "
                "them first (tasks cancel, /tasks), then rewind",
                session_id=session_id,
            )
        async with self.leases.hold(session_id):
            plan = await self._plan(session_id, target)
            scope, _ = await self._scope(session_id, plan, target, asker)
            if digest != plan.digest or (scope is not None) != bool(files_token):
                raise ChangedError(
                    "the session changed after the preview: look at a new preview first",
                    session_id=session_id,
                )
            restored: Restored | None = None
            if plan.checkpoint is not None and scope is not None:
                with engine_errors():
                    restored = await self.engine.restore(
                        session_id,
                        plan.checkpoint,
                        private=self.private(session_id),
                        confirm=files_token,
                        scope=scope,
                    )
            undo = await self._save(session_id, target, plan, restored)
            self.forget(session_id)
            event = _event(target, plan, restored, undo)
            if publish is not None:
                publish(event)
        return event

    async def _save(
        self, session_id: str, target: Target, plan: _Plan, restored: Restored | None
    ) -> str:
        """The history rewrite and the branch that undoes it, in one transaction."""
        undo_files = restored.preview.undo if restored is not None else None
        chat = plan.keep is not None
        if not chat and undo_files is None:
            return ""  # nothing was changed that a branch could bring back
        bid = new_branch_id()
        cut = plan.messages[plan.keep :] if plan.keep is not None else []
        branch = {
            "id": bid,
            "created_at": time.time(),
            "restore": "both" if chat and undo_files else "chat" if chat else "files",
            "at": plan.point,
            "position": plan.keep,
            "parent": _parent(plan.messages, plan.keep),
            "messages": cut,
            "context": plan.context if chat else None,
            "checkpoint": undo_files,
        }
        drop = []
        if plan.branch is not None:
            drop.append((BRANCH_SCOPE, f"{session_id}:{plan.branch['id']}"))
        old = [
            b
            for b in await branches(self.store, session_id)
            if plan.branch is None or b.get("id") != plan.branch["id"]
        ]
        for stale in old[: max(0, len(old) - BRANCHES_MAX + 1)]:
            drop.append((BRANCH_SCOPE, f"{session_id}:{stale.get('id')}"))
        saved = [(BRANCH_SCOPE, f"{session_id}:{bid}", branch)]
        try:
            if plan.keep is None:
                for scope, key in drop:
                    await self.store.kv_delete(scope, key)
                await self.store.kv_set(*saved[0])
            else:
                await self.store.rewrite_history(
                    session_id,
                    keep=plan.keep,
                    messages=plan.tail,
                    context=plan.new_context,
                    kv_set=saved,
                    kv_delete=drop,
                )
        except Exception as exc:
            if restored is None:
                raise
            where = f"; checkpoint {undo_files} holds them as they were" if undo_files else ""
            raise RestoreError(
                f"the files were restored but the conversation could not be: {exc}{where}",
                session_id=session_id,
            ) from exc
        return bid

    async def _plan(self, session_id: str, target: Target) -> _Plan:
        messages, context = await self.history(session_id)
        if target.branch is not None:
            return await self._plan_branch(session_id, target, messages, context)
        assert target.to is not None
        index = find_point(messages, target.to, session_id)
        checkpoint, note = None, ""
        if target.files:
            since = float(messages[index].get("created_at") or 0.0)
            info = await files_checkpoint(
                self.store, await self.engine.checkpoints(session_id), session_id, since
            )
            checkpoint, note = (info.id, "") if info is not None else (None, NO_FILES)
        keep = index if target.chat else None
        new_context = context_before(messages, context, index) if target.chat else context
        return _Plan(
            messages,
            context,
            keep,
            [],
            new_context,
            checkpoint,
            note,
            target.to,
            None,
            _digest(target, messages, context, None),
        )

    async def _plan_branch(
        self, session_id: str, target: Target, messages: list[Message], context: list[Message]
    ) -> _Plan:
        assert target.branch is not None
        branch = await get_branch(self.store, session_id, target.branch)
        keep: int | None = None
        tail: list[Message] = []
        new_context = context
        position = branch.get("position")
        if target.chat and isinstance(position, int):
            if position > len(messages) or _parent(messages, position) != branch.get("parent"):
                raise ChangedError(
                    f"the conversation before branch {target.branch} changed since it was "
                    "cut (a rewind went further back): bring back the later branch first",
                    session_id=session_id,
                )
            keep, tail = position, list(branch.get("messages") or [])
            new_context = list(branch.get("context") or [])
        checkpoint = branch.get("checkpoint") if target.files else None
        note = "" if checkpoint or not target.files else "that branch holds no files"
        return _Plan(
            messages,
            context,
            keep,
            tail,
            new_context,
            checkpoint,
            note,
            str(branch.get("at") or ""),
            branch,
            _digest(target, messages, context, branch),
        )


def _all_left_out(left_out: Sequence[tuple[str, str]]) -> str:
    shown = "; ".join(f"{folder} ({why})" for folder, why in left_out)
    return f"no folder of that checkpoint may be restored by you now: {shown}"


def _parent(messages: Sequence[Message], position: int | None) -> str | None:
    """The id of the message just before a cut at `position` (None at the start)."""
    if not position:
        return None
    return message_id(messages[position - 1], position - 1)


def _digest(
    target: Target,
    messages: Sequence[Message],
    context: Sequence[Message],
    branch: dict[str, Any] | None,
) -> str:
    """Names the history a preview saw: a message or context entry added or changed
    since makes the apply refuse."""
    seen = [
        attrs.astuple(target),
        [message_id(m, i) for i, m in enumerate(messages)],
        [m.get("created_at") for m in context],
        None if branch is None else [branch.get("id"), branch.get("created_at")],
    ]
    return hashlib.sha256(json.dumps(seen, default=str).encode()).hexdigest()


def _event(target: Target, plan: _Plan, restored: Restored | None, undo: str) -> Rewound:
    files: dict[str, Any] = {}
    failed: tuple[str, ...] = ()
    if restored is not None:
        keys = ("restored", "created", "deleted", "modes", "dirs_created", "dirs_deleted")
        files = {k: sum(getattr(r, k) for r in restored.preview.roots) for k in keys}
        files["bytes"] = sum(r.bytes for r in restored.preview.roots)
        failed = tuple(f"{k.path}: {k.why}" for k in restored.failed[:FAILED_LISTED])
    return Rewound(
        restore=target.restore,
        to=target.to or "",
        branch=target.branch or "",
        undo=undo,
        messages_removed=0 if plan.keep is None else len(plan.messages) - plan.keep,
        messages_restored=len(plan.tail),
        files=files,
        failed=failed,
    )


@contextmanager
def engine_errors() -> Iterator[None]:
    """The engine's errors in the client's terms (wire codes)."""
    try:
        yield
    except CheckpointChangedError as exc:
        raise ChangedError(str(exc)) from None
    except UnknownCheckpointError as exc:
        raise NotFoundError(
            f"{exc}: the files of that time are no longer kept; rewind the chat only"
        ) from None
    except CheckpointError as exc:
        raise RestoreError(str(exc)) from None
