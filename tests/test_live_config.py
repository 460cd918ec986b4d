"""The config's files signature (what hot reload compares at every turn), read on plain
strings, covers the files the plain pathlib reading did: the config file, the prompt
files the config names, and each file of its prompts folder (a link to a file too; a
dangling link, a loop or a sub-folder is none), and it moves when any of them does."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from navi_trio.core.turn.live_config import LiveConfig, _prompt_files
from navi_trio.profiles import ConfigSource
from navi_trio.settings import REPO_ROOT


class _Builder:
    """The builder's one use here: told when the config changed."""

    def __init__(self) -> None:
        self.invalidated = 0

    def invalidate(self) -> None:
        self.invalidated += 1


def plain_signature(live: LiveConfig) -> set[tuple[str, int, int]]:
    """The signature as pathlib read it: a Path each, `Path.is_file` on the folder's."""
    cfg = live.source.current
    try:
        listed = [p for p in live.prompts_dir.iterdir() if p.is_file()]
    except OSError:
        listed = []
    out = set()
    for path in {live.source.path, *_prompt_files(cfg), *listed}:
        try:
            st = os.stat(path)
        except OSError:
            out.add((str(path), -1, -1))
        else:
            out.add((str(path), st.st_mtime_ns, st.st_size))
    return out


def _config(tmp_path: Path) -> tuple[Path, LiveConfig, _Builder]:
    folder = tmp_path / "config"
    shutil.copytree(REPO_ROOT / "config", folder)
    builder = _Builder()
    return folder, LiveConfig(ConfigSource(folder / "config.json"), builder), builder  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "layout",
    ["plain", "file_link", "dangling_link", "loop", "sub_folder", "no_folder", "folder_link"],
)
def test_the_signature_covers_the_files_the_pathlib_reading_did(
    tmp_path: Path, layout: str
) -> None:
    folder, live, _ = _config(tmp_path)
    prompts = folder / "prompts"
    (tmp_path / "outside.md").write_text("outside\n", encoding="utf-8")
    if layout == "file_link":
        (prompts / "linked.md").symlink_to(tmp_path / "outside.md")
    elif layout == "dangling_link":
        (prompts / "gone.md").symlink_to(tmp_path / "missing.md")
    elif layout == "loop":
        (prompts / "loop.md").symlink_to(prompts / "loop.md")
    elif layout == "sub_folder":
        (prompts / "sub").mkdir()
        (prompts / "sub" / "inner.md").write_text("inner\n", encoding="utf-8")
    elif layout == "no_folder":
        shutil.rmtree(prompts)
    elif layout == "folder_link":
        shutil.move(prompts, tmp_path / "real_prompts")
        prompts.symlink_to(tmp_path / "real_prompts")
    assert set(live._files_signature()) == plain_signature(live)


def test_an_edit_a_new_file_or_a_removed_one_in_the_prompts_folder_reloads(
    tmp_path: Path,
) -> None:
    folder, live, builder = _config(tmp_path)
    new = folder / "prompts" / "new.md"
    live.current()
    assert builder.invalidated == 0  # nothing changed since it was made
    for change in ("new\n", "longer text\n", None):  # added, edited (the size), removed
        if change is None:
            new.unlink()
        else:
            new.write_text(change, encoding="utf-8")
        seen = builder.invalidated
        live.current()
        assert builder.invalidated == seen + 1, change  # reloaded once
        live.current()
        assert builder.invalidated == seen + 1, change  # and not again
        assert set(live._signature) == plain_signature(live)
