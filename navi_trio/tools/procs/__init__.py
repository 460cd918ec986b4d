"""Child processes without orphans: spawn and kill (`_spawn`), output capture
(`_capture`), and the persistent processes of ``terminal open`` (`_pool`).
"""

from navi_trio.profiles import is_secret as is_secret
from navi_trio.tools.procs._capture import CommandResult as CommandResult
from navi_trio.tools.procs._capture import HeadTail as HeadTail
from navi_trio.tools.procs._capture import LineCallback as LineCallback
from navi_trio.tools.procs._capture import LineSplitter as LineSplitter
from navi_trio.tools.procs._capture import memory_file as memory_file
from navi_trio.tools.procs._capture import run_command as run_command
from navi_trio.tools.procs._pool import ProcessInfo as ProcessInfo
from navi_trio.tools.procs._pool import ProcessPool as ProcessPool
from navi_trio.tools.procs._pool import ReadResult as ReadResult
from navi_trio.tools.procs._spawn import KILL_GRACE_SEC as KILL_GRACE_SEC
from navi_trio.tools.procs._spawn import PASSED_VARS as PASSED_VARS
from navi_trio.tools.procs._spawn import TAG_VAR as TAG_VAR
from navi_trio.tools.procs._spawn import child_env as child_env
from navi_trio.tools.procs._spawn import data_digest as data_digest
from navi_trio.tools.procs._spawn import kill_group as kill_group
from navi_trio.tools.procs._spawn import kill_orphans as kill_orphans
from navi_trio.tools.procs._spawn import new_tag as new_tag
from navi_trio.tools.procs._spawn import passed_env as passed_env
from navi_trio.tools.procs._spawn import python_argv as python_argv
from navi_trio.tools.procs._spawn import shell_argv as shell_argv
from navi_trio.tools.procs._spawn import tag_owner as tag_owner
