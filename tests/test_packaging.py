"""Packaging: config/ and manuals/ ship inside the wheel (issue 7, item 15).

pyproject.toml maps the top-level folders to ``navi_trio._config`` and
``navi_trio._manuals``; `settings.shipped_dir` finds them there in an installed wheel and
falls back to the top-level folders in a source checkout. These tests check the
declarations against the tree (a module folder or a data file left out of the wheel);
``.ci/run`` builds the wheel, installs it outside the checkout and runs ``navi`` there.
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path
from typing import Any

import pytest

from navi_trio.settings import REPO_ROOT, Settings, default_config_path, shipped_dir

SETUPTOOLS: dict[str, Any] = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"][
    "setuptools"
]
DATA = {"navi_trio._config": "config", "navi_trio._manuals": "manuals"}


def _folders(root: Path) -> list[Path]:
    return [root, *(p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__")]


def test_the_package_list_names_every_module_folder_and_data_folder() -> None:
    code = {
        ".".join(p.relative_to(REPO_ROOT).parts)
        for p in _folders(REPO_ROOT / "navi_trio")
        if (p / "__init__.py").is_file()
    }
    data = {
        ".".join([package, *p.relative_to(REPO_ROOT / folder).parts])
        for package, folder in DATA.items()
        for p in _folders(REPO_ROOT / folder)
    }
    assert SETUPTOOLS["package-dir"] == DATA
    assert sorted(SETUPTOOLS["packages"]) == sorted(code | data)


def test_package_data_takes_every_file_of_config_and_manuals() -> None:
    patterns: dict[str, list[str]] = SETUPTOOLS["package-data"]
    left_out = []
    for package, folder in DATA.items():
        for file in (REPO_ROOT / folder).rglob("*"):
            if not file.is_file() or "__pycache__" in file.parts:
                continue
            parent = file.parent.relative_to(REPO_ROOT / folder).parts
            owner = ".".join([package, *parent])
            if not any(fnmatch.fnmatch(file.name, p) for p in patterns.get(owner, [])):
                left_out.append(str(file.relative_to(REPO_ROOT)))
    assert left_out == []


def test_a_source_checkout_uses_the_top_level_folders() -> None:
    assert shipped_dir("config") == REPO_ROOT / "config"
    assert Settings().config_path == default_config_path() == REPO_ROOT / "config" / "config.json"
    assert Settings().manuals_dir == REPO_ROOT / "manuals"


def test_an_installed_wheel_uses_its_package_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # navi_trio's folder inside site-packages.
    installed = tmp_path / "site-packages" / "navi_trio"
    (installed / "_config").mkdir(parents=True)
    (installed / "_manuals").mkdir()
    monkeypatch.setattr("navi_trio.settings.PACKAGE_DIR", installed)
    assert Settings().config_path == installed / "_config" / "config.json"
    assert Settings().manuals_dir == installed / "_manuals"
    (installed / "_manuals").rmdir()  # a folder that is not there: the checkout's
    assert Settings().manuals_dir == REPO_ROOT / "manuals"
