"""What the model host remembers in the data folder: ``local-model.json``.

- ``extra_buffers``: per CPU model and llama-cpp-python version, whether llama.cpp's
  extra buffer types (weight repacking: AMX on recent Xeons, AVX2 repacks elsewhere)
  survived the start-up probe, so the probe runs once per machine and version, not at
  every start (llm/host.py decides, llm/model_host.py probes).
- ``broken``: set while the daemon has marked the local backend broken (its process
  died at start-up again and again), with the signal and the last stderr lines, so that
  ``navi doctor`` can say so; removed when a process starts again.

Reads never raise (a missing or damaged file is an empty one); writes replace the file
whole (a temp file and a rename), so a crash leaves the old or the new one. Blocking:
callers run these in a worker thread.
"""

from __future__ import annotations

import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

STATE_FILE = "local-model.json"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what `platform` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model"):
                    return value.strip() or "unknown CPU"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def llama_cpp_version() -> str:
    """The installed llama-cpp-python's version, read from its metadata (no import)."""
    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return "not installed"


def state_key() -> str:
    return f"{cpu_model()} | llama-cpp-python {llama_cpp_version()}"


def read_state(data_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((data_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remembered_extra_buffers(state: dict[str, Any], key: str) -> bool | None:
    entry = (state.get("extra_buffers") or {}).get(key)
    if isinstance(entry, dict) and isinstance(entry.get("on"), bool):
        return bool(entry["on"])
    return None


def _write(data_dir: Path, state: dict[str, Any]) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / STATE_FILE
    tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def remember_extra_buffers(data_dir: Path, key: str, on: bool, why: str) -> None:
    state = read_state(data_dir)
    table = state.get("extra_buffers")
    table = table if isinstance(table, dict) else {}
    table[key] = {"on": on, "why": why, "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    state["extra_buffers"] = table
    _write(data_dir, state)


def remember_broken(data_dir: Path, report: dict[str, Any] | None) -> None:
    """Set (`report`) or clear (None) the daemon's "broken" mark."""
    state = read_state(data_dir)
    if report is None and "broken" not in state:
        return
    if report is None:
        del state["broken"]
    else:
        state["broken"] = {**report, "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    _write(data_dir, state)
