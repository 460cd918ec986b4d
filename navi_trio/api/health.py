"""`/healthz` and `/readyz`: is the daemon alive, and can it serve a turn now.

`/healthz` answers whenever the process answers HTTP at all (systemd's and Kubernetes'
liveness). `/readyz` runs the checks a turn needs (`ready`), each bounded in time:
the store takes a write, the LLM endpoint answers its model list (for the embedded
model: its process is not broken), and says which failed. `navi doctor` shows the same.
Neither needs a token: they say nothing a client could not learn by trying, and the
checks are cheap and bounded, so a probe cannot load the daemon.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

import trio

from navi_trio.errors import StoreError
from navi_trio.llm.ping import ping_llm

if TYPE_CHECKING:
    from navi_trio.api.services import DaemonCore

CHECK_TIMEOUT_SEC = 5.0  # each check, at most
HEALTH_SCOPE = "daemon:health"  # the kv row /readyz writes (one per daemon process)


async def ready(core: DaemonCore) -> dict[str, Any]:
    """Each check's result: ``{"ready": bool, "checks": {name: {"ok", "detail"?}}}``."""
    checks: dict[str, dict[str, Any]] = {}
    async with trio.open_nursery() as nursery:

        async def run(name: str, check: Any) -> None:
            with trio.move_on_after(CHECK_TIMEOUT_SEC) as scope:
                checks[name] = await check(core)
            if scope.cancelled_caught:
                checks[name] = {"ok": False, "detail": f"no answer within {CHECK_TIMEOUT_SEC:g} s"}

        nursery.start_soon(run, "store", _store)
        nursery.start_soon(run, "llm", _llm)
    return {"ready": all(c["ok"] for c in checks.values()), "checks": checks}


async def _store(core: DaemonCore) -> dict[str, Any]:
    try:
        await core.store.kv_set(HEALTH_SCOPE, str(os.getpid()), {"at": time.time()})
    except StoreError as exc:
        return {"ok": False, "detail": f"the store takes no write: {exc}"}
    return {"ok": True}


async def _llm(core: DaemonCore) -> dict[str, Any]:
    settings = core.settings
    status = core.llm_status()
    if status is not None:  # the embedded model: its own process, started on demand
        broken = status.get("state") == "broken"
        detail = status.get("broken") or status.get("state")
        return {"ok": not broken, "detail": f"local model: {detail}"}
    answer = await ping_llm(settings)
    if answer["ok"]:
        return {"ok": True, "detail": answer["url"]}
    return {"ok": False, "detail": f"{answer['url']}: {answer.get('error', 'no answer')}"}


def body(result: dict[str, Any]) -> bytes:
    return (json.dumps(result, sort_keys=True) + "\n").encode()
