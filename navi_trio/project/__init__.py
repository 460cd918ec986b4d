"""What navi reads of the project files people already keep for coding agents.

- `agents`: sub-agents kept as files (``.navi/agents``, ``.claude/agents``), the
  profiles spawn_agent may name, never wider than the spawning run's own;
- `commands`: prompts kept as files (``.navi/commands``, ``.claude/commands``, the
  user's ``~/.config/navi/commands``), the slash commands of every client;
- `md_files`: how both are read: beneath the run's held roots, bounded, with their
  YAML front matter.
"""

from navi_trio.project.agents import FileAgent as FileAgent
from navi_trio.project.agents import FileAgents as FileAgents
from navi_trio.project.agents import config_models as config_models
from navi_trio.project.agents import find_agents as find_agents
from navi_trio.project.agents import narrowed as narrowed
from navi_trio.project.commands import FileCommand as FileCommand
from navi_trio.project.commands import FileCommands as FileCommands
from navi_trio.project.commands import find_commands as find_commands
from navi_trio.project.commands import user_commands_folder as user_commands_folder
