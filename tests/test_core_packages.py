"""The core's sub-packages: imported whole, and layered without a cycle.

Each sub-package of `navi_trio.core` re-exports the names the rest of the code uses in its
`__init__.py`, trio's way (`from .module import Name as Name`). The rest of navi_trio and
the scripts import the package, never one of its modules, so a module can be split or
renamed inside its package without touching its users. Tests may still reach into a
module for what only they use. The packages are layered: each imports only those below
it, so the core has no import cycle.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from source_imports import import_nodes

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "navi_trio" / "core"
# From the bottom up: a package imports only those before it.
LAYERS = ("checkpoints", "jobs", "turn", "session", "history", "triggers", "cluster")


def imports(path: Path) -> list[tuple[int, str]]:
    """Every absolute module a file imports from, with its line."""
    found: list[tuple[int, str]] = []
    for node in import_nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def core_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["navi_trio", "core"] and len(parts) > 2 else None


def test_the_sub_packages_are_the_layers() -> None:
    found = {p.name for p in CORE.iterdir() if (p / "__init__.py").is_file()}
    assert found == set(LAYERS)
    assert [p.name for p in CORE.glob("*.py")] == ["__init__.py"]


def test_the_rest_of_the_code_imports_a_core_package_not_its_modules() -> None:
    reaching_in = []
    for top in ("navi_trio", "scripts"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for line, module in imports(path):
                package = core_package(module)
                if package is None or module.count(".") < 3:
                    continue
                if path.is_relative_to(CORE / package):
                    continue
                where = f"{path.relative_to(ROOT)}:{line}"
                reaching_in.append(f"{where} imports {module}, not navi_trio.core.{package}")
    assert reaching_in == []


def test_a_package_re_exports_each_name_as_itself() -> None:
    for name in LAYERS:
        init = CORE / name / "__init__.py"
        package = importlib.import_module(f"navi_trio.core.{name}")
        for node in ast.parse(init.read_text()).body:
            if not isinstance(node, ast.ImportFrom):
                continue
            for alias in node.names:
                if node.level == 1:
                    assert alias.asname == alias.name, f"{init}: {alias.name} as {alias.asname}"
                    assert getattr(package, alias.name) is not None


def test_each_package_imports_only_the_packages_below_it() -> None:
    upward = []
    for rank, name in enumerate(LAYERS):
        for path in sorted((CORE / name).rglob("*.py")):
            for line, module in imports(path):
                other = core_package(module)
                if other is not None and other != name and LAYERS.index(other) > rank:
                    upward.append(f"{path.relative_to(ROOT)}:{line} ({name}) imports {other}")
    assert upward == []
