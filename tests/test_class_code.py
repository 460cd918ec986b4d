"""Generated code kept from one process to the next (navi_trio/class_code.py): attrs'
methods, cattrs' structuring functions and dataclasses' methods found again by their
source (attrs' whatever the per-process hash constant), the same classes and functions
made from it, nothing read from a file that is not trusted or not whole, and the
``navi`` command's start-up compiling none of its code the second time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import attr._make
import attrs
import cattrs
import cattrs.gen
import cattrs.gen.typeddicts
import pytest

from navi_trio import class_code
from navi_trio.class_code import ClassCode

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


@pytest.fixture
def hooked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """attrs' compile as it is now, put back after the test; bytecode written (the
    suite's environment may say not to)."""
    monkeypatch.setattr(attr._make, "compile", compile, raising=False)
    monkeypatch.setattr(cattrs.gen, "compile", compile, raising=False)
    monkeypatch.setattr(cattrs.gen.typeddicts, "compile", compile, raising=False)
    monkeypatch.setattr(dataclasses, "exec", exec, raising=False)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    yield


def _make(codes: ClassCode) -> type:
    attr._make.compile = codes.compile  # type: ignore[attr-defined]

    @attrs.frozen
    class Point:
        x: int
        y: int = 0
        tags: tuple[str, ...] = attrs.field(factory=tuple)

    return Point


def test_a_class_is_made_from_the_kept_code_the_second_time(tmp_path: Path, hooked: None) -> None:
    path = tmp_path / "codes.marshal"
    first = ClassCode(path)
    a = _make(first)
    assert (first.compiled, first.found) == (1, 0)
    first.save()
    assert path.exists() and first.compiled == 0

    second = ClassCode(path)
    b = _make(second)
    assert (second.compiled, second.found) == (0, 1)
    # The same behaviour: init, defaults, factory, equality, hashing, repr, frozen.
    p, q = b(1), b(1, 0, ())
    assert p == q and hash(p) == hash(q) and p != b(2)
    assert repr(p) == "Point(x=1, y=0, tags=())"
    assert repr(a(1)) == repr(p)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        p.x = 3


def _structurer(codes: ClassCode) -> cattrs.Converter:
    """A converter whose structuring code is generated (through the kept code)."""
    class_code.hook(codes)

    @attrs.frozen
    class Box:
        size: int
        label: str = "box"

    converter = cattrs.Converter(detailed_validation=False)
    converter.structure({"size": 2}, Box)
    return converter


def _made_twice(tmp_path: Path, make: Callable[[ClassCode], T]) -> tuple[int, ClassCode, T]:
    """`make` with a new ClassCode (how many it compiled), saved; then `make` again with
    one that read the file (the second ClassCode, and what `make` made with it)."""
    path = tmp_path / "codes.marshal"
    first = ClassCode(path)
    make(first)
    compiled = first.compiled
    first.save()
    second = ClassCode(path)
    return compiled, second, make(second)


def test_cattrs_code_is_made_from_the_kept_code_the_second_time(
    tmp_path: Path, hooked: None
) -> None:
    compiled, second, _ = _made_twice(tmp_path, _structurer)
    assert compiled == 2  # Box's attrs methods, and its structuring function
    assert (second.compiled, second.found) == (0, 2)


def _dataclass(codes: ClassCode) -> type:
    class_code.hook(codes)

    @dataclasses.dataclass(frozen=True)
    class Event:
        name: str
        size: int = 0

    return Event


def test_a_dataclass_is_made_from_the_kept_code_the_second_time(
    tmp_path: Path, hooked: None
) -> None:
    made, second, event = _made_twice(tmp_path, _dataclass)
    assert made >= 4  # __init__, __repr__, __eq__, __hash__, __setattr__, __delattr__
    assert (second.compiled, second.found) == (0, made)
    e = event("a")
    assert e == event("a", 0) and hash(e) == hash(event("a")) and e != event("b")
    assert repr(e).endswith("Event(name='a', size=0)")
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.size = 3


def test_exec_without_namespaces_runs_in_its_callers(tmp_path: Path) -> None:
    codes = ClassCode(tmp_path / "codes.marshal")
    found: dict[str, object] = {}
    codes.exec("seen = __name__", None, found)  # as `exec` here: this module's globals
    assert found == {"seen": __name__}


def test_the_hash_constant_does_not_change_the_key() -> None:
    source = "def __hash__(self):\n        return hash((\n                {},\n self.x))\n"
    name = "<attrs generated methods m.C>"
    key = class_code._key
    assert key(source.format(123456789), name) == key(source.format(-987654321), name)
    assert key(source, name) != key(source, "<attrs generated methods m.D>")


@pytest.mark.parametrize("damage", ["others may write it", "cut short", "not a dict"])
def test_an_untrusted_or_damaged_file_is_not_read(
    tmp_path: Path, hooked: None, damage: str
) -> None:
    path = tmp_path / "codes.marshal"
    first = ClassCode(path)
    _make(first)
    first.save()
    if damage == "others may write it":
        path.chmod(0o666)
    elif damage == "cut short":
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.write_bytes(b"\xe9\x01\x00\x00\x00")  # marshal of an int
    again = ClassCode(path)
    assert again.codes == {}
    _make(again)
    assert (again.compiled, again.found) == (1, 0)


def test_nothing_is_written_without_bytecode_or_without_news(
    tmp_path: Path, hooked: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "codes.marshal"
    codes = ClassCode(path)
    codes.save()  # nothing compiled
    assert not path.exists()
    _make(codes)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    codes.save()
    assert not path.exists()


_CHILD = """
import json, sys
from pathlib import Path
from navi_trio import class_code
codes = class_code.install(Path(sys.argv[1]))
import navi_trio.cli, navi_trio.cli.serve, navi_trio.api.daemon_client, trio_websocket
from navi_trio.settings import Settings
from navi_trio.cli.common import config_source
config_source(Settings.from_env({}))  # the config structured by cattrs' generated code
compiled = codes.compiled
class_code.save()
print(json.dumps([codes.found, compiled, len(codes.codes)]))
"""


@pytest.mark.slow
def test_the_run_path_compiles_none_of_its_classes_the_second_time(tmp_path: Path) -> None:
    path = tmp_path / "codes.marshal"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def child() -> list[int]:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path)], env=env, cwd=ROOT,
            capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        got: list[int] = json.loads(out.stdout)
        return got

    found, compiled, kept = child()
    # this attrs, cattrs and dataclasses still call the hooks: 300+ attrs classes, the
    # config's structuring functions, wsproto's and h11's dataclasses (~90 methods; some
    # of their sources alike, found the first time too)
    assert compiled == kept > 350, (compiled, kept)
    again = child()
    assert again == [found + compiled, 0, kept], (found, compiled, kept, again)
