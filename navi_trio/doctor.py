"""``navi doctor``: check the config, the DB and the LLM endpoint, and print the report.

`collect_doctor` gathers everything as one JSON-ready dict (`ping_llm` asks the endpoint
for its model list); `print_doctor` shows it for a person. The command itself
(`cmd_doctor`, its arguments and exit code) lives in `navi_trio.cli`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

import attrs
import httpx
import trio

from navi_trio import __version__
from navi_trio.errors import ConfigError, NaviError
from navi_trio.profiles import AgentProfile, NaviConfig, load_config
from navi_trio.settings import Settings
from navi_trio.store.sqlite import read_only_stats

LLM_PING_TIMEOUT = 3.0

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


def _models_url(settings: Settings) -> str:
    base = settings.llm_url.rstrip("/")
    if settings.llm_backend.strip().lower() == "openai":
        return f"{base}/models" if base.endswith("/v1") else f"{base}/v1/models"
    return f"{base}/api/tags"


async def ping_llm(settings: Settings) -> dict[str, Any]:
    """GET the endpoint's model list: ``{"url", "ok", "models"|"error"}``."""
    timeout = LLM_PING_TIMEOUT
    url = _models_url(settings)
    headers = {"Authorization": f"Bearer {settings.llm_api_key}"} if settings.llm_api_key else {}
    result: dict[str, Any] = {"url": url, "ok": False}
    # The httpx timeout bounds each phase; the cancel scope bounds the whole exchange.
    with trio.move_on_after(timeout + 1):
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                response = await client.get(url, headers=headers)
            if response.status_code >= 400:
                result["error"] = f"HTTP {response.status_code}: {response.text.strip()[:200]}"
                return result
            data = response.json()
            if settings.llm_backend.strip().lower() == "openai":
                models = [m.get("id", "?") for m in data.get("data", [])]
            else:
                models = [m.get("name", "?") for m in data.get("models", [])]
        except httpx.HTTPError as exc:
            result["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return result
        except (ValueError, AttributeError, TypeError):
            result["error"] = "the answer is not the JSON model list this backend sends"
            return result
        result.update(ok=True, models=[str(m) for m in models])
        return result
    result["error"] = f"no answer within {timeout:g} s"
    return result


async def collect_doctor(settings: Settings) -> dict[str, Any]:
    """Everything `navi doctor` reports, as one JSON-ready dict (``ok``: config and DB fine)."""
    report: dict[str, Any] = {"version": __version__, "warnings": [], "errors": []}
    config: dict[str, Any] = {"path": str(settings.config_path), "ok": False}
    cfg: NaviConfig | None = None
    try:
        cfg = load_config(settings.config_path)
    except ConfigError as exc:
        config["error"] = str(exc)
        report["errors"].append(str(exc))
    else:
        config.update(
            ok=True,
            default_profile=cfg.default_profile,
            profiles=[
                _profile_info(p, settings, cfg.default_profile) for p in cfg.profiles.values()
            ],
        )
    report["config"] = config

    # Read-only: the doctor reports, it never creates or changes the database.
    db: dict[str, Any] = {"path": str(settings.db_path), "existed": settings.db_path.exists()}
    if not db["existed"]:
        db.update(ok=True, tables=None)
    else:
        try:
            db["tables"] = await trio.to_thread.run_sync(read_only_stats, settings.db_path)
            db["ok"] = True
        except NaviError as exc:
            db.update(ok=False, error=str(exc))
            report["errors"].append(str(exc))
    report["db"] = db

    llm = {"backend": settings.llm_backend, **await ping_llm(settings)}
    report["llm"] = llm
    if not llm["ok"]:
        report["warnings"].append(f"the LLM at {llm['url']} does not answer: {llm['error']}")
    elif cfg is not None:
        wanted = sorted({p["model"] for p in config["profiles"]})
        missing = [m for m in wanted if m not in llm["models"]]
        if missing:
            report["warnings"].append(
                f"model(s) {', '.join(missing)} used by the profiles are not listed by the LLM"
            )
    for key, folder in (("manuals_dir", settings.manuals_dir), ("data_dir", settings.data_dir)):
        report[key] = {"path": str(folder), "exists": folder.is_dir()}
    report["settings"] = _settings_info(settings)
    report["ok"] = not report["errors"]
    return report


def _settings_info(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in attrs.fields(Settings):
        value = getattr(settings, field.name)
        if field.name == "llm_api_key":
            value = "(set)" if value else "(not set)"  # never print a secret
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[field.name] = value
    out["message_token_budget"] = settings.message_token_budget
    return out


def print_doctor(r: dict[str, Any], out: TextIO) -> None:
    def line(label: str, text: str) -> None:
        print(f"{label:<13}{text}", file=out)

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
    line("db", f"{d['path']}  ({state})")
    if d["ok"] and d["tables"] is not None:
        line("", "rows: " + ", ".join(f"{k}={v}" for k, v in sorted(d["tables"].items())))
    elif not d["ok"]:
        line("", f"BROKEN: {d['error']}")
    m = r["llm"]
    line("llm", f"{m['backend']} {m['url']}")
    if m["ok"]:
        line("", f"OK: models {', '.join(m['models']) or '(none)'}")
    else:
        line("", f"DOWN: {m['error']}")
    for key, label in (("manuals_dir", "manuals"), ("data_dir", "data dir")):
        line(label, r[key]["path"] + ("" if r[key]["exists"] else "  (missing)"))
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
    for w in r["warnings"]:
        print(f"warning: {w}", file=out)
