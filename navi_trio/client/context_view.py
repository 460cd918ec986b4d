"""The ``context`` reply as lines of text, for the chat's ``/context`` and ``navi doctor``:
the instruction files with their sizes (and how much of each reaches the model), the
skills, and each file skipped with why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def context_lines(listing: Mapping[str, Any]) -> list[str]:
    """What `listing` (a ``context`` reply, or the doctor's report of one) says."""
    lines: list[str] = []
    files = list(listing.get("files") or [])
    where = listing.get("cwd")
    head = f"instruction files for {where}" if where else "instruction files (no cwd)"
    lines.append(f"{head}: {len(files)}" if files else f"{head}: none")
    for f in files:
        size, sent = int(f.get("size", 0)), int(f.get("sent", 0))
        cut = f", cut to {sent}" if sent < size else ""
        lines.append(f"  {f.get('path')}  ({size} bytes{cut}; {f.get('origin')})")
    skills = list(listing.get("skills") or [])
    lines.append(f"skills: {len(skills)}" if skills else "skills: none")
    for s in skills:
        lines.append(f"  {s.get('name')}: {s.get('description')}  ({s.get('path')})")
    skipped = list(listing.get("skipped") or [])
    more = int(listing.get("more_skipped") or 0)
    if skipped:
        lines.append(f"skipped: {len(skipped) + more}")
    for s in skipped:
        lines.append(f"  {s.get('path')}: {s.get('why')}")
    if more:
        lines.append(f"  … and {more} more")
    return lines
