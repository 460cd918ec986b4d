"""Folders a daemon's tools work in, opened to its tool user when the suite runs as root.

A root daemon runs its tool processes as NAVI_TOOL_USER, else nobody (tools/runas.py),
and the folders they work in must be open to that user, as an admin opens a workspace.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def open_to_tools(folder: Path) -> None:
    """As root: `folder` writable by anyone, and pytest's folders above it passable."""
    if os.geteuid() != 0:
        return
    folder.chmod(0o777)
    for above in folder.parents:
        if above == Path(tempfile.gettempdir()):
            break
        above.chmod(above.stat().st_mode | 0o111)
