"""What a tool process gets of the daemon's environment, and which Unix sockets a
sandboxed command can reach (issue 17, "Weaker than it should be").

Rules: real processes (and the real bwrap for the sandboxed cases, skipped with the
probe's reason where it cannot run); loopback only; every test bounded by
`trio.fail_after`; nothing sleeps.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest
import trio
from kvfake import make_ctx
from test_confinement import base  # noqa: F401  (a fixture: a folder outside /tmp)

from navi_trio.errors import ConfigError
from navi_trio.profiles import parse_config
from navi_trio.settings import default_config_path
from navi_trio.tools.base import ToolContext
from navi_trio.tools.code_exec import CodeExecTool
from navi_trio.tools.private import private_paths
from navi_trio.tools.procs import PASSED_VARS, TAG_VAR, ProcessPool, child_env
from navi_trio.tools.sandbox import SandboxSpec, sandbox_available
from navi_trio.tools.terminal import TerminalTool

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 30
OK, REASON = sandbox_available()
needs_sandbox = pytest.mark.skipif(not OK, reason=f"the sandbox is unavailable: {REASON}")

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
    "GITHUB_TOKEN": "ghp_github-secret-value",
    "ANTHROPIC_API_KEY": "sk-ant-secret-value",
    "DATABASE_URL": "postgresql://app:db-password-value@db/app",
    "NAVI_AUTH": "navi-auth-value",
    "NAVI_CREDENTIALS": "navi-credentials-value",
    "NAVI_DB_PASS": "navi-db-pass-value",
}
PASSED = "NAVI_TEST_PASSED_ON"  # named by the profile's env


@pytest.fixture
def daemon_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(PASSED, "passed-value")
    monkeypatch.setenv("LC_TEST_LOCALE", "kept-locale")


def passing(ctx: ToolContext, *names: str) -> ToolContext:
    return attrs.evolve(ctx, profile=attrs.evolve(ctx.profile, env=names))


def parse_env(output: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in output.splitlines() if "=" in line)
    return {k: v for k, v in pairs}


def assert_allow_listed(env: dict[str, str], ctx: ToolContext) -> None:
    assert not any(value in json.dumps(env) for value in SECRETS.values()), env
    assert env.get(PASSED) == "passed-value", env
    assert env.get("LC_TEST_LOCALE") == "kept-locale"
    assert env.get("HOME") == str(ctx.session_dir)  # HOME is the session folder
    assert env.get("PATH") == os.environ["PATH"]
    assert TAG_VAR in env


@pytest.mark.usefixtures("daemon_env")
@pytest.mark.parametrize("sandboxed", [False, pytest.param(True, marks=needs_sandbox)])
async def test_only_the_allow_list_and_the_profiles_names_reach_a_command(
    tmp_path: Path, sandboxed: bool
) -> None:
    ctx = passing(make_ctx(tmp_path), PASSED)
    ctx.session_dir.mkdir(parents=True)
    if sandboxed:
        ctx = attrs.evolve(ctx, sandbox=SandboxSpec(writable=(ctx.session_dir,)))
    code = "import os\nfor k, v in os.environ.items(): print(f'{k}={v}')"
    with trio.fail_after(TIMEOUT):
        shell = await TerminalTool().execute({"action": "run", "command": "env"}, ctx)
        python = await CodeExecTool().execute({"code": code}, ctx)
    for result in (shell, python):
        assert result.ok, result.content()
        env = parse_env(result.output)
        assert_allow_listed(env, ctx)
        # Nothing but the allow-list, the names passed and what the shell sets itself.
        own = {"PWD", "SHLVL", "_", "OLDPWD", "PYTHONUNBUFFERED", TAG_VAR, PASSED}
        extra = {k for k in env if k not in PASSED_VARS and not k.startswith("LC_")} - own
        assert not extra, extra


@pytest.mark.usefixtures("daemon_env")
async def test_a_persistent_process_gets_the_same_environment(tmp_path: Path) -> None:
    pool = ProcessPool()
    ctx = passing(make_ctx(tmp_path, services=SimpleNamespace(processes=pool)), PASSED)
    ctx.session_dir.mkdir(parents=True)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            opened = await TerminalTool().execute({"action": "open", "command": "env"}, ctx)
            assert opened.ok and opened.data is not None, opened.content()
            handle = opened.data["handle"]
            assert await pool.wait_exit(ctx.session_id, handle) == 0
            output = (await pool.read(ctx.session_id, handle, 1_000_000)).output
            nursery.cancel_scope.cancel()
    assert_allow_listed(parse_env(output), ctx)


@pytest.mark.usefixtures("daemon_env")
async def test_a_profile_passing_home_gets_the_daemons_home(tmp_path: Path) -> None:
    ctx = passing(make_ctx(tmp_path), "HOME")
    with trio.fail_after(TIMEOUT):
        result = await TerminalTool().execute({"action": "run", "command": "env"}, ctx)
    assert parse_env(result.output)["HOME"] == os.environ["HOME"]


@pytest.mark.usefixtures("daemon_env")
def test_child_env_is_an_allow_list() -> None:
    env = child_env()
    assert set(env) <= {*PASSED_VARS, "PYTHONUNBUFFERED"} | {k for k in env if k[:3] == "LC_"}
    assert not set(SECRETS) & set(env)


def test_a_profile_env_is_checked_strictly() -> None:
    path = default_config_path()
    for env, expected in (
        ("PATH", "expected a list of names"),
        (["1BAD"], "expected environment variable names"),
        (["NAVI_LLM_API_KEY"], "NAVI_LLM_API_KEY hold navi's own secrets"),
        (["NAVI_WS_TOKEN"], "NAVI_WS_TOKEN hold navi's own secrets"),
    ):
        data = json.loads(path.read_text(encoding="utf-8"))
        data["profiles"]["coder"]["env"] = env
        with pytest.raises(ConfigError) as info:
            parse_config(data, path)
        assert "$.profiles['coder'].env" in str(info.value) and expected in str(info.value)


def config_naming_secrets(**coder_env: list[str]) -> tuple[dict[str, object], Path]:
    """The shipped config with a peer's token in LAB_TOKEN, an MCP server holding a
    GITHUB_TOKEN, and `coder_env` as the coder profile's env."""
    path = default_config_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    data["peers"] = {"lab": {"url": "ws://127.0.0.1:9/", "token_env": "LAB_TOKEN"}}
    data["mcp_servers"] = {"gh": {"command": "gh-mcp", "env": {"GITHUB_TOKEN": "x", "LANG": "C"}}}
    data["profiles"]["coder"]["env"] = coder_env.get("env", [])
    return data, path


