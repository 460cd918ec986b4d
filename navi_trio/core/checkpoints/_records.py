"""Checkpoint records: ``owners/KEY/ID.json``, one small file per checkpoint.

KEY is the SHA-256 of the owner (the caller's session id), so any owner string is a
safe folder name; the record repeats the owner in full. The owner's marks (who changed
what, `_marks`) live beside its records, in ``marks.jsonl``. A record is written whole
(temp file and rename): a checkpoint is visible complete or not at all, and its objects
were all stored before it. IDs are 24 hex digits, the creation time in nanoseconds then
4 random bytes, so they sort in creation order; one given by a caller is checked
against that shape before it names a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from navi_trio.core.checkpoints._model import (
    CheckpointInfo,
    LeftOut,
    RootTree,
    UnknownCheckpointError,
)
from navi_trio.core.checkpoints._objects import write_atomic

_ID = re.compile(r"[0-9a-f]{24}")


def new_checkpoint_id() -> str:
    return f"{time.time_ns():016x}{secrets.token_hex(4)}"


def _to_json(info: CheckpointInfo) -> dict[str, Any]:
    return {
        "v": 1,
        "id": info.id,
        "owner": info.owner,
        "created": info.created,
        "label": info.label,
        "roots": [{"path": str(r.path), "tree": r.tree, "mode": r.mode} for r in info.roots],
        "files": info.files,
        "dirs": info.dirs,
        "bytes": info.bytes,
        "new_bytes": info.new_bytes,
        "changed": info.changed,
        "left_out": [[str(x.root), x.path, x.size, x.reason] for x in info.left_out],
    }


def _from_json(data: dict[str, Any]) -> CheckpointInfo:
    return CheckpointInfo(
        id=str(data["id"]),
        owner=str(data["owner"]),
        created=float(data["created"]),
        label=str(data["label"]),
        roots=tuple(
            RootTree(Path(r["path"]), str(r["tree"]), int(r["mode"])) for r in data["roots"]
        ),
        files=int(data["files"]),
        dirs=int(data["dirs"]),
        bytes=int(data["bytes"]),
        new_bytes=int(data["new_bytes"]),
        changed=int(data["changed"]),
        left_out=tuple(LeftOut(Path(r), p, int(s), str(w)) for r, p, s, w in data["left_out"]),
    )


class Records:
    def __init__(self, folder: Path) -> None:
        self.owners = folder / "owners"
        # An owner folder's new content summed, as of its change time (a record added
        # or removed changes it): a total is a stat per owner, not a read of each record.
        self._sums: dict[str, tuple[int, int]] = {}

    def prepare(self) -> None:
        self.owners.mkdir(parents=True, exist_ok=True)

    def folder_of(self, owner: str) -> Path:
        """The owner's folder (its records, and its marks: `_marks`)."""
        return self.owners / hashlib.sha256(owner.encode("utf-8", "surrogatepass")).hexdigest()[:32]

    def latest_id(self, owner: str) -> str:
        """The id of the owner's newest checkpoint ("" when none)."""
        ids = self.ids(owner)
        return ids[-1] if ids else ""

    def write(self, info: CheckpointInfo) -> None:
        folder = self.folder_of(info.owner)
        folder.mkdir(exist_ok=True)
        write_atomic(folder / f"{info.id}.json", json.dumps(_to_json(info)).encode())

    def get(self, owner: str, checkpoint_id: str) -> CheckpointInfo:
        if not isinstance(checkpoint_id, str) or not _ID.fullmatch(checkpoint_id):
            raise UnknownCheckpointError(f"{checkpoint_id!r} is not a checkpoint id")
        info = self._read(self.folder_of(owner) / f"{checkpoint_id}.json")
        if info is None or info.owner != owner:
            raise UnknownCheckpointError(
                f"no checkpoint {checkpoint_id} for {owner} (pruned, deleted or never made)"
            )
        return info

    def _read(self, path: Path) -> CheckpointInfo | None:
        try:
            return _from_json(json.loads(path.read_bytes()))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # damaged: treated as absent (garbage collection ignores it)

    def ids(self, owner: str) -> list[str]:
        try:
            names = os.listdir(self.folder_of(owner))
        except FileNotFoundError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json") and _ID.fullmatch(n[:-5]))

    def of(self, owner: str) -> list[CheckpointInfo]:
        """The owner's checkpoints, oldest first."""
        folder = self.folder_of(owner)
        found = (self._read(folder / f"{i}.json") for i in self.ids(owner))
        return [info for info in found if info is not None and info.owner == owner]

    def latest(self, owner: str) -> CheckpointInfo | None:
        for checkpoint_id in reversed(self.ids(owner)):
            info = self._read(self.folder_of(owner) / f"{checkpoint_id}.json")
            if info is not None and info.owner == owner:
                return info
        return None

    def delete(self, owner: str, ids: list[str]) -> None:
        folder = self.folder_of(owner)
        for checkpoint_id in ids:
            (folder / f"{checkpoint_id}.json").unlink(missing_ok=True)

    def delete_owner(self, owner: str) -> int:
        count = len(self.ids(owner))
        shutil.rmtree(self.folder_of(owner), ignore_errors=True)
        return count

    def stored_bytes(self, owners: Sequence[str] | None = None) -> int:
        """The `new_bytes` of every kept checkpoint of `owners` (None: every owner's)."""
        if owners is None:
            try:
                folders = [Path(e.path) for e in os.scandir(self.owners) if e.is_dir()]
            except FileNotFoundError:
                return 0
        else:
            folders = [self.folder_of(o) for o in dict.fromkeys(owners)]
        return sum(self._sum(folder) for folder in folders)

    def _sum(self, folder: Path) -> int:
        try:
            st = os.stat(folder)
        except FileNotFoundError:
            self._sums.pop(folder.name, None)
            return 0
        stamp = st.st_mtime_ns ^ st.st_ino
        cached = self._sums.get(folder.name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        total = 0
        for name in os.listdir(folder):
            if name.endswith(".json") and _ID.fullmatch(name[:-5]):
                info = self._read(folder / name)
                total += info.new_bytes if info is not None else 0
        self._sums[folder.name] = (stamp, total)
        return total

    def all_trees(self) -> set[str]:
        """The root listing of every checkpoint of every owner."""
        out: set[str] = set()
        try:
            folders = list(os.scandir(self.owners))
        except FileNotFoundError:
            return out
        for folder in folders:
            for name in os.listdir(folder.path):
                if name.endswith(".json"):
                    info = self._read(Path(folder.path) / name)
                    if info is not None:
                        out |= {r.tree for r in info.roots}
        return out
