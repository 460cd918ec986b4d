"""The tools' one containment check: a path is in a folder when it is the folder or
lies below it, part by part, so a sibling that shares a prefix is outside."""

from __future__ import annotations

from pathlib import Path

import pytest

from navi_trio.tools.private import within


@pytest.mark.parametrize(
    ("path", "folders", "inside"),
    [
        ("/a/b", ("/a/b",), True),
        ("/a/b/c/d", ("/a/b",), True),
        ("/a/bc", ("/a/b",), False),  # a shared prefix is not containment
        ("/a", ("/a/b",), False),  # the parent is outside its child
        ("/x/y", ("/a", "/x"), True),  # any of several folders
        ("/x/y", (), False),
        ("/", ("/",), True),
        ("/etc/passwd", ("/",), True),
    ],
)
def test_a_path_is_within_a_folder_when_it_is_it_or_lies_below_it(
    path: str, folders: tuple[str, ...], inside: bool
) -> None:
    assert within(Path(path), *(Path(f) for f in folders)) is inside
