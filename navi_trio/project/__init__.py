"""The files a project keeps for coding agents, read the way other agents read them.

Found in the run's cwd and the folders above it up to the repository root, and in
navi's own folders; read through the same held roots as the filesystem tool. Instruction
files (``AGENTS.md``, ``CLAUDE.md``), skills (``NAME/SKILL.md``), sub-agents and slash
commands kept as files. A layer between tools/ (whose walk beneath held roots it uses)
and core/ (whose turn builds its system message from it).
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