def test_a_variable_the_config_names_as_a_secret_is_refused_in_a_profile_env() -> None:
    for env, expected in (
        (["LAB_TOKEN"], "LAB_TOKEN holds the token of peers.lab"),
        (["lab_token"], "lab_token holds the token of peers.lab"),
        (["GITHUB_TOKEN"], "GITHUB_TOKEN holds a secret of mcp_servers.gh"),
        (["NAVI_DB"], "NAVI_DB hold navi's own secrets"),
    ):
        data, path = config_naming_secrets(env=env)
        with pytest.raises(ConfigError) as info:
            parse_config(data, path)
        assert "$.profiles['coder'].env" in str(info.value) and expected in str(info.value)
    data, path = config_naming_secrets(env=["LANG", PASSED])  # not a secret: passed on
    assert parse_config(data, path).profiles["coder"].env == ("LANG", PASSED)


@pytest.mark.usefixtures("daemon_env")
async def test_a_peers_token_never_reaches_a_command_even_if_a_profile_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAB_TOKEN", "lab-peer-token-value")
    data, path = config_naming_secrets()
    ctx = passing(make_ctx(tmp_path), PASSED, "LAB_TOKEN")  # as a config made by hand
    ctx = attrs.evolve(ctx, config=parse_config(data, path))
    with trio.fail_after(TIMEOUT):
        result = await TerminalTool().execute({"action": "run", "command": "env"}, ctx)
    assert result.ok, result.content()
    env = parse_env(result.output)
    assert env.get(PASSED) == "passed-value" and "LAB_TOKEN" not in env, env
    assert "lab-peer-token-value" not in result.output


