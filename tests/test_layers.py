"""navi_trio's layers (DESIGN.md): every import points down the table, none up or across.

Each folder (or top-level module) of the package has a rank; a file may import what has
a lower rank, or, in the vocabulary, another piece of the vocabulary. Every import
counts: at the top of a file, inside a function (imported on use) and under
TYPE_CHECKING, since each is a dependency someone must keep working.
"""

from __future__ import annotations

import ast
from pathlib import Path

from source_imports import import_nodes

PACKAGE = Path(__file__).resolve().parent.parent / "navi_trio"

# From the bottom up. The vocabulary may import each other; nothing else imports sideways.
VOCABULARY = frozenset({
    "__init__", "actor", "approval_text", "backoff", "caches", "class_code", "command_text",
    "errors", "events", "imports", "jsonenc", "notices", "patterns",
    "profiles", "settings", "strict", "text", "wire",
})  # fmt: skip
RANKS: dict[str, int] = {name: 0 for name in VOCABULARY} | {
    "llm": 1,
    "store": 1,
    "tools": 2,
    "project": 3,  # the project's files (instruction files, skills): read by the core
    "core": 4,
    "api": 5,
    "client": 6,
    "acp": 6,
    "web": 6,  # the page's files (and the module that names them)
    "runtime": 7,
    "testing": 8,
    "cli": 8,
    "__main__": 9,
}


def unit(path: Path) -> str:
    """The layer a file belongs to: its top folder, or its own name at the top."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def imported_units(path: Path) -> list[tuple[int, str]]:
    """Every layer of navi_trio the file imports, with its line."""
    found: list[tuple[int, str]] = []
    for node in import_nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
            if node.module == "navi_trio":
                modules = [f"navi_trio.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] != "navi_trio":
                continue
            name = parts[1] if len(parts) > 1 else "__init__"
            found.append((node.lineno, "__init__" if name == "__version__" else name))
    return found


def allowed(importer: str, imported: str) -> bool:
    if importer == imported:
        return True
    if importer in VOCABULARY and imported in VOCABULARY:
        return True
    return RANKS[imported] < RANKS[importer]


def test_every_layer_has_a_rank() -> None:
    units = {unit(path) for path in PACKAGE.rglob("*.py")}
    assert units - RANKS.keys() == set()


def test_no_import_goes_up_or_across_the_layers() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = unit(path)
        for line, imported in imported_units(path):
            if not allowed(importer, imported):
                wrong.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line}: {importer} imports {imported}"
                )
    assert wrong == []


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text("def f():\n    from navi_trio.cli.runner import connect\n")
    assert imported_units(source) == [(2, "cli")]
    assert not allowed("acp", "cli") and not allowed("llm", "store") and allowed("core", "tools")
