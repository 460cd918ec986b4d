"""Agent profiles and the config file (`config/config.json`) that holds them: its shape
(`_schema`), control and budgets (`_control`), hooks (`_hooks`), the tool policy
(`_policy`), strict loading and checks (`_load`), and the config in force with hot
reload (`_source`).
"""

from navi_trio.profiles._control import NO_BUDGETS as NO_BUDGETS
from navi_trio.profiles._control import ON_BUSY as ON_BUSY
from navi_trio.profiles._control import BudgetConfig as BudgetConfig
from navi_trio.profiles._control import BudgetLimits as BudgetLimits
from navi_trio.profiles._control import OnBusy as OnBusy
from navi_trio.profiles._control import budgets_dict as budgets_dict
from navi_trio.profiles._control import parse_budgets as parse_budgets
from navi_trio.profiles._hooks import HOOK_EVENTS as HOOK_EVENTS
from navi_trio.profiles._hooks import HOOK_FORMATS as HOOK_FORMATS
from navi_trio.profiles._hooks import TOOL_EVENTS as TOOL_EVENTS
from navi_trio.profiles._hooks import HookConfig as HookConfig
from navi_trio.profiles._hooks import HookFilesConfig as HookFilesConfig
from navi_trio.profiles._hooks import TrustedHookFile as TrustedHookFile
from navi_trio.profiles._load import check_config as check_config
from navi_trio.profiles._load import load_config as load_config
from navi_trio.profiles._load import parse_config as parse_config
from navi_trio.profiles._load import ssh_problems as ssh_problems
from navi_trio.profiles._policy import COMMAND_KEYS as COMMAND_KEYS
from navi_trio.profiles._policy import MODES as MODES
from navi_trio.profiles._policy import ROLES as ROLES
from navi_trio.profiles._policy import CallPattern as CallPattern
from navi_trio.profiles._policy import Decision as Decision
from navi_trio.profiles._policy import Mode as Mode
from navi_trio.profiles._policy import PolicyConfig as PolicyConfig
from navi_trio.profiles._policy import PolicyRule as PolicyRule
from navi_trio.profiles._schema import BUILTIN_TOOL_NAMES as BUILTIN_TOOL_NAMES
from navi_trio.profiles._schema import ENV_NAME as ENV_NAME
from navi_trio.profiles._schema import MCP_PREFIX as MCP_PREFIX
from navi_trio.profiles._schema import MCP_SERVER_NAME as MCP_SERVER_NAME
from navi_trio.profiles._schema import REQUIRED_PROMPT_FILES as REQUIRED_PROMPT_FILES
from navi_trio.profiles._schema import SECRET_VARS as SECRET_VARS
from navi_trio.profiles._schema import AgentProfile as AgentProfile
from navi_trio.profiles._schema import McpServerConfig as McpServerConfig
from navi_trio.profiles._schema import ModelConfig as ModelConfig
from navi_trio.profiles._schema import NaviConfig as NaviConfig
from navi_trio.profiles._schema import PeerConfig as PeerConfig
from navi_trio.profiles._schema import ProcessLimits as ProcessLimits
from navi_trio.profiles._schema import SshConfig as SshConfig
from navi_trio.profiles._schema import SshHost as SshHost
from navi_trio.profiles._schema import ToolsConfig as ToolsConfig
from navi_trio.profiles._schema import config_secrets as config_secrets
from navi_trio.profiles._schema import is_secret as is_secret
from navi_trio.profiles._source import ConfigSource as ConfigSource
from navi_trio.profiles._source import Pin as Pin
from navi_trio.profiles._source import pin_roots as pin_roots
