"""What every `navi` subcommand shares: exit codes, the usage error, one-line messages,
the settings from the environment and the command line, and where a command's
requests go (`run_target`). It imports no other module of the `navi` command.
"""

from __future__ import annotations

import argparse
import importlib
import os
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TextIO, TypeVar

import attrs
import trio

from navi_trio.api.remote import DEFAULT_URL
from navi_trio.errors import ConfigError
from navi_trio.errors import UsageError as UsageError
from navi_trio.llm.factory import (
    BACKENDS,
    LOCAL_PROFILE,
    backend_configured,
    choose_backend,
)
from navi_trio.profiles import ConfigSource
from navi_trio.settings import Settings, is_db_url
from navi_trio.text import terminal_safe

if TYPE_CHECKING:
    from navi_trio.api.endpoint import RunTarget

T = TypeVar("T")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
DEBUG_HINT = "(run with NAVI_DEBUG=1 for the traceback)"

Command = Callable[[argparse.Namespace, TextIO, TextIO], int]


def add_token_option(p: argparse.ArgumentParser) -> None:
    """--token of a command that speaks to a daemon."""
    p.add_argument("--token", metavar="T", help="token (env NAVI_TOKEN, else local-token)")


def add_client_options(p: argparse.ArgumentParser) -> None:
    """--url, --token and --json of a command that asks a daemon and prints its reply."""
    p.add_argument("--url", help=f"the daemon (default: {DEFAULT_URL} if it answers)")
    add_token_option(p)
    p.add_argument("--json", action="store_true", help="print the daemon's replies as JSON")


def lazy_command(module: str, name: str) -> Command:
    """`navi_trio.cli.<module>.<name>`, imported only when the command runs, so that
    `navi --help` and the other commands stay light."""

    def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
        command: Command = getattr(importlib.import_module(f"navi_trio.cli.{module}"), name)
        return command(args, out, err)

    return run


class InThread(Generic[T]):
    """A blocking call started in a worker thread at once; `result()` awaits it.

    Start-up runs slow set-up this way (the LLM client's CA certificates, the sandbox
    probe: both wait mostly outside the GIL) while the trio thread imports what follows.
    """

    def __init__(self, fn: Callable[..., T], *args: Any) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._call, args=(fn, *args), daemon=True)
        self._thread.start()

    def _call(self, fn: Callable[..., T], *args: Any) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # raised again in the caller's task by `result()`
            self._error = exc

    async def result(self) -> T:
        if self._thread.is_alive():
            await trio.to_thread.run_sync(self._thread.join)
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set when no error was


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines too) made one space, safe to print
    (`terminal_safe`)."""
    return terminal_safe(" ".join(text.split()))


def load_settings(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    """Settings from the environment, with the command-line options winning."""
    overrides: dict[str, Any] = {}
    db = getattr(args, "db", None)
    if db is not None:  # a file (SQLite) or a postgresql:// URL, as NAVI_DB
        text = str(db)
        overrides.update(
            {"db_url": text.strip()} if is_db_url(text) else {"db_path": Path(text).expanduser()}
        )
    for option, field in (
        ("config", "config_path"),
        ("llm_url", "llm_url"),
        ("backend", "llm_backend"),
        ("model_file", "model_file"),
    ):
        value = getattr(args, option, None)
        if value is not None:
            overrides[field] = value.expanduser() if isinstance(value, Path) else value
    if getattr(args, "local", False):
        if "llm_backend" in overrides or "llm_url" in overrides:
            raise UsageError("--local runs the embedded model: leave out --backend and --llm-url")
        overrides["llm_backend"] = "local"
    settings = Settings.from_env(os.environ if environ is None else environ, **overrides)
    if settings.llm_backend.strip().lower() not in BACKENDS:
        raise ConfigError(
            f"NAVI_LLM_BACKEND={settings.llm_backend!r} is not a known LLM backend "
            f"(expected one of: {', '.join(BACKENDS)})"
        )
    return attrs.evolve(settings, llm_url=normalize_llm_url(settings.llm_url))


def llm_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) for name in ("local", "backend", "llm_url"))


def llm_settings(
    args: argparse.Namespace, err: TextIO, environ: dict[str, str] | None = None
) -> Settings:
    """`load_settings`, with the backend chosen when none is configured: Ollama if it
    answers at the default URL, else the embedded local model (said in one line on
    `err`), else ConfigError saying how to get either.
    """
    return trio.run(chosen_llm_settings, args, err, environ)


async def chosen_llm_settings(
    args: argparse.Namespace, err: TextIO, environ: dict[str, str] | None = None
) -> Settings:
    """`llm_settings` in a trio run of the caller's."""
    env = dict(os.environ) if environ is None else environ
    settings = load_settings(args, env)
    configured = backend_configured(env, given=llm_given(args))
    choice = await choose_backend(settings, env, configured=configured)
    if choice.note:
        print(f"navi: {choice.note}", file=err, flush=True)
    return choice.settings


