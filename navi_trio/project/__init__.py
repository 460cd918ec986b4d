"""The files a project keeps for coding agents, read the way other agents read them.

Instruction files (``AGENTS.md``, ``CLAUDE.md``) and skills (``NAME/SKILL.md``), found
in the run's cwd and the folders above it up to the repository root, and in navi's own
folders; read through the same held roots as the filesystem tool. A layer between
tools/ (which it uses: the walk beneath held roots) and core/ (whose turn builds its
system message from it); the `skill` tool lives here, and the runtime registers it.
"""

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