# -- Unix sockets ----------------------------------------------------------------------


def listening(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(1)
    return sock


PROBE = (
    "import socket, sys\n"
    "for path in sys.argv[1:]:\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    try:\n"
    "        s.connect(path)\n"
    "        print('connected', path)\n"
    "    except OSError as exc:\n"
    "        print('refused', path, type(exc).__name__)\n"
)


@needs_sandbox
async def test_a_sandboxed_command_reaches_no_host_socket_by_its_path(
    tmp_path: Path,
    base: Path,  # noqa: F811
) -> None:
    """A socket in the data folder, one in a visible folder (the whole root is readable),
    one in /run when we may make one there: none connects from inside; one in the
    command's own writable folder still does, and outside the sandbox (run by this
    process) all of them do."""
    outside = base
    data = outside / "data"
    ctx = make_ctx(tmp_path)
    settings = attrs.evolve(ctx.settings, data_dir=data)
    ctx = attrs.evolve(ctx, settings=settings, session_dir=settings.session_dir("s1"))
    ctx.session_dir.mkdir(parents=True)
    private = private_paths(ctx.settings, ctx.session_dir)
    sandbox = SandboxSpec(writable=(ctx.session_dir,), private=private)
    hidden = [data / "daemon.sock", outside / "elsewhere" / "service.sock"]
    run_dir = Path("/run") / f"navi-test-{secrets.token_hex(4)}"
    if os.access("/run", os.W_OK):
        hidden.append(run_dir / "run.sock")
    own = ctx.session_dir / "own.sock"
    socks = [listening(p) for p in [*hidden, own]]
    script = ctx.session_dir / "probe.py"
    script.write_text(PROBE)
    argv = [sys.executable, "-I", str(script), *map(str, [*hidden, own])]
    command = " ".join(argv)
    try:
        with trio.fail_after(TIMEOUT):
            inside = await TerminalTool().execute(
                {"action": "run", "command": command}, attrs.evolve(ctx, sandbox=sandbox)
            )
            # The probe itself, run as this process: it reaches every socket.
            host = await trio.run_process(argv, capture_stdout=True, check=False)
    finally:
        for s in socks:
            s.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    probed = host.stdout.decode()
    assert probed.count("connected") == len(hidden) + 1, probed  # the probe works
    for path in hidden:
        assert f"refused {path}" in inside.output, inside.output
    assert f"connected {own}" in inside.output, inside.output


@needs_sandbox
async def test_a_sandboxed_command_sees_run_empty(tmp_path: Path) -> None:
    """/run holds the host's sockets, some bound in another network namespace (which
    /proc/net/unix does not list, so no /dev/null covers them one by one), and its pid
    and lock files: a sandboxed command finds it empty."""
    if not os.access("/run", os.W_OK):
        pytest.skip("nothing of ours can be put in /run here")
    ctx = make_ctx(tmp_path)
    ctx.session_dir.mkdir(parents=True)
    private = private_paths(ctx.settings, ctx.session_dir)
    sandbox = SandboxSpec(writable=(ctx.session_dir,), private=private)
    mark = Path("/run") / f"navi-test-{secrets.token_hex(4)}"
    mark.mkdir()
    try:
        with trio.fail_after(TIMEOUT):
            inside = await TerminalTool().execute(
                {"action": "run", "command": "ls -A /run /var/run"},
                attrs.evolve(ctx, sandbox=sandbox),
            )
    finally:
        mark.rmdir()
    assert inside.ok, inside.error
    assert inside.output.split() == ["/run:", "/var/run:", "[exit", "code", "0]"], inside.output
