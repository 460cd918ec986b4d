"""The ssh_exec tool: one command on a host named in config.json (``ssh.hosts``).

The system OpenSSH client runs as an argv list, never through a local shell, with no
ssh_config of the user's, no password prompt, no host key outside the configured
known_hosts and no key but the configured one.

Refused before anything runs (`precheck`): an alias not configured and, unless the
host allows ``["*"]``, a command whose program (its first word, by `shlex`) is not in
the host's ``commands``. Such a command is sent as ``shlex.join(argv)``, so ``;``,
``&&``, ``$(…)`` reach the remote shell quoted and cannot chain a second program.

Why ``-tt``: without a terminal, sshd leaves the remote command running when the
connection closes. With a pseudo-terminal, the closed connection sends SIGHUP to the
remote command's group, so killing the local ssh ends the remote command too. The
price: stdout and stderr arrive merged, lines end in ``\\r\\n`` (turned back into
``\\n``), and there is no input.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

import attrs

from navi_trio.errors import ToolInputError
from navi_trio.profiles import SshConfig, SshHost
from navi_trio.settings import Settings
from navi_trio.tools.args import arg, parse, schema
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.procs import CommandResult, run_command, tag_owner
from navi_trio.tools.terminal import (
    command_result,
    output_progress,
    read_timeout,
    session_cgroup,
    timeout_arg,
)

CONNECT_TIMEOUT_SEC = 10
SSH_FAILED = 255  # ssh's own exit code for a connection, host key or login failure
NO_HOSTS = (
    "no ssh hosts are configured: ssh_exec reaches only hosts named in config.json "
    '("ssh": {"known_hosts": ..., "hosts": {...}}, '
    'see docs/pages/tools.md, "Remote hosts over SSH")'
)


@attrs.frozen
class SshCall:
    alias: str
    host: SshHost
    remote: str  # what the remote shell gets
    argv: list[str]


def ssh_argv(ssh: SshConfig, host: SshHost, remote: str, client: str = "ssh") -> list[str]:
    """The local ssh command line for `remote` on `host` (see the module docstring)."""
    options = [
        "BatchMode=yes",
        "StrictHostKeyChecking=yes",
        f"UserKnownHostsFile={ssh.known_hosts}",
        "IdentitiesOnly=yes",
        "LogLevel=ERROR",
        f"ConnectTimeout={CONNECT_TIMEOUT_SEC}",
    ]
    flags = [arg for option in options for arg in ("-o", option)]
    login = ["-i", host.identity_file, "-p", str(host.port), f"{host.user}@{host.host}"]
    return [client, "-F", "/dev/null", *flags, "-tt", *login, "--", remote]


def remote_command(alias: str, host: SshHost, command: str) -> str:
    """The command line to send, or ToolInputError when the host does not allow it."""
    if not command.strip():
        raise ToolInputError("argument 'command' is empty")
    if host.any_command:
        return command
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ToolInputError(f"cannot split the command into words: {exc}") from None
    if not argv:
        raise ToolInputError("argument 'command' has no words")
    if argv[0] not in host.commands:
        raise ToolInputError(
            f"program {argv[0]!r} is not allowed on host {alias!r} (allowed: "
            f"{', '.join(host.commands)}); its arguments are passed quoted, so ';', '&&', "
            "'|' or '$(...)' cannot start another program"
        )
    return shlex.join(argv)


@attrs.frozen(kw_only=True)
class SshArgs:
    host: str = arg("a host alias from the config")
    command: str = arg("the command to run there")
    timeout: float | None = timeout_arg("seconds before it is killed")


def plan_call(args: SshArgs, ssh: SshConfig | None) -> SshCall:
    """Check the call against the config; raises ToolInputError naming the problem."""
    if ssh is None or not ssh.hosts:
        raise ToolInputError(NO_HOSTS)
    alias = args.host
    host = ssh.hosts.get(alias)
    if host is None:
        raise ToolInputError(
            f"unknown host {alias!r}: ssh_exec reaches only the configured hosts "
            f"({', '.join(sorted(ssh.hosts))})"
        )
    remote = remote_command(alias, host, args.command)
    return SshCall(alias, host, remote, ssh_argv(ssh, host, remote))


def ssh_result(result: CommandResult, call: SshCall, note: str) -> ToolResult:
    """The terminal's result, with pty line ends undone, the host, and ssh's own failure."""
    output = result.output.replace("\r\n", "\n")
    base = command_result(attrs.evolve(result, output=output), note)
    data = {**(base.data or {}), "host": call.alias}
    if base.ok:
        return attrs.evolve(base, data=data)
    error = base.error or ""
    if result.exit_code == SSH_FAILED:
        error += (
            " (255 is also ssh's own code: the connection, the host key or the login may "
            "have failed; the output says which)"
        )
    return attrs.evolve(base, error=f"on {call.alias}: {error}", data=data)


class SshExecTool:
    name = "ssh_exec"
    parameters = schema(SshArgs)

    def __init__(self, settings: Settings | None = None) -> None:
        default = (settings or Settings()).terminal_timeout_sec
        self.description = (
            "Run one command on a configured remote host over SSH and get its output and "
            f"exit code (timeout default and maximum {default:g} s). Some hosts allow only "
            "certain programs. Manual: read `manual:ssh_exec` with the filesystem tool."
        )

    def precheck(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult | None:
        """A failed result for a call that cannot run (host, command), else None."""
        try:
            plan_call(parse(SshArgs, args), ctx.config.ssh)
        except ToolInputError as exc:
            return ToolResult.fail(str(exc))
        return None

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            parsed = parse(SshArgs, args)
            call = plan_call(parsed, ctx.config.ssh)
            timeout, note = read_timeout(parsed.timeout, ctx.settings)
        except ToolInputError as exc:
            return ToolResult.fail(str(exc))
        client = shutil.which("ssh")
        if client is None:
            return ToolResult.fail("the OpenSSH client (ssh) is not installed on this machine")
        try:
            result = await run_command(
                [client, *call.argv[1:]],
                cwd=Path("/"),
                time_limit=timeout,
                progress=output_progress(ctx),
                max_chars=ctx.settings.tool_output_max_chars,
                env={"TERM": "dumb"},  # the remote pty's TERM: no colours, no cursor codes
                owner=tag_owner(ctx.settings.data_dir),
                cgroup=session_cgroup(ctx),
            )
        except OSError as exc:
            return ToolResult.fail(f"cannot start ssh: {exc.strerror or exc}")
        return ssh_result(result, call, note)
