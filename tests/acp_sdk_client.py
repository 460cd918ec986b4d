"""The official ACP Python SDK's client driving an agent: a program of its own (asyncio).

    python tests/acp_sdk_client.py SCENARIO.json
    python tests/acp_sdk_client.py --serve AGENT.json

The scenario: ``{"agent": [argv...], "env": {...}, "cwd": DIR, "steps": [...]}``. The
client spawns the agent with the SDK's `spawn_agent_process`, initializes, then runs
the steps in order; each step prints one JSON line: what the step returned (or the
JSON-RPC error it got), the ``session/update`` notifications of the scenario's
sessions that came meanwhile, and the permission requests the agent asked.

With ``--serve`` the agent (AGENT.json: the scenario without its steps) serves many
scenarios: after the initialize's line, each line on stdin is ``{"cwd": DIR, "steps":
[...]}``, answered by its steps' lines and then ``{"op": "end", "foreign": N}``, N the
updates and permission requests that came for sessions of no scenario of this one (a
run an earlier scenario left going). The client exits when stdin closes. Steps:

- ``{"op": "new", "cwd": DIR?, "mcp": [SERVER...]?}`` / ``{"op": "load", "id": SESSION_ID}``
  / ``{"op": "fork"}`` / ``{"op": "resume"}`` / ``{"op": "list"}``; the steps after them
  work on the session they made or loaded;
- ``{"op": "prompt", "text": T, "session": N?, "permission": OPTION_ID | "cancelled" | "error",
  "cancel_on": UPDATE_KIND?}``: with ``cancel_on``, ``session/cancel`` is sent once an
  update of that kind came;
- ``{"op": "set_mode", "mode": M}``, ``{"op": "raw", "method": M, "params": P}`` (the
  string ``"SID"`` in P stands for the current session).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.schema import (
    AllowedOutcome,
    DeniedOutcome,
    RequestPermissionResponse,
)


class Recorder:
    """The SDK's Client: records what the agent sends for the current scenario's
    sessions, answers permissions as told."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.permissions: list[dict[str, Any]] = []
        self.sessions: list[str] = []  # the current scenario's
        self.foreign = 0  # updates and requests for other sessions
        self.answer = "reject_once"
        self.cancel_on: str | None = None
        self.cancel: asyncio.Event = asyncio.Event()

    async def request_permission(
        self, session_id: str, tool_call: Any, options: Any, **kw: Any
    ) -> Any:
        self.permissions.append(
            {
                "sessionId": session_id,
                "toolCall": tool_call.model_dump(by_alias=True, exclude_none=True),
                "options": [o.model_dump(by_alias=True, exclude_none=True) for o in options],
            }
        )
        if self.answer == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        if self.answer == "error":  # the SDK sends the editor's error reply
            raise RuntimeError("the editor failed to ask")
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=self.answer)
        )

    async def session_update(self, session_id: str, update: Any, **kw: Any) -> None:
        data = update.model_dump(by_alias=True, exclude_none=True)
        data["_at"] = time.monotonic()
        data["_session"] = session_id
        self.updates.append(data)
        if self.cancel_on is not None and data.get("sessionUpdate") == self.cancel_on:
            self.cancel.set()

    def step_done(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The step's updates and permission requests for the scenario's sessions; the
        others are counted in `foreign`."""
        mine = set(self.sessions)
        updates = [u for u in self.updates if u.pop("_session") in mine]
        permissions = [p for p in self.permissions if p.pop("sessionId") in mine]
        self.foreign += len(self.updates) - len(updates) + len(self.permissions) - len(permissions)
        self.updates, self.permissions = [], []
        return updates, permissions

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None


def _dump(result: Any) -> Any:
    return result.model_dump(by_alias=True, exclude_none=True) if result is not None else None


async def run_steps(conn: Any, rec: Recorder, cwd: str, steps: list[dict[str, Any]]) -> None:
    """Run one scenario's `steps` on the initialized connection, printing a line each."""
    sessions: list[str] = []
    rec.sessions = sessions
    for step in steps:
        op = step["op"]
        out: dict[str, Any] = {"op": op}
        sid = sessions[-1] if sessions else ""
        res: Any
        try:
            if op == "new":
                res = await conn.new_session(
                    cwd=step.get("cwd", cwd), mcp_servers=step.get("mcp", [])
                )
                sessions.append(res.session_id)
            elif op == "load":
                loaded = str(step.get("id") or sid)
                sessions.append(loaded)
                res = await conn.load_session(cwd=cwd, session_id=loaded, mcp_servers=[])
            elif op == "fork":
                res = await conn.fork_session(session_id=sid, cwd=cwd, mcp_servers=[])
                sessions.append(res.session_id)
            elif op == "resume":
                res = await conn.resume_session(session_id=sid, cwd=cwd, mcp_servers=[])
            elif op == "list":
                res = await conn.list_sessions()
            elif op == "set_mode":
                res = await conn.set_session_mode(session_id=sid, mode_id=step["mode"])
            elif op == "prompt":
                rec.answer = step.get("permission", "reject_once")
                rec.cancel_on = step.get("cancel_on")
                rec.cancel = asyncio.Event()
                task = asyncio.create_task(
                    conn.prompt(session_id=sid, prompt=[text_block(step["text"])])
                )
                if rec.cancel_on is not None:
                    await rec.cancel.wait()
                    out["cancelled_at"] = time.monotonic()
                    await conn.cancel(session_id=sid)
                res = await task
                out["answered_at"] = time.monotonic()
            elif op == "raw":
                params = json.loads(json.dumps(step["params"]).replace('"SID"', json.dumps(sid)))
                res = await conn._conn.send_request(step["method"], params)  # noqa: SLF001
            else:
                raise SystemExit(f"unknown op {op}")
            out["result"] = res if isinstance(res, dict) else _dump(res)
        except RequestError as exc:
            out["error"] = {"code": exc.code, "message": str(exc), "data": exc.data}
        out["updates"], out["permissions"] = rec.step_done()
        print(json.dumps(out), flush=True)
    await asyncio.sleep(0)  # let the last notifications land


async def main(path: str, serve: bool) -> None:
    scenario = json.loads(Path(path).read_text(encoding="utf-8"))  # noqa: ASYNC240
    rec = Recorder()
    argv = scenario["agent"]
    async with (
        spawn_agent_process(
            rec,  # type: ignore[arg-type]  # the Client protocol, the methods this test needs
            argv[0],
            *argv[1:],
            env=scenario.get("env"),
            cwd=scenario.get("cwd"),
            transport_kwargs={"limit": 16 * 1024 * 1024},
        ) as (conn, _proc)
    ):
        init = await conn.initialize(protocol_version=PROTOCOL_VERSION)
        print(json.dumps({"op": "initialize", "result": _dump(init)}), flush=True)
        if not serve:
            await run_steps(conn, rec, scenario["cwd"], scenario["steps"])
            return
        while line := await asyncio.to_thread(sys.stdin.readline):
            rec.foreign = 0
            asked = json.loads(line)
            await run_steps(conn, rec, asked["cwd"], asked["steps"])
            rec.step_done()  # what came since the last step
            print(json.dumps({"op": "end", "foreign": rec.foreign}), flush=True)


if __name__ == "__main__":
    serving = sys.argv[1] == "--serve"
    asyncio.run(main(sys.argv[-1], serving))
