"""For the tests of navi's own process clean-up: runs outside the sandbox.

Those tests read the host pids of what a tool starts, and inside bubblewrap's PID
namespace a command sees other pids. So they run in `full` mode as the local admin, with
a profile rule that lets terminal and code_exec run without asking (docs/pages/tools.md, "Safety").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from navi_trio.settings import default_config_path

ALLOW_EXEC: dict[str, Any] = {
    "policy": {
        "rules": [
            {"tool": "terminal", "decision": "allow"},
            {"tool": "code_exec", "decision": "allow"},
        ]
    }
}
# UserMessage fields (h.turn / SessionDriver.send keyword arguments).
FULL: dict[str, Any] = {"user_role": "admin", "mode": "full"}
# `navi run` options.
FULL_ARGS = ("--mode", "full")


def unsandboxed_config(tmp_path: Path) -> Path:
    """A copy of the shipped config folder whose profiles all carry ALLOW_EXEC."""
    folder = tmp_path / "config"
    shutil.copytree(default_config_path().parent, folder)
    path = folder / "config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for profile in data["profiles"].values():
        profile.update(ALLOW_EXEC)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path
