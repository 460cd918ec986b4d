"""ssh_exec against a real OpenSSH server on 127.0.0.1 (issue 12), its config and policy.

Rules for this module: loopback only; the server is `sshd_server` (tests/sshd.py), a
real sshd started once per session, and every test that needs it is skipped, with the
reason, when it cannot start. Real processes: every I/O test runs under a real
`trio.fail_after`; nothing sleeps: output is awaited through emitted lines, deaths
through pidfds, and timeouts run on a MockClock moved by hand once the remote command
has printed (`jump_after_line`). The server runs on this machine, so a "remote"
process is visible in /proc: the tests look for it there by a unique argument.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from bg_tools import call, calls, of_type, profile
from kvfake import PidWatch, Recorder, jump_after_line, make_ctx, pids_in
from sshd import SSHD, SshServer, start_sshd
from sshd import sshd_server as sshd_server  # the fixture

from navi_trio.cli.doctor import collect_doctor, print_doctor
from navi_trio.core.turn.policy import CallFacts, decide, summary
from navi_trio.errors import ConfigError
from navi_trio.profiles import ConfigSource, NaviConfig, check_config, parse_config
from navi_trio.settings import Settings, default_config_path
from navi_trio.testing import open_harness
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.ssh_exec import SshExecTool, ssh_argv

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 30
# What an ssh_exec call needs to run without asking (workspace mode asks by default).
ALLOW_SSH = {"rules": [{"tool": "ssh_exec", "decision": "allow"}]}


def config_data(ssh: dict[str, Any] | None, **profiles: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(default_config_path().read_text(encoding="utf-8"))
    if ssh is not None:
        data["ssh"] = ssh
    for pid, changes in profiles.items():
        data["profiles"][pid] = {**data["profiles"].get(pid, {}), **changes}
    return data


def config_with(ssh: dict[str, Any] | None, **profiles: dict[str, Any]) -> NaviConfig:
    return parse_config(config_data(ssh, **profiles), default_config_path())


def ssh_ctx(
    tmp_path: Path, ssh: dict[str, Any] | None, rec: Recorder | None = None, **settings: Any
) -> ToolContext:
    ctx = make_ctx(tmp_path, recorder=rec, **settings)
    return attrs.evolve(ctx, config=config_with(ssh))


async def run(ctx: ToolContext, **args: Any) -> ToolResult:
    with trio.fail_after(TIMEOUT):
        return await SshExecTool().execute(args, ctx)


def unique_seconds() -> str:
    """A `sleep` argument no other process on this machine has."""
    return f"{3000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"


def with_token(token: str) -> dict[int, str]:
    """Live processes (not zombies) whose command line holds `token`: pid -> cmdline."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile
        if token in cmdline:
            found[int(entry.name)] = cmdline
    return found


def _settled_cmdline(pid: int) -> str:
    path = Path(f"/proc/{pid}/cmdline")
    while not (cmdline := path.read_bytes().replace(b"\0", b" ").decode()):
        time.sleep(0.001)  # an exec in progress: a few microseconds of CPU
    return cmdline


async def runs_with(pid: int, token: str) -> None:
    """`pid`'s command line holds `token`. The remote shell writes its pid, then execs the
    sleep: read in the middle of that exec, /proc gives an empty command line (the new
    program's arguments are not in place yet), and only then is it read again."""
    cmdline = await trio.to_thread.run_sync(_settled_cmdline, pid, abandon_on_cancel=True)
    assert token in cmdline, cmdline


async def wait_gone(pid: int) -> None:
    watch = PidWatch([pid])
    try:
        await watch.wait_exited()
    finally:
        watch.close()


def marker(tmp_path: Path, name: str = "chained") -> Path:
    path = tmp_path / name
    assert not path.exists()
    return path


# -- real commands through the real server ---------------------------------------------


