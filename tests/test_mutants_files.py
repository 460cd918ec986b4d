"""The kept mutants files still apply: each mutant's `old` text is found once in its file."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted((ROOT / "tests" / "mutants").glob("*.toml"))


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutants_script", ROOT / "scripts" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_mutants_files() -> None:
    assert FILES


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_mutant_applies_and_names_tests_that_exist(path: Path) -> None:
    mutants = _script().load(path)
    for m in mutants:
        assert m["old"] != m["new"], m["id"]
        for test in m["tests"]:
            assert (ROOT / str(test).split("::")[0]).is_file(), (m["id"], test)


def test_a_mutant_whose_text_is_not_found_once_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[mutant]]\nid = "x"\nfile = "navi_trio/strict.py"\nold = "def "\nnew = "def  "\n'
        'tests = ["tests/test_strict.py"]\n'
    )
    with pytest.raises(SystemExit, match="occurs"):
        _script().load(bad)
