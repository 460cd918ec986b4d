"""One run's view of its project files: the instruction files and the skills in effect,
and the files not used with the reason. `gather` reads all of it (blocking); one
`Reader` serves every run, so an unchanged file is not read again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from navi_trio.errors import RootChangedError
from navi_trio.project.files import Chain, Reader, Skipped
from navi_trio.project.instructions import Instructions, read_instructions
from navi_trio.project.skills import Skills, find_skills, skill_folders
from navi_trio.tools._beneath import Beneath
from navi_trio.tools.private import PrivatePaths, real_path
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs

SEPARATOR = "\n\n---\n\n"


def user_folder() -> Path:
    """The daemon account's own navi folder (``$XDG_CONFIG_HOME/navi``, else
    ``~/.config/navi``), as a real path."""
    return real_path(Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config") / "navi")


@attrs.frozen
class Places:
    """Where one run's project files are read from: `roots`, held folders (the run's cwd,
    and the folders above it it may read); `outside`: why a file no root holds is not read.
    """

    chain: Chain | None
    roots: tuple[Root, ...]
    private: PrivatePaths
    who: RunAs | None
    user_dir: Path
    config_dir: Path
    outside: str


@attrs.frozen
class ProjectView:
    instructions: Instructions = attrs.field(factory=Instructions)
    skills: Skills = attrs.field(factory=Skills)

    @property
    def skipped(self) -> tuple[Skipped, ...]:
        return self.instructions.skipped + self.skills.skipped

    def system_text(self, *, with_skills: bool) -> str:
        """The system message's part: the instruction files, then the skills' list
        (only for a run that has the `skill` tool)."""
        parts = [self.instructions.text, self.skills.text() if with_skills else ""]
        return SEPARATOR.join(p for p in parts if p)

    def listing(self) -> dict[str, Any]:
        """What a client is shown: the files in effect with their sizes, the skills,
        and what was skipped with why."""
        return {
            "files": [
                {"path": str(f.path), "origin": f.origin, "size": f.size, "sent": f.sent}
                for f in self.instructions.files
            ],
            "skills": [
                {
                    "name": s.name,
                    "description": s.description,
                    "path": str(s.folder),
                    "origin": s.origin,
                    "size": s.size,
                }
                for s in self.skills.found
            ],
            "skipped": [{"path": str(s.path), "why": s.why} for s in self.skipped],
        }


def gather(places: Places, reader: Reader, *, file_max: int, total_max: int) -> ProjectView:
    """The instruction files and skills at `places`. Blocking."""
    with ExitStack() as stack:
        project: Beneath | None = None
        if places.chain is not None and places.roots:
            project = Beneath(places.roots, places.private, stack, places.who)
        own: dict[Path, Beneath] = {}
        for folder in dict.fromkeys((places.user_dir, places.config_dir)):
            try:
                root = Root.open(folder, "navi's own folder")
            except RootChangedError:
                continue  # no such folder (or not one): nothing of it is read
            stack.callback(root.close)
            own[folder] = Beneath([root], PrivatePaths(()), stack, None)
        user = own.get(places.user_dir)
        instructions = read_instructions(
            places.chain,
            project,
            None if user is None else (places.user_dir, user),
            reader,
            file_max=file_max,
            total_max=total_max,
            outside=places.outside,
        )
        where: list[tuple[Path, Beneath, str]] = []
        if places.chain is not None and project is not None:
            bases: Sequence[Path] = [places.chain.folders[-1]]
            if places.chain.repo is not None:
                bases = [*bases, places.chain.repo]
            where += [(f, project, "project") for f in skill_folders(bases)]
        for folder, origin in ((places.user_dir, "user"), (places.config_dir, "config")):
            if origin == "config" and folder == places.user_dir:
                continue  # config.json in the user's folder: its skills are listed once
            if (fs := own.get(folder)) is not None:
                where.append((folder / "skills", fs, origin))
        skills = find_skills(where, reader, outside=places.outside)
    return ProjectView(instructions, skills)
