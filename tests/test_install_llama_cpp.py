"""scripts/install_llama_cpp.sh: a portable llama.cpp build, compiled once per machine.

The script runs for real (bash, its own key and cache logic), with ``$PYTHON`` a small
stand-in that runs the real Python for ``-c`` and notes every ``-m pip`` call instead
of running it (a ``pip wheel`` leaves an empty wheel file where the real one would be):
so the test sees the flags a compile would get and whether a second run compiles at
all, in a second, without the five minutes of a real build. `.ci/run` is checked to
take its llama-cpp-python from the script, never from pip's own native build.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from navi_trio.settings import REPO_ROOT

pytestmark = pytest.mark.slow  # its tests start processes

SCRIPT = REPO_ROOT / "scripts" / "install_llama_cpp.sh"
STAND_IN = """#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    shift 2
    printf '%s\\t%s\\n' "${CMAKE_ARGS:-}" "$*" >> "$PIP_LOG"
    if [ "$1" = "wheel" ]; then
        while [ $# -gt 0 ]; do
            if [ "$1" = "-w" ]; then
                touch "$2/llama_cpp_python-${LLAMA_CPP_VERSION:-0.3.36}-cp311-linux_x86_64.whl"
            fi
            shift
        done
    fi
    exit 0
fi
exec REAL "$@"
"""


def _install(tmp_path: Path, **env: str) -> list[tuple[str, list[str]]]:
    """Run the script; the pip calls it made, as (CMAKE_ARGS, argv)."""
    python = tmp_path / "python"
    python.write_text(STAND_IN.replace("REAL", shlex.quote(sys.executable)))
    python.chmod(0o755)
    log = tmp_path / "pip.log"
    log.unlink(missing_ok=True)
    full = {**os.environ, "PYTHON": str(python), "PIP_LOG": str(log),
            "NAVI_WHEEL_CACHE": str(tmp_path / "cache"), **env}  # fmt: skip
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    calls = []
    for row in log.read_text().splitlines():
        cmake, _, argv = row.partition("\t")
        calls.append((cmake, argv.split()))
    return calls


def _wheels(calls: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    return [(cmake, argv) for cmake, argv in calls if argv[0] == "wheel"]


def test_the_build_is_portable_and_never_reads_pips_cache(tmp_path: Path) -> None:
    ((cmake, argv),) = _wheels(_install(tmp_path))
    flags = cmake.split()
    assert "-DGGML_NATIVE=OFF" in flags  # no -march=native
    if platform.machine() in ("x86_64", "AMD64"):
        for on in ("AVX", "AVX2", "FMA", "F16C"):
            assert f"-DGGML_{on}=ON" in flags
        for off in ("AVX512", "AMX_TILE", "AMX_INT8", "AMX_BF16"):
            assert f"-DGGML_{off}=OFF" in flags
        assert not [f for f in flags if ("AVX512" in f or "AMX" in f) and f.endswith("=ON")]
    # Built from source with these flags, never a wheel from pip's cache (keyed without them).
    assert "--no-cache-dir" in argv and "--no-binary" in argv
    assert "llama-cpp-python==0.3.36" in argv


def test_a_second_run_installs_the_kept_wheel_and_compiles_nothing(tmp_path: Path) -> None:
    first = _install(tmp_path)
    second = _install(tmp_path)
    assert len(_wheels(first)) == 1 and _wheels(second) == []
    installs = [argv for _, argv in second if argv[0] == "install"]
    (kept,) = list((tmp_path / "cache").glob("llama-cpp-python-0.3.36-*/llama_cpp_python-*.whl"))
    # The file itself, over whatever llama-cpp-python is there (a native one, say).
    assert ["install", "-q", "--force-reinstall", "--no-deps", str(kept)] in installs
    assert ["install", "-q", f"{kept}[server]"] in installs
    assert (kept.parent / "CMAKE_ARGS").read_text().strip() == _wheels(first)[0][0]


def test_another_version_is_compiled_into_a_folder_of_its_own(tmp_path: Path) -> None:
    _install(tmp_path)
    other = _install(tmp_path, LLAMA_CPP_VERSION="0.3.37")
    ((_, argv),) = _wheels(other)
    assert "llama-cpp-python==0.3.37" in argv
    folders = sorted(p.name.split("-")[3] for p in (tmp_path / "cache").iterdir())
    assert folders == ["0.3.36", "0.3.37"]


def test_ci_takes_llama_cpp_from_the_portable_build() -> None:
    lines = [line.strip() for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()]
    code = [line for line in lines if line and not line.startswith("#")]
    script = next(i for i, line in enumerate(code) if "scripts/install_llama_cpp.sh" in line)
    extra = next(i for i, line in enumerate(code) if "'.[test,local]'" in line)
    assert script < extra  # built portably first: the extra finds it installed
    # and were pip to want another llama-cpp-python, it fails instead of compiling one.
    assert "--only-binary llama-cpp-python" in code[extra]
