"""The agents kept as files in a run's cwd, read through its held roots: told to the model
at a turn's start, and read again when spawn_agent names one.
"""

from __future__ import annotations

import trio

from navi_trio.errors import ConfigError, RootChangedError
from navi_trio.profiles import NaviConfig
from navi_trio.project import FileAgents, config_models, find_agents
from navi_trio.settings import Settings
from navi_trio.tools.private import private_paths
from navi_trio.tools.roots import RunRoots
from navi_trio.tools.runas import run_as

NOTE_AGENTS_MAX = 32  # agents named in a turn's note
NOTE_DESCRIPTION_MAX = 200  # characters of each one's description there


async def read_file_agents(
    settings: Settings, cfg: NaviConfig, roots: RunRoots | None, session_id: str | None
) -> FileAgents:
    """The agents in the held cwd of `roots` (none without one); a root that cannot be
    used now is a problem in words."""
    cwd = None if roots is None or roots.cwd is None else roots.cwd.path
    if roots is None or cwd is None:
        return FileAgents()
    private = private_paths(settings, settings.session_dir(session_id) if session_id else None)
    models = config_models(cfg.profiles.values(), settings.default_model)

    def read() -> FileAgents:
        assert roots is not None and cwd is not None
        held = roots.all()
        who = run_as(settings.tool_user)
        return find_agents(held, cwd, private, who, models=models, profiles=cfg.profiles)

    try:
        return await trio.to_thread.run_sync(read)
    except (RootChangedError, ConfigError) as exc:
        return FileAgents(problems=[str(exc)])


def agents_note(found: FileAgents) -> str | None:
    """What the model is told of the agents found (None: there are none)."""
    if not found.agents:
        return None
    lines = [
        "[Agents kept as files in the working folder: spawn_agent takes each name as its "
        "profile_id]"
    ]
    for agent in list(found.agents.values())[:NOTE_AGENTS_MAX]:
        about = " ".join(agent.description.split())
        if len(about) > NOTE_DESCRIPTION_MAX:
            about = about[: NOTE_DESCRIPTION_MAX - 1] + "…"
        lines.append(f"- {agent.name}: {about}")
    more = len(found.agents) - NOTE_AGENTS_MAX
    if more > 0:
        lines.append(f"- and {more} more")
    return "\n".join(lines)
