"""Fork a session: a new session with the history and context up to a user message, the
same profile and mode, and (optionally) a copy of its files as of that message.

    event = await forker.fork(source_id, new_row.id, at=message_id, files=True)

`at` names a user message: the new session holds what a rewind to it would leave;
without `at`, the whole session. The caller makes the new session's row (and checks the
user's session limit); the fork fills it: profile, ``meta`` (``forked_from``,
``forked_at``, ``mode``), display history and context. It holds the source's lease
meanwhile, as a rewind does: no daemon runs the source while it is copied.

With `files`, the writable folders are copied as the checkpoint of `at` holds them (the
folders as they are now when no checkpoint came after it): the session folder into the
new session's, the working folder into `folder` (default ``workspace`` inside the new
session's folder). Each copy appears whole or not at all, and only folders the asker may
use now are copied (one left out is named in the `forked` event).

A fork that fails part way (or is cancelled) leaves nothing: the new session and its
folders are removed again, each copy beneath its parent folder held open (`NewFolder`),
never by its path: a parent swapped for a link meanwhile leads nowhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from navi_trio.core.checkpoints import (
    CheckpointError,
    CheckpointInfo,
    Created,
    remove_beneath,
)
from navi_trio.core.history.rewind import Asker, Rewinder, engine_errors
from navi_trio.core.history.rewind_points import (
    Message,
    context_before,
    files_checkpoint,
    find_point,
)
from navi_trio.errors import RestoreError, RootChangedError
from navi_trio.events import Forked
from navi_trio.tools.private import real_path, within
from navi_trio.tools.roots import Root, session_folder
from navi_trio.tools.runas import session_owner

log = logging.getLogger(__name__)

WORKSPACE = "workspace"
PARENT = "the folder of a fork's copy"


@attrs.frozen
class NewFolder:
    """A folder to make: `name` in the folder `parent`, held open since it was checked
    (its holder closes it)."""

    parent: Root
    name: str

    @property
    def path(self) -> Path:
        return self.parent.path / self.name

    @classmethod
    def hold(cls, path: Path) -> NewFolder:
        """The new folder at the real path `path`, its parent walked from ``/`` without
        following a symlink (blocking; `RootChangedError` when it cannot be held)."""
        return cls(Root.open(path.parent, PARENT), path.name)


@attrs.frozen
class _Made:
    """A copy a fork made: where (its parent held), and what it is (its identity)."""

    into: NewFolder
    ident: tuple[int, int]


class Forker:
    def __init__(self, rewinder: Rewinder) -> None:
        self.rewinder = rewinder
        self.store = rewinder.store
        self.settings = rewinder.settings

    async def fork(
        self,
        source: str,
        new_id: str,
        *,
        at: str | None = None,
        files: bool = False,
        folder: Path | NewFolder | None = None,
        asker: Asker | None = None,
        publish: Callable[[Forked], object] | None = None,
    ) -> Forked:
        """Fill `new_id` from `source` under the source's lease, as a rewind is: refused
        (`SessionBusyError`) while another daemon runs it, as while a run is active here,
        so the copy never holds half a turn; the `forked` event is given to `publish`
        before the lease is let go, so a daemon that runs the source next has it first."""
        async with self.rewinder.leases.hold(source):
            event = await self._fork(source, new_id, at, files, folder, asker)
            if publish is not None:
                publish(event)
        return event

    async def _fork(
        self,
        source: str,
        new_id: str,
        at: str | None,
        files: bool,
        folder: Path | NewFolder | None,
        asker: Asker | None,
    ) -> Forked:
        messages, context = await self.rewinder.history(source)
        row = await self.store.get_session(source)
        assert row is not None  # `history` found it
        history, new_context, since = messages, context, None
        if at is not None:
            index = find_point(messages, at, source)
            history = messages[:index]
            new_context = context_before(messages, context, index)
            since = float(messages[index].get("created_at") or 0.0)
        made: list[_Made] = []
        left_out: tuple[tuple[str, str], ...] = ()
        try:
            copy = None
            if files:
                copy, left_out = await self._files(
                    source, new_id, since, folder, made, messages, asker, owner=row.user_id
                )
            meta: dict[str, Any] = {"forked_from": source, "forked_at": at}
            mode = _mode(history) or row.meta.get("mode")
            if mode:
                meta["mode"] = mode
            # The source's title (its first message's, or the name it was given) when the
            # fork keeps that message; else the fork's own first message will give one.
            title = row.title if history else None
            await self.store.update_session(
                new_id, profile_id=row.profile_id, title=title, meta=meta
            )
            await self.store.append(new_id, messages=history, context=new_context)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.discard(new_id, made)
            raise
        finally:
            for one in made:
                one.into.parent.close()
        return Forked(
            new_session_id=new_id,
            at=at or "",
            messages=len(history),
            folder=None if copy is None else str(copy),
            left_out=tuple(f"{folder}: {why}" for folder, why in left_out),
        )

    async def _files(
        self,
        source: str,
        new_id: str,
        since: float | None,
        folder: Path | NewFolder | None,
        made: list[_Made],
        messages: list[Message],
        asker: Asker | None,
        *,
        owner: str,
    ) -> tuple[Path | None, tuple[tuple[str, str], ...]]:
        """Copy the checkpoint's folders the asker may use into the fork's (each one
        made goes into `made`, its parent held); the copy of the working folder, and
        the folders left out."""
        info, left_out = await self._checkpoint(source, since, messages, asker, owner)
        usable, more = await self.rewinder.usable(source, info.paths, asker)
        left_out += more
        src = await trio.to_thread.run_sync(real_path, self.settings.session_dir(source))
        new_dir = await trio.to_thread.run_sync(self._sessions_folder, new_id)
        copy: Path | None = None
        # The session folder first: a folder of the run inside it goes to its place in it.
        for root in sorted(usable, key=lambda p: p != src):
            uid = None  # the owner of the folder it goes in
            if root == src:
                into = await self._hold(new_dir)
                uid = session_owner(self.settings.tool_user)  # as a run makes it
            elif within(root, src):
                into = await self._hold(new_dir / root.relative_to(src))
            elif isinstance(folder, NewFolder):
                into = NewFolder(await trio.to_thread.run_sync(folder.parent.dup), folder.name)
                copy = into.path
            else:
                dest = folder
                if dest is None:
                    dest = await trio.to_thread.run_sync(_free, new_dir / WORKSPACE)
                into = await self._hold(dest)
                copy = into.path
            try:
                with engine_errors():
                    exported = await self.rewinder.engine.export(
                        source, info.id, root, into.parent, into.name, uid=uid
                    )
            except BaseException:
                into.parent.close()
                raise
            made.append(_Made(into, exported.ident))
        return copy, left_out

    def _sessions_folder(self, new_id: str) -> Path:
        """The real path of the new session's folder; the sessions folder made."""
        new_dir = self.settings.session_dir(new_id)
        new_dir.parent.mkdir(parents=True, exist_ok=True)
        return real_path(new_dir.parent) / new_dir.name

    async def _hold(self, dest: Path) -> NewFolder:
        try:
            return await trio.to_thread.run_sync(NewFolder.hold, dest)
        except RootChangedError as exc:
            raise RestoreError(str(exc)) from None

    async def _checkpoint(
        self,
        source: str,
        since: float | None,
        messages: list[Message],
        asker: Asker | None,
        owner: str,
    ) -> tuple[CheckpointInfo, tuple[tuple[str, str], ...]]:
        """The source's checkpoint at `since`, or one taken now in its `owner`'s namespace
        of the folders the asker may use (and those left out)."""
        engine = self.rewinder.engine
        if since is not None:
            infos = await engine.checkpoints(source)
            info = await files_checkpoint(self.store, infos, source, since)
            if info is not None:
                return info, ()
        found = await trio.to_thread.run_sync(self._roots_now, source, messages)
        # A folder the asker may not use is never read, not even into a checkpoint.
        roots, left_out = await self.rewinder.usable(source, found, asker)
        try:
            outcome = await engine.snapshot(
                source,
                roots,
                private=self.rewinder.private(source),
                label="for a fork",
                namespace=owner,
            )
        except CheckpointError as exc:
            raise RestoreError(f"the folders could not be copied: {exc}") from None
        if not isinstance(outcome, Created):
            raise RestoreError(f"the folders could not be copied: {outcome.reason}")
        return outcome.checkpoint, left_out

    def _roots_now(self, source: str, messages: list[Message]) -> list[Path]:
        """The session folder and the working folder of its newest message that had one.

        Not resolved again: a message's cwd is the real path it was checked at, and the
        snapshot walks each without following a symlink (one swapped in since is refused,
        never copied from). A session folder not made yet is made as a run makes it
        (0700, its tool user's)."""
        sessions = real_path(self.settings.data_dir) / "sessions"
        with session_folder(sessions / source, session_owner(self.settings.tool_user)):
            pass
        roots = [sessions / source]
        for message in reversed(_user_messages(messages)):
            cwd = message.get("cwd")
            if isinstance(cwd, str) and os.path.lexists(cwd):
                if Path(cwd) not in roots:
                    roots.append(Path(cwd))
                break
        return roots

    async def discard(self, new_id: str, made: list[_Made]) -> None:
        """Remove a fork that failed: its session and the folders made for it, each
        beneath the parent it was made in (held since), never by its path."""
        try:
            await self.store.delete_session(new_id)
        finally:
            for one in reversed(made):
                await trio.to_thread.run_sync(_remove, one.into, one.ident)
            await trio.to_thread.run_sync(self._remove_session_folder, new_id)

    def _remove_session_folder(self, new_id: str) -> None:
        """The new session's folder, when a run made it meanwhile (its parent walked
        without following a symlink)."""
        new_dir = self.settings.session_dir(new_id)
        try:
            into = NewFolder.hold(real_path(new_dir.parent) / new_dir.name)
        except (RootChangedError, OSError):
            return  # no sessions folder: nothing was made
        with into.parent:
            try:
                st = os.stat(into.name, dir_fd=into.parent.fd, follow_symlinks=False)
            except OSError:
                return
            _remove(into, (st.st_dev, st.st_ino))


def _remove(into: NewFolder, ident: tuple[int, int]) -> None:
    if not remove_beneath(into.parent, into.name, ident):
        log.warning("a fork's copy %s was not removed: gone, or another folder now", into.path)


def _user_messages(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.get("role") == "user"]


def _mode(history: list[Message]) -> str | None:
    for message in reversed(_user_messages(history)):
        mode = message.get("mode")
        if isinstance(mode, str):
            return mode
    return None


def _free(path: Path) -> Path:
    """`path`, or `path-2`, `path-3` … when it exists."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate
