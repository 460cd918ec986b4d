"""The ``commands`` frame: the slash commands kept as files, for one user's run folder.

The `cwd` is checked as a message's is (`CwdCheck`: the sender's role and workspace
roots, never navi's own data), then held and read beneath as the filesystem tool reads:
a command's body is a file's content, so a folder the sender may not work in yields
nothing. The daemon account's own commands (``~/.config/navi/commands``) are listed to
admins only; without a `cwd`, only those. Every client expands a command itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from navi_trio.api.protocol import CommandList, RequestId, reply
from navi_trio.project import find_commands, user_commands_folder
from navi_trio.tools.private import private_paths
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import run_as

if TYPE_CHECKING:  # commands imports this module
    from navi_trio.api.commands import Commands


async def list_commands(host: Commands, rid: RequestId, cmd: CommandList) -> None:
    rt, user = host.rt, host.user
    if cmd.session_id is not None:
        await host._owned(cmd.session_id)
    held: Root | None = None
    if cmd.cwd is not None:
        held = await host.cwd_check(cmd.session_id).open(cmd.cwd)
    settings = rt.settings
    session_dir = settings.session_dir(cmd.session_id) if cmd.session_id else None
    private = private_paths(settings, session_dir)
    # The daemon account's own folder is its admins': an ordinary user of a shared
    # daemon is never shown what that account keeps (as with its config).
    own = user_commands_folder() if user.is_admin else None
    try:
        found = await trio.to_thread.run_sync(
            lambda: find_commands(held, private, run_as(settings.tool_user), own)
        )
    finally:
        if held is not None:
            held.close()
    await host.conn.send(
        reply(
            rid,
            "commands",
            commands=[c.frame() for c in found.commands],
            notices=found.problems,
        )
    )
