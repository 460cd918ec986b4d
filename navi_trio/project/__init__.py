"""The files a project keeps for coding agents, read the way other agents read them.

Found in the run's cwd and the folders above it up to the repository root, and in
navi's own folders; read through the same held roots as the filesystem tool. A layer
between tools/ (which it uses: the walk beneath held roots) and core/ (whose turn builds
its system message from it; the runtime registers the `skill` tool, which lives here).

- instruction files (``AGENTS.md``, ``CLAUDE.md``) and skills (``NAME/SKILL.md``);
- `agents`: sub-agents kept as files (``.navi/agents``, ``.claude/agents``), the
  profiles spawn_agent may name, never wider than the spawning run's own;
- `commands`: prompts kept as files (``.navi/commands``, ``.claude/commands``, the
  user's ``~/.config/navi/commands``), the slash commands of every client;
- `files`: which folders count, and the one bounded reader of every project file
  beneath the held roots; `frontmatter`: the one reader of their YAML front matter.
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
from navi_trio.project.files import Chain as Chain
from navi_trio.project.files import Reader as Reader
from navi_trio.project.files import Skipped as Skipped
from navi_trio.project.files import folder_chain as folder_chain
from navi_trio.project.instructions import InstructionFile as InstructionFile
from navi_trio.project.instructions import Instructions as Instructions
from navi_trio.project.skills import Skill as Skill
from navi_trio.project.skills import Skills as Skills
from navi_trio.project.view import Places as Places
from navi_trio.project.view import ProjectView as ProjectView
from navi_trio.project.view import gather as gather
from navi_trio.project.view import user_folder as user_folder