async def test_success_streams_output_and_reports_exit_code_zero(
    tmp_path: Path, sshd_server: SshServer
) -> None:
    rec = Recorder()
    ctx = ssh_ctx(tmp_path, sshd_server.ssh_section(box=None), rec)
    result = await run(ctx, host="box", command="echo one; echo two >&2; echo three")
    assert result.ok, result.content()
    assert rec.lines() == ["one", "two", "three"]  # live, as tool events
    assert result.output.startswith("one\ntwo\nthree\n") and "\r" not in result.output
    assert result.output.endswith("[exit code 0]")
    assert result.data is not None
    assert (result.data["exit_code"], result.data["host"]) == (0, "box")


async def test_non_zero_exit_is_a_failure_with_the_output_and_code(
    tmp_path: Path, sshd_server: SshServer
) -> None:
    ctx = ssh_ctx(tmp_path, sshd_server.ssh_section(box=None))
    result = await run(ctx, host="box", command="echo broken; exit 3")
    assert not result.ok
    assert "on box: the command exited with code 3" in (result.error or "")
    assert "broken" in result.output
    assert result.data is not None and result.data["exit_code"] == 3


async def test_output_is_capped_head_and_tail(tmp_path: Path, sshd_server: SshServer) -> None:
    ctx = ssh_ctx(tmp_path, sshd_server.ssh_section(box=None), tool_output_max_chars=300)
    command = "echo FIRST; seq 1 20000; echo LAST"
    result = await run(ctx, host="box", command=command)
    assert result.ok
    assert result.output.startswith("FIRST") and "LAST" in result.output
    assert "characters cut" in result.output and len(result.output) < 500


async def test_timeout_kills_the_local_ssh_and_the_remote_command(
    tmp_path: Path, sshd_server: SshServer, mock_clock: trio.testing.MockClock
) -> None:
    token = unique_seconds()
    rec = Recorder()
    ctx = ssh_ctx(tmp_path, sshd_server.ssh_section(box=None), rec, terminal_timeout_sec=1)
    # just past the cap: a cap that let a little more through would show
    args = {"host": "box", "command": f"echo pid $$; exec sleep {token}", "timeout": 2}
    result = await jump_after_line(
        mock_clock, lambda: SshExecTool().execute(args, ctx), rec, "pid ", 1.0
    )
    assert not result.ok
    assert "timed out after 1 s" in (result.error or "")
    assert "capped at 1 s" in result.output  # the terminal's cap applies
    (remote,) = pids_in(rec.lines())
    with trio.fail_after(TIMEOUT):
        await wait_gone(remote)
    assert with_token(token) == {}


async def test_stop_mid_command_leaves_neither_the_local_ssh_nor_the_remote_command(
    tmp_path: Path, sshd_server: SshServer
) -> None:
    token = unique_seconds()
    rec = Recorder()
    ctx = ssh_ctx(tmp_path, sshd_server.ssh_section(box=None), rec)
    args = {"host": "box", "command": f"echo pid $$; exec sleep {token}"}
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(SshExecTool().execute, args, ctx)
            (remote,) = pids_in(await rec.wait_lines("pid ", 1))
            await runs_with(remote, token)
            running = with_token(token)
            # Both ends are up: the local ssh (its argv holds the command) and the
            # remote shell, which becomes the sleep.
            assert remote in running, running
            assert any(c.startswith(("ssh ", "/usr/bin/ssh ")) for c in running.values())
            nursery.cancel_scope.cancel()  # what Stop does to an inline call
        await wait_gone(remote)
    assert with_token(token) == {}