# Options that configure a private daemon's runtime: a daemon has its own.
EMBEDDED_OPTIONS = ("db", "config", "llm_url", "backend", "local", "model_file")


def run_target(args: argparse.Namespace, settings: Settings) -> RunTarget:
    """Where a command's requests go (`RunTarget`: its --url and --token, and whether an
    option configures a private daemon); --url with such an option is refused."""
    from navi_trio.api.endpoint import RunTarget
    from navi_trio.client.daemon import host_port

    explicit = getattr(args, "url", None) is not None
    if explicit:
        host_port(args.url)  # a bad --url is named here, not by the WebSocket library
    embedded = [o for o in EMBEDDED_OPTIONS if getattr(args, o, None) not in (None, False)]
    if explicit and embedded:
        names = ", ".join("--" + o.replace("_", "-") for o in embedded)
        raise UsageError(
            f"--url runs the turn in the daemon, which has its own settings: drop {names} or --url"
        )
    return RunTarget(
        getattr(args, "url", None),
        getattr(args, "token", None),
        settings.data_dir,
        bool(embedded),
    )


def config_source(settings: Settings) -> ConfigSource:
    """The config; with the local backend, new sessions get the `local` profile."""
    local = settings.llm_backend.strip().lower() == "local"
    return ConfigSource(settings.config_path, default_profile=LOCAL_PROFILE if local else None)


_OLLAMA_PORT = 11434
# Listening on "all interfaces" means "this machine" to a client, as Ollama reads it.
_ANY_ADDRESS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "[::1]"}


def normalize_llm_url(url: str) -> str:
    """The LLM URL as a client uses it, from what Ollama accepts in OLLAMA_HOST.

    A bare ``host[:port][/path]`` gets ``http://`` and port 11434; the any-address hosts
    0.0.0.0 and :: become the loopback address. ConfigError otherwise.
    """
    text = url.strip()
    if "://" not in text:
        hostport, slash, path = text.partition("/")
        host, port = _split_host_port(hostport)
        host = f"[{host}]" if ":" in host else host
        text = f"http://{host}:{port or _OLLAMA_PORT}{slash}{path}"
    parts = urllib.parse.urlsplit(text)
    where = f"LLM URL {_cut(url)!r} (--llm-url or OLLAMA_HOST)"
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{where}: expected an http:// or https:// URL or host[:port]")
    try:
        number = parts.port
    except ValueError:
        raise ConfigError(f"{where}: the port is not a number from 1 to 65535") from None
    host = parts.hostname or ""
    if host in _ANY_ADDRESS:
        netloc = _ANY_ADDRESS[host] + (f":{number}" if number is not None else "")
        parts = parts._replace(netloc=netloc)
    return urllib.parse.urlunsplit(parts)


def _split_host_port(hostport: str) -> tuple[str, str]:
    if hostport.startswith("["):  # [v6]:port
        host, _, rest = hostport[1:].partition("]")
        return host, rest.removeprefix(":")
    if hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
        return host, port
    return hostport, ""  # a name, an IPv4 address, or a bare IPv6 address


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text)} characters)"
