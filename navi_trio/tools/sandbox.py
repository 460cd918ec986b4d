"""The sandbox a tool call runs in: a minimal stub of the seam with w-sandbox.

w-sandbox owns this module (the bubblewrap runner); the policy only decides which
`SandboxSpec` a run's `ToolContext` carries (core/policy.py `sandbox_for`). Until the
two branches merge, the spec holds just what the policy decides.
"""

from __future__ import annotations

from pathlib import Path

import attrs


@attrs.frozen(kw_only=True)
class SandboxSpec:
    writable: tuple[Path, ...] = ()  # nothing else is writable; the root is read-only
    network: bool = False