async def test_an_unknown_host_key_is_refused_by_ssh(
    tmp_path: Path, sshd_server: SshServer
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    ssh = {**sshd_server.ssh_section(box=None), "known_hosts": str(empty)}
    made = marker(tmp_path)
    result = await run(ssh_ctx(tmp_path, ssh), host="box", command=f"touch {made}")
    assert not result.ok and "exited with code 255" in (result.error or "")
    assert "ssh's own code" in (result.error or "")
    assert "Host key verification failed" in result.output
    assert not made.exists()


# -- refused before anything runs -------------------------------------------------------


async def test_a_host_not_in_the_config_is_refused(tmp_path: Path, sshd_server: SshServer) -> None:
    made = marker(tmp_path)
    ctx = ssh_ctx(tmp_path, sshd_server.ssh_section(box=None, web=["uptime"]))
    result = await run(ctx, host="nope", command=f"touch {made}")
    assert not result.ok
    assert result.error == (
        "unknown host 'nope': ssh_exec reaches only the configured hosts (box, web)"
    )
    assert not made.exists()


async def test_a_program_not_allowed_on_the_host_is_refused(
    tmp_path: Path, sshd_server: SshServer
) -> None:
    made = marker(tmp_path)
    ctx = ssh_ctx(tmp_path, sshd_server.ssh_section(web=["echo", "uptime"]))
    result = await run(ctx, host="web", command=f"touch {made}")
    assert not result.ok
    assert "program 'touch' is not allowed on host 'web' (allowed: echo, uptime)" in (
        result.error or ""
    )
    assert not made.exists()


@pytest.mark.parametrize(
    "chain",
    ["; touch {m}", "&& touch {m}", "|| touch {m}", "| touch {m}", "$(touch {m})",
     "`touch {m}`", "\ntouch {m}", "> {m}", "& touch {m}"],
)  # fmt: skip
async def test_shell_metacharacters_cannot_chain_a_second_program(
    tmp_path: Path, sshd_server: SshServer, chain: str
) -> None:
    made = marker(tmp_path)
    ctx = ssh_ctx(tmp_path, sshd_server.ssh_section(web=["echo"]))
    command = "echo hi " + chain.format(m=made)
    result = await run(ctx, host="web", command=command)
    # echo ran, with the rest as plain arguments (split as the shell would, then quoted).
    assert result.ok, result.content()
    assert result.output.startswith("hi ")
    assert str(made) in result.output.splitlines()[0]
    assert not made.exists()


async def test_a_star_host_gives_the_command_line_to_the_remote_shell(
    tmp_path: Path, sshd_server: SshServer
) -> None:
    made = marker(tmp_path)
    ctx = ssh_ctx(tmp_path, sshd_server.ssh_section(box=None))
    result = await run(ctx, host="box", command=f"echo hi && touch {made}")
    assert result.ok and made.exists()


@pytest.mark.parametrize(
    "args, words",
    [
        ({"command": "ls"}, "argument 'host' is required"),
        ({"host": "box"}, "argument 'command' is required"),
        ({"host": "box", "command": "   "}, "argument 'command' is empty"),
        ({"host": "web", "command": "echo 'open"}, "cannot split the command"),
        ({"host": "box", "command": "ls", "timeout": 0}, "argument 'timeout'"),
    ],
)
async def test_bad_arguments_give_a_failed_result_naming_them(
    tmp_path: Path, args: dict[str, Any], words: str
) -> None:
    ssh = {
        "known_hosts": str(tmp_path / "kh"),
        "hosts": {
            "box": {"user": "u", "host": "h", "identity_file": "id", "commands": ["*"]},
            "web": {"user": "u", "host": "h", "identity_file": "id", "commands": ["echo"]},
        },
    }
    result = await run(ssh_ctx(tmp_path, ssh), **args)
    assert not result.ok and words in (result.error or ""), result.error


async def test_no_hosts_configured_is_a_clear_result(tmp_path: Path) -> None:
    for ssh in (None, {"known_hosts": "kh", "hosts": {}}):
        result = await run(ssh_ctx(tmp_path, ssh), host="box", command="uptime")
        assert not result.ok and "no ssh hosts are configured" in (result.error or "")


def test_the_argv_is_batch_mode_strict_and_has_no_local_shell(tmp_path: Path) -> None:
    cfg = config_with(
        {
            "known_hosts": "keys/known_hosts",
            "hosts": {
                "b": {
                    "user": "ops",
                    "host": "10.0.0.5",
                    "port": 2222,
                    "identity_file": "/keys/id",
                    "commands": ["*"],
                }
            },
        }  # fmt: skip
    )
    assert cfg.ssh is not None
    argv = ssh_argv(cfg.ssh, cfg.ssh.hosts["b"], "uptime; df -h")
    kh = default_config_path().parent / "keys" / "known_hosts"  # relative to the config
    assert argv[:11] == [
        "ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={kh}", "-o", "IdentitiesOnly=yes",
    ]  # fmt: skip
    assert argv[-7:] == ["-i", "/keys/id", "-p", "2222", "ops@10.0.0.5", "--", "uptime; df -h"]
    assert "-tt" in argv


# -- background, policy and the executor, through a runtime ------------------------------


def source(ssh: dict[str, Any] | None, **profiles: dict[str, Any]) -> ConfigSource:
    path = default_config_path()
    return ConfigSource(path, initial=parse_config(config_data(ssh, **profiles), path))


async def test_background_true_runs_through_the_task_supervisor(
    tmp_path: Path, sshd_server: SshServer
) -> None:
    token = unique_seconds()
    fifo = tmp_path / "up"
    os.mkfifo(fifo)
    prof = profile(["ssh_exec", "tasks"], policy=ALLOW_SSH, planning_first_message=False)
    config = source(sshd_server.ssh_section(box=None), remote=prof)
    replies = [
        calls(call("ssh_exec", host="box", command="echo remote-done", background=True)),
        {"text": "started"},
        calls(
            call(
                "ssh_exec",
                host="box",
                command=f"echo $$ > {fifo}; exec sleep {token}",
                background=True,
            )
        ),  # fmt: skip
        {"text": "started again"},
    ]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, config=config) as h:
            frames = await h.turn("s1", "run it", profile_id="remote")
            (result,) = of_type(frames, "tool_result", name="ssh_exec")
            assert result["ok"] and json.loads(result["output"])["status"] == "running"
            (job,) = h.runtime.supervisor.list_jobs("s1")
            await job.done.wait()
            assert job.status == "completed" and job.result is not None
            assert job.result.output.startswith("remote-done\n")
            assert any(getattr(e, "data", {}).get("text") == "remote-done" for e in job.ring)
            # A running remote command ends with its job's cancel (`tasks cancel`).
            await h.turn("s1", "again", profile_id="remote")
            (second,) = [j for j in h.runtime.supervisor.list_jobs("s1") if j is not job]
            # The remote shell writes its pid into the fifo: reading it waits for that.
            text = await trio.to_thread.run_sync(fifo.read_text, abandon_on_cancel=True)
            remote = int(text)
            await runs_with(remote, token)
            assert h.runtime.supervisor.cancel("s1", second.task_id)
            await second.done.wait()
            await wait_gone(remote)
    assert second.status == "cancelled"
    assert with_token(token) == {}


