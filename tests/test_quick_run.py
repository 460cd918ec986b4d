"""The quick run (`python -m pytest -m "not slow"`, tests/quick_run.py): which modules it
leaves unimported, when it is the quick run, and its property tests' example counts.

Leaving a module out that has a test not marked slow would drop that test from the
quick run without a word, so the module test reads each module it would leave out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hypothesis
import pytest
import quick_run
from quick_run import examples, is_quick_run, whole_module_slow

TESTS = Path(__file__).parent


@pytest.mark.parametrize(
    "source",
    [
        "pytestmark = pytest.mark.slow\n",
        "import pytest\n\npytestmark = pytest.mark.slow  # starts a daemon process\n",
        "pytestmark = [pytest.mark.slow, needs_browser]  # a browser, a daemon\n",
        "pytestmark = [\n    pytest.mark.slow,  # its tests start processes\n    other,\n]\n",
    ],
    ids=["alone", "with-a-comment", "first-in-a-list", "first-in-a-list-over-lines"],
)
def test_a_module_marked_slow_as_a_whole_is_left_out(source: str) -> None:
    assert whole_module_slow(source.encode())


@pytest.mark.parametrize(
    "source",
    [
        "@pytest.mark.slow\ndef test_x() -> None: ...\n",
        "pytestmark = pytest.mark.skipif(True, reason='x')\n",
        "pytestmark = [needs_browser, pytest.mark.slow]\n",  # not first: imported, marks decide
        "pytestmark = pytest.mark.slow if FAST else []\n",
        "pytestmark = pytest.mark.slowish\n",
        "def f() -> None:\n    pytestmark = pytest.mark.slow\n",
        "# pytestmark = pytest.mark.slow\n",
    ],
    ids=[
        "a-test-marked",
        "skipif",
        "slow-not-first",
        "conditional",
        "slowish",
        "in-a-function",
        "commented-out",
    ],  # fmt: skip
)
def test_any_other_module_is_imported(source: str) -> None:
    assert not whole_module_slow(source.encode())


def _marks_all_slow(path: Path) -> bool:
    """The module's top-level pytestmark is, or lists, pytest.mark.slow (read by ast)."""
    for node in ast.parse(path.read_bytes()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            marks = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            return any(ast.unparse(m) == "pytest.mark.slow" for m in marks)
    return False


def test_every_module_left_out_has_only_slow_tests() -> None:
    left_out = [p for p in sorted(TESTS.glob("test_*.py")) if whole_module_slow(p.read_bytes())]
    assert len(left_out) > 10  # the suite has dozens: none found means the rule broke
    assert [p.name for p in left_out if not _marks_all_slow(p)] == []


def test_conftest_leaves_a_slow_module_out_only_in_the_quick_run(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = next(p for p in sorted(TESTS.glob("test_*.py")) if whole_module_slow(p.read_bytes()))
    ignore = pytestconfig.hook.pytest_ignore_collect
    monkeypatch.setattr(quick_run, "quick", True)
    assert ignore(collection_path=slow, config=pytestconfig) is True
    assert not ignore(collection_path=Path(__file__), config=pytestconfig)
    monkeypatch.setattr(quick_run, "quick", False)
    assert not ignore(collection_path=slow, config=pytestconfig)


@pytest.mark.parametrize(
    ("markexpr", "quick"),
    [("not slow", True), ("  not   slow ", True), ("", False), ("slow", False),
     ("not slow and not pg", False), ("(not slow)", False)],
)  # fmt: skip
def test_only_the_mark_expression_not_slow_is_the_quick_run(markexpr: str, quick: bool) -> None:
    assert is_quick_run(markexpr) is quick


def test_the_quick_run_runs_a_fifth_of_the_examples_and_others_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(quick_run, "quick", False)
    assert [examples(n) for n in (1, 30, 2000)] == [1, 30, 2000]
    monkeypatch.setattr(quick_run, "quick", True)
    assert [examples(n) for n in (1, 4, 30, 2000)] == [1, 1, 6, 400]


def test_a_property_test_that_names_no_count_runs_the_default_or_a_fifth_of_it() -> None:
    assert hypothesis.settings().max_examples == examples(100)
