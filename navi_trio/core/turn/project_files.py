"""A run's project files: which folders it may read them from, and reading them.

The folders above the run's cwd, up to the repository root, are read only when the
sender could have made each its cwd (the same `CwdCheck`), each held for the read. A
file in a folder that fails is not read, and a ``project_file_skipped`` warning says so.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import trio

from navi_trio.core.turn.turn_state import LoopParts, Turn
from navi_trio.core.turn.workspace import SETTING, CwdCheck
from navi_trio.errors import RequestError, RootChangedError
from navi_trio.events import WarningEvent
from navi_trio.project import Places, ProjectView, Reader, folder_chain, gather, user_folder
from navi_trio.settings import Settings
from navi_trio.tools.private import PrivatePaths, private_paths, real_path
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import run_as

SKIPPED_CODE = "project_file_skipped"


def outside_why(role: str) -> str:
    return (
        f"outside the folders this run may read (its cwd, and the folders above it that "
        f"a {role} may work in: {SETTING} in config.json); not read"
    )


async def project_view(
    settings: Settings,
    reader: Reader,
    *,
    cwd: Root | None,
    check: CwdCheck | None,
    session_dir: Path | None = None,
    private: PrivatePaths | None = None,
) -> ProjectView:
    """The instruction files and skills for a run in the held `cwd` (None: the run has
    none, only navi's own folders count), the folders above it held when `check`
    passes them. `private`: the paths not gathered, when the caller has them already
    (else those of `settings` with `session_dir` visible)."""
    chain = None
    parents: list[Root] = []
    try:
        if cwd is not None:
            home = await trio.to_thread.run_sync(real_path, Path.home())
            chain = await trio.to_thread.run_sync(folder_chain, cwd.path, home)
            for folder in chain.folders[:-1]:
                if check is None:
                    break
                try:
                    parents.append(await check.open(str(folder), resolve=False))
                except (RequestError, RootChangedError):
                    continue  # not a folder the sender may read: its files are skipped
        places = Places(
            chain,
            () if cwd is None else (cwd, *parents),
            private_paths(settings, session_dir) if private is None else private,
            run_as(settings.tool_user),
            user_folder(),
            real_path(settings.config_path).parent,
            outside_why("user" if check is None else check.role),
        )
        read = partial(
            gather,
            places,
            reader,
            file_max=settings.instructions_file_max_bytes,
            total_max=settings.instructions_total_max_bytes,
        )
        return await trio.to_thread.run_sync(read)
    finally:
        for root in parents:
            root.close()


async def read_project(parts: LoopParts, turn: Turn) -> ProjectView:
    """The project files of `turn`'s folders; what was skipped goes to its notices (a
    sub-agent's are its parent's, already told)."""
    roots = turn.roots
    cwd = roots.cwd if roots is not None and roots.error is None else None
    check = CwdCheck(
        user_id=turn.user_id,
        role=turn.user_role,
        session_id=turn.todo_session(),
        settings=parts.settings,
        config=parts.config.source,
        store=parts.store,
    )
    view = await project_view(
        parts.settings,
        parts.project_files,
        cwd=cwd,
        check=check,
        private=turn.private_paths(parts.settings),
    )
    if not turn.subagent:
        for skipped in view.skipped:
            turn.emit(WarningEvent(message=skipped.line(), code=SKIPPED_CODE))
    return view


def project_text(turn: Turn) -> str:
    """The system message's part for `turn`: its instruction files, and the skills'
    list when it has the `skill` tool."""
    if turn.project is None:
        return ""
    return turn.project.system_text(with_skills="skill" in turn.tool_names())