async def test_stop_of_the_run_ends_an_inline_remote_command(
    tmp_path: Path, sshd_server: SshServer
) -> None:
    token = unique_seconds()
    fifo = tmp_path / "up"
    os.mkfifo(fifo)
    prof = profile(["ssh_exec"], policy=ALLOW_SSH, planning_first_message=False)
    config = source(sshd_server.ssh_section(box=None), remote=prof)
    command = f"echo $$ > {fifo}; exec sleep {token}"
    replies = [calls(call("ssh_exec", host="box", command=command)), {"text": "never"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, config=config) as h:
            driver = await h.session("s1")
            driver.send("sleep there", profile_id="remote")
            await driver.until_type("tool_started")
            remote = int(await trio.to_thread.run_sync(fifo.read_text, abandon_on_cancel=True))
            await runs_with(remote, token)
            assert driver.stop()
            frames = await driver.until_end()
            await wait_gone(remote)
    (result,) = of_type(frames, "tool_result", name="ssh_exec")
    assert not result["ok"] and "stopped by the user" in result["error"]
    assert with_token(token) == {}


async def test_an_unconfigured_host_is_refused_before_anyone_is_asked(tmp_path: Path) -> None:
    # Workspace mode, no rule: a configured host would need approval first.
    config = source(None, remote=profile(["ssh_exec"], planning_first_message=False))
    replies = [calls(call("ssh_exec", host="web1", command="uptime")), {"text": "ok"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, config=config) as h:
            frames = await h.turn("s1", "uptime on web1?", profile_id="remote")
    assert of_type(frames, "approval_request") == []
    (result,) = of_type(frames, "tool_result", name="ssh_exec")
    assert not result["ok"] and "no ssh hosts are configured" in result["error"]


def test_policy_read_only_denies_workspace_and_full_ask_rules_allow() -> None:
    def decision(mode: str, policy: dict[str, Any] | None = None, **args: Any) -> str:
        prof = config_with(None, general={"policy": policy or {}}).profiles["general"]
        return decide(prof, "admin", mode, CallFacts.of("ssh_exec", args)).decision

    args: dict[str, Any] = {"host": "web1", "command": "uptime"}
    assert decision("workspace", **args) == "ask"
    assert decision("full", **args) == "ask"
    assert decision("read-only", **args) == "deny"
    # A rule may allow it (per host alias, the call's "action"), but never in read-only.
    rule = {"rules": [{"tool": "ssh_exec", "action": "web1", "match": "uptime*",
                       "decision": "allow"}]}  # fmt: skip
    assert decision("workspace", rule, **args) == "allow"
    assert decision("full", rule, **args) == "allow"
    assert decision("read-only", rule, **args) == "deny"
    assert decision("workspace", rule, host="db1", command="uptime") == "ask"
    assert decision("workspace", rule, host="web1", command="reboot") == "ask"
    assert summary("ssh_exec", args) == "ssh_exec web1: uptime"


# -- config, start-up and doctor ----------------------------------------------------------

GOOD_HOST = {"user": "ops", "host": "h", "identity_file": "id", "commands": ["uptime"]}


@pytest.mark.parametrize(
    "ssh, words",
    [
        ("yes", "$.ssh: expected an object"),
        ({"hosts": {}}, "required field missing @ $.ssh.known_hosts"),
        ({"known_hosts": "kh", "hosts": []}, "$.ssh.hosts: expected an object"),
        ({"known_hosts": "kh", "hosts": {"a": "ops@h"}}, "$.ssh.hosts['a']: expected an object"),
        ({"known_hosts": "kh", "hosts": {"a b": GOOD_HOST}}, "expected an alias without spaces"),
        ({"known_hosts": "kh", "hosts": {"a": {**GOOD_HOST, "user": "-oProxyCommand=x"}}},
         "user: expected a name without spaces, '@' or a leading '-'"),
        ({"known_hosts": "kh", "hosts": {"a": {**GOOD_HOST, "host": "x@y"}}}, "host: expected"),
        ({"known_hosts": "kh", "hosts": {"a": {**GOOD_HOST, "port": 0}}}, "port: expected a port"),
        ({"known_hosts": "kh", "hosts": {"a": {**GOOD_HOST, "port": "22"}}},
         "expected int (a whole number), got '22' @ $.ssh.hosts['a'].port"),
        ({"known_hosts": "kh", "hosts": {"a": {**GOOD_HOST, "commands": "*"}}},
         "expected a list of names, got '*' @ $.ssh.hosts['a'].commands"),
        ({"known_hosts": "kh", "hosts": {"a": {**GOOD_HOST, "commands": ["*", "ls"]}}},
         'commands: expected ["*"] or a list of program names'),
        ({"known_hosts": "kh", "hosts": {"a": {**GOOD_HOST, "commands": ["ls; rm"]}}},
         'commands: expected ["*"]'),
        ({"known_hosts": "kh", "hosts": {"a": {**GOOD_HOST, "commands": []}}}, "commands"),
        ({"known_hosts": "kh", "hosts": {"a": {**GOOD_HOST, "password": "x"}}},
         "extra fields found (password) @ $.ssh.hosts['a']"),
        ({"known_hosts": "kh", "hosts": {"a": {k: v for k, v in GOOD_HOST.items()
                                               if k != "identity_file"}}},
         "required field missing @ $.ssh.hosts['a'].identity_file"),
    ],
)  # fmt: skip
def test_a_bad_ssh_section_names_the_file_and_key(ssh: Any, words: str) -> None:
    path = default_config_path()
    with pytest.raises(ConfigError) as err:
        parse_config(config_data(ssh), path)
    assert str(path) in str(err.value) and words in str(err.value), str(err.value)


def test_start_up_refuses_missing_key_files_and_names_them(tmp_path: Path) -> None:
    (tmp_path / "id").write_text("key")
    ssh = {
        "known_hosts": str(tmp_path / "missing_known_hosts"),
        "hosts": {
            "a": {**GOOD_HOST, "identity_file": str(tmp_path / "id")},
            "b": {**GOOD_HOST, "identity_file": "~/no/such/key"},
        },
    }
    cfg = config_with(ssh)
    with pytest.raises(ConfigError) as err:
        check_config(cfg, default_config_path())
    text = str(err.value)
    assert f"$.ssh.known_hosts: {tmp_path / 'missing_known_hosts'} not found" in text
    assert f"$.ssh.hosts['b'].identity_file: {Path.home() / 'no/such/key'} not found" in text
    assert "hosts['a']" not in text
    (tmp_path / "missing_known_hosts").write_text("")
    with pytest.raises(ConfigError, match=r"hosts\['b'\]"):
        check_config(cfg, default_config_path())
    with pytest.raises(ConfigError, match="known_hosts"):
        check_config(config_with({**ssh, "known_hosts": "nowhere"}), default_config_path())


async def test_doctor_lists_the_hosts_and_reports_missing_files(tmp_path: Path) -> None:
    folder = tmp_path / "config"
    shutil.copytree(default_config_path().parent, folder)
    data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    data["ssh"] = {"known_hosts": "known_hosts", "hosts": {"web1": GOOD_HOST}}
    (folder / "config.json").write_text(json.dumps(data))
    (folder / "id").write_text("key")
    settings = Settings.from_env(
        {},
        config_path=folder / "config.json",
        db_path=tmp_path / "navi.db",
        data_dir=tmp_path,
        llm_url="http://127.0.0.1:9",
    )
    with trio.fail_after(TIMEOUT):
        report = await collect_doctor(settings, "ws://127.0.0.1:9")
    assert not report["ok"]
    assert any(f"$.ssh.known_hosts: {folder / 'known_hosts'} not found" in e
               for e in report["errors"])  # fmt: skip
    assert report["ssh"]["hosts"] == {"web1": "ops@h:22"}
    (folder / "known_hosts").write_text("")
    with trio.fail_after(TIMEOUT):
        report = await collect_doctor(settings, "ws://127.0.0.1:9")
    assert report["config"]["ok"], report["errors"]
    out = io.StringIO()
    print_doctor(report, out)
    assert "ssh          1 host: web1 (ops@h:22)" in out.getvalue()


def test_an_sshd_that_cannot_start_gives_the_reason_to_skip_with(tmp_path: Path) -> None:
    if not SSHD.exists():
        pytest.skip(f"{SSHD} not found")
    why = start_sshd(tmp_path, "nobody")  # no host key in the folder
    assert isinstance(why, str) and why.startswith("sshd did not start"), why
    assert "no hostkeys available" in why
