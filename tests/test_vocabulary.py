"""The vocabulary: events, settings, the config file and the error tree.

No I/O beyond files under tmp_path; no sleeping (hot reload bumps the mtime by hand).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import shutil
import types
import typing
from pathlib import Path
from typing import Any

import attrs
import cattrs
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from quick_run import examples

from navi_trio import errors, events
from navi_trio.errors import ConfigError, LLMError, LLMTimeoutError, NaviError
from navi_trio.events import EVENT_CLASSES, event_from_dict, event_to_dict, event_types
from navi_trio.profiles import AgentProfile, ConfigSource, load_config
from navi_trio.settings import REPO_ROOT, Settings
from navi_trio.strict import describe, strict_converter

SHIPPED_CONFIG = REPO_ROOT / "config" / "config.json"

# ------------------------------------------------------------------------- events

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


def _strategy_for(typ: Any) -> st.SearchStrategy[Any]:
    """A strategy for one attrs field type, built from the resolved annotation."""
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if typ is str:
        return st.text()
    if typ is bool:
        return st.booleans()
    if typ is int:
        return st.integers()
    if typ is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if typ is Any:
        return _json
    if origin is dict:
        return st.dictionaries(st.text(), _json, max_size=4)
    if origin is tuple:
        return st.lists(_strategy_for(args[0]), max_size=3).map(tuple)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_strategy_for(a) for a in args))
    if typ is type(None):
        return st.none()
    if attrs.has(typ):
        return _builds(typ)
    raise AssertionError(f"no strategy for field type {typ!r}: extend the test")


def _builds(cls: type) -> st.SearchStrategy[Any]:
    attrs.resolve_types(cls)
    return st.builds(cls, **{f.name: _strategy_for(f.type) for f in attrs.fields(cls)})


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: c.__name__)
def test_every_event_class_round_trips_through_json(cls: type[events.AgentEvent]) -> None:
    @hyp_settings(
        max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    @given(_builds(cls))
    def check(event: events.AgentEvent) -> None:
        data = event_to_dict(event)
        assert next(iter(data)) == "type" and data["type"] == cls.type
        wire = json.loads(json.dumps(data))
        assert event_from_dict(wire) == event
        # A wire frame carries session_id and seq too: they are ignored.
        assert event_from_dict({**wire, "session_id": "s-1", "seq": 7}) == event

    check()


def test_subagent_marks_survive_the_round_trip() -> None:
    for cls in EVENT_CLASSES:
        attrs.resolve_types(cls)
        required = {
            f.name: _example(f.type)
            for f in attrs.fields(cls)
            if f.default is attrs.NOTHING and not f.kw_only
        }
        plain = cls(**required)
        marked = attrs.evolve(plain, is_subagent=True, agent_id="agent-7")
        back = event_from_dict(json.loads(json.dumps(event_to_dict(marked))))
        assert back == marked and back != plain
        assert back.is_subagent is True and back.agent_id == "agent-7"


def _example(typ: Any) -> Any:
    return {str: "x", bool: True, int: 3, float: 1.5}[typ]


def test_every_event_class_has_its_own_type_tag() -> None:
    tags = [cls.type for cls in EVENT_CLASSES]
    assert all(tags) and len(set(tags)) == len(EVENT_CLASSES)
    assert event_types() == {cls.type: cls for cls in EVENT_CLASSES}
    # The wire names the spec and clients use.
    assert events.ErrorEvent.type == "error" and events.StreamEnd.type == "stream_end"
    assert events.PlanCreated.type == "plan" and events.TextDelta.type == "text_delta"


def test_every_event_subclass_in_the_module_is_registered() -> None:
    defined = {
        obj
        for obj in vars(events).values()
        if inspect.isclass(obj)
        and issubclass(obj, events.AgentEvent)
        and obj is not events.AgentEvent
    }
    assert defined == set(EVENT_CLASSES)


def test_unknown_event_type_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match="no_such_event"):
        event_from_dict({"type": "no_such_event", "text": "x"})
    with pytest.raises(ValueError, match="unknown event type"):
        event_from_dict({"text": "x"})


def test_an_unknown_field_in_an_event_dict_is_rejected() -> None:
    with pytest.raises(cattrs.BaseValidationError):
        event_from_dict({"type": "text_delta", "text": "a", "surprise": 1})


# ------------------------------------------------------------------------- settings


def _changed(field: attrs.Attribute[Any], tmp_path: Path) -> tuple[str, Any]:
    """An env value different from the field's default, and the value it must produce."""
    default = getattr(Settings(), field.name)
    typ: Any = field.type  # a string: settings.py uses `from __future__ import annotations`
    if typ == "bool":
        return ("false" if default else "true"), not default
    if typ == "int":
        return str(default + 3), default + 3
    if typ == "float" and field.metadata.get("fraction"):
        return str(default / 2), default / 2
    if typ == "float":
        return str(default + 1.5), default + 1.5
    if typ in ("Path", "Path | None"):
        return str(tmp_path / field.name), tmp_path / field.name
    if typ == "tuple[str, ...]":
        return " alpha, beta ,", ("alpha", "beta")
    assert typ == "str", f"unexpected settings field type {typ!r}: extend the test"
    choices = field.metadata.get("choices")
    if choices:  # one word of a few: another one
        other = next(c for c in choices if c != default)
        return other, other
    if field.name == "db_url":  # NAVI_DB's URL form (its path form sets db_path)
        return "postgresql://navi@127.0.0.1:5432/navi", "postgresql://navi@127.0.0.1:5432/navi"
    return "changed-value", "changed-value"


def test_every_setting_has_its_own_env_var() -> None:
    names = [f.metadata.get("env") for f in attrs.fields(Settings)]
    assert all(names), [f.name for f in attrs.fields(Settings) if not f.metadata.get("env")]
    # One variable, two settings, on purpose: NAVI_DB is a file (db_path) or a URL (db_url).
    shared = {f.name for f in attrs.fields(Settings) if f.metadata.get("env") == "NAVI_DB"}
    assert shared == {"db_path", "db_url"}
    assert len(set(names)) == len(names) - 1


def test_navi_db_sets_the_path_or_the_url_by_its_form(tmp_path: Path) -> None:
    as_file = Settings.from_env({"NAVI_DB": str(tmp_path / "x.db")})
    assert (as_file.db_path, as_file.db_url) == (tmp_path / "x.db", "")
    as_url = Settings.from_env({"NAVI_DB": "postgres://u@127.0.0.1/db"})
    assert as_url.db_url == "postgres://u@127.0.0.1/db" and as_url.db_path == Settings().db_path


@pytest.mark.parametrize("field", attrs.fields(Settings), ids=lambda f: f.name)
def test_each_env_var_changes_its_setting(field: attrs.Attribute[Any], tmp_path: Path) -> None:
    raw, expected = _changed(field, tmp_path)
    env_name = field.metadata["env"]
    value = getattr(Settings.from_env({env_name: raw}), field.name)
    assert value == expected and value != getattr(Settings(), field.name)
    # An override passed in code wins over the environment.
    default = getattr(Settings(), field.name)
    overridden = Settings.from_env({env_name: raw}, **{field.name: default})
    assert getattr(overridden, field.name) == default


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_NUM_CTX", "16384")
    assert Settings.from_env().num_ctx == 16384


def test_spec_defaults() -> None:
    s = Settings.from_env({})
    assert (s.first_chunk_timeout, s.chunk_timeout) == (90.0, 60.0)
    assert s.context_message_token_budget == 0 and s.message_token_budget == s.num_ctx // 6
    assert Settings.from_env({"OLLAMA_NUM_CTX": "12000"}).message_token_budget == 2000
    assert Settings.from_env({"CONTEXT_MESSAGE_TOKEN_BUDGET": "700"}).message_token_budget == 700
    caps = (
        s.tasks_max_per_session,
        s.tasks_max_global,
        s.tasks_max_spawn,
        s.tasks_rate_limit,
        s.tasks_ttl_sec,
        s.task_notes_per_turn,
        s.task_notes_max_pending,
        s.message_queue_max,
    )
    assert caps == (5, 20, 2, 10, 3600, 5, 20, 5)
    assert s.tasks_rate_window_sec == 300 and s.tasks_wait_max_sec == 120
    assert s.tasks_keep_finished == 50 and s.spawn_timeout_sec == 300
    assert s.backgroundable_tools == ("terminal", "ssh_exec", "peer", "spawn_agent", "code_exec")
    assert s.parallel_tool_calls is False


@pytest.mark.parametrize(
    "field",
    [f for f in attrs.fields(Settings) if str(f.type) in ("int", "float", "bool")],
    ids=lambda f: f.name,
)
def test_a_bad_env_value_names_the_variable(field: attrs.Attribute[Any]) -> None:
    name = field.metadata["env"]
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: "not-a-value"})
    assert name in str(info.value) and "not-a-value" in str(info.value)


# ------------------------------------------------------------------------- config file

# agent-loop.md, "Thinking mechanics": the defaults a profile gets when it says nothing.
SPEC_FLAG_DEFAULTS = {
    "think_enabled": True,
    "iteration_budget_enabled": True,
    "planning_phase2_enabled": False,
    "goal_anchoring_enabled": True,
    "goal_anchoring_interval": 5,
    "anti_stall_enabled": True,
    "anti_stall_threshold": 8,
    "step_validation_enabled": False,
    "adaptive_replan_enabled": False,
    "subagent_planning_enabled": False,
}


def test_a_profile_that_says_nothing_gets_the_spec_flag_defaults() -> None:
    profile = AgentProfile()
    assert {flag: getattr(profile, flag) for flag in SPEC_FLAG_DEFAULTS} == SPEC_FLAG_DEFAULTS


def test_the_shipped_config_loads_with_the_spec_flag_defaults() -> None:
    raw = json.loads(SHIPPED_CONFIG.read_text(encoding="utf-8"))
    cfg = load_config(SHIPPED_CONFIG)
    assert len(cfg.profiles) >= 3 and cfg.default_profile in cfg.profiles
    assert cfg.persona.strip(), "persona_file was not read"
    for pid, profile in cfg.profiles.items():
        assert profile.id == pid
        assert profile.system_prompt.strip(), f"{pid}: system_prompt_file was not read"
        assert profile.get_agent_tools(), f"{pid}: no tools"
        for flag, default in SPEC_FLAG_DEFAULTS.items():
            expected = raw["profiles"][pid].get(flag, default)
            assert getattr(profile, flag) == expected, f"{pid}.{flag}"
    # The shipped profiles show the flags off their defaults somewhere.
    assert any(
        getattr(p, f) != d for p in cfg.profiles.values() for f, d in SPEC_FLAG_DEFAULTS.items()
    )


def _minimal(**profile: Any) -> dict[str, Any]:
    return {
        "default_profile": "main",
        "profiles": {"main": {"description": "d", "system_prompt": "be brief", **profile}},
    }


def _write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("data", "names"),
    [
        pytest.param(_minimal(bogus=1), ["bogus", "main"], id="unknown-profile-key"),
        pytest.param({**_minimal(), "colour": "red"}, ["colour"], id="unknown-top-key"),
        pytest.param(
            _minimal(max_iterations="5"), ["main", "max_iterations", "int"], id="string-for-int"
        ),
        pytest.param(
            _minimal(think_enabled=1), ["main", "think_enabled", "bool"], id="int-for-bool"
        ),
        pytest.param(_minimal(model=5), ["main", "model", "str"], id="int-for-str"),
        pytest.param(
            _minimal(tools={"agent": [1]}), ["main", "tools", "agent"], id="int-in-tool-list"
        ),
        pytest.param(
            _minimal(anti_stall_threshold=0), ["main", "anti_stall_threshold"], id="zero-threshold"
        ),
        pytest.param(
            _minimal(compression_max_tokens=0),
            ["main", "compression_max_tokens"],
            id="zero-summary-size",
        ),
        pytest.param(
            _minimal(compression_keep_recent=-2),
            ["main", "compression_keep_recent"],
            id="negative-keep-recent",
        ),
        pytest.param(
            {"profiles": _minimal()["profiles"]}, ["default_profile"], id="missing-default"
        ),
        pytest.param(
            {**_minimal(), "default_profile": "ghost"},
            ["default_profile", "ghost", "main"],
            id="unknown-default",
        ),
        pytest.param({"default_profile": "x", "profiles": {}}, ["profiles"], id="no-profiles"),
        pytest.param(["not", "an", "object"], ["object"], id="not-an-object"),
        pytest.param(
            _minimal(system_prompt_file="prompts/missing.md"),
            ["main", "system_prompt_file", "missing.md"],
            id="missing-prompt-file",
        ),
        pytest.param(
            {**_minimal(), "persona_file": "nope.md"},
            ["persona_file", "nope.md"],
            id="missing-persona-file",
        ),
    ],
)
def test_a_broken_config_names_the_file_and_the_key(
    tmp_path: Path, data: Any, names: list[str]
) -> None:
    path = _write(tmp_path / "config.json", data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message
    for name in names:
        assert name in message, f"{name!r} not in {message!r}"


def test_a_string_for_a_tool_list_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "config.json", _minimal(tools={"agent": "filesystem"}))
    with pytest.raises(ConfigError, match="tools"):
        load_config(path)


def test_a_list_where_the_tools_object_belongs_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "config.json", _minimal(tools=["filesystem"]))
    with pytest.raises(ConfigError, match=r"tools.*expected an object"):
        load_config(path)


def test_zero_or_negative_caps_are_refused() -> None:
    with pytest.raises(ConfigError, match="NAVI_TASKS_MAX_GLOBAL"):
        Settings.from_env({"NAVI_TASKS_MAX_GLOBAL": "0"})
    with pytest.raises(ConfigError, match="LLM_STREAM_CHUNK_TIMEOUT"):
        Settings.from_env({"LLM_STREAM_CHUNK_TIMEOUT": "-1"})
    assert Settings.from_env({"CONTEXT_MESSAGE_TOKEN_BUDGET": "0"}).message_token_budget > 0


_NUMBERS = [f for f in attrs.fields(Settings) if str(f.type) in ("int", "float")]


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "1e400", "NaN"])
@pytest.mark.parametrize(
    "field", [f for f in _NUMBERS if str(f.type) == "float"], ids=lambda f: f.name
)
def test_a_non_finite_env_value_is_refused_naming_the_variable(
    field: attrs.Attribute[Any], raw: str
) -> None:
    name = field.metadata["env"]
    with pytest.raises(ConfigError, match="finite") as info:
        Settings.from_env({name: raw})
    assert str(info.value).startswith(f"{name}=")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    "field", [f for f in _NUMBERS if str(f.type) == "float"], ids=lambda f: f.name
)
def test_a_non_finite_override_is_refused_naming_the_variable(
    field: attrs.Attribute[Any], value: float
) -> None:
    with pytest.raises(ConfigError, match="finite") as info:
        Settings.from_env({}, **{field.name: value})
    assert field.metadata["env"] in str(info.value)


@pytest.mark.parametrize("raw", ["7", "1.0001", "0", "-0.5"])
def test_the_compression_threshold_must_be_a_fraction(raw: str) -> None:
    with pytest.raises(ConfigError, match="NAVI_COMPRESSION_THRESHOLD.*fraction"):
        Settings.from_env({"NAVI_COMPRESSION_THRESHOLD": raw})
    with pytest.raises(ConfigError, match="NAVI_COMPRESSION_THRESHOLD.*fraction"):
        Settings.from_env({}, compression_threshold=float(raw))
    assert Settings.from_env({"NAVI_COMPRESSION_THRESHOLD": "1"}).compression_threshold == 1.0
    assert Settings.from_env({}, compression_threshold=0.01).compression_threshold == 0.01


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_number_in_a_hand_written_file_is_refused(token: str) -> None:
    # json.loads reads these tokens; the strict converter must not let them through.
    @attrs.frozen
    class Knob:
        share: float

    with pytest.raises(cattrs.BaseValidationError) as info:
        strict_converter().structure(json.loads(f'{{"share": {token}}}'), Knob)
    assert "finite" in describe(info.value) and "share" in describe(info.value)


def test_a_missing_or_unparsable_config_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.json"
    with pytest.raises(ConfigError, match="not found") as info:
        load_config(missing)
    assert str(missing) in str(info.value)
    bad = _write(tmp_path / "bad.json", '{"default_profile": "main",\n  "profiles": }')
    with pytest.raises(ConfigError, match="line 2") as info:
        load_config(bad)
    assert str(bad) in str(info.value)


def test_the_profile_lookup_falls_back_to_the_default(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path / "c.json", _minimal()))
    assert cfg.profile(None).id == "main" and cfg.profile("ghost").id == "main"


# ------------------------------------------------------------------------- hot reload


def _touch_later(path: Path) -> None:
    # A fresh mtime without waiting for the clock: maybe_reload compares mtimes.
    st_ = path.stat()
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))


def test_hot_reload_keeps_the_last_good_config_through_a_broken_edit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path / "config.json", _minimal(max_iterations=7))
    source = ConfigSource(path)
    assert source.maybe_reload() is False  # nothing changed: no re-read
    first = source.current
    assert first.profile("main").max_iterations == 7

    _write(path, _minimal(max_iterations=9))
    _touch_later(path)
    assert source.maybe_reload() is True
    good = source.current
    assert good.profile("main").max_iterations == 9 and source.generation == 1

    _write(path, _minimal(max_iterations="lots"))
    _touch_later(path)
    with caplog.at_level(logging.ERROR, logger="navi_trio.profiles"):
        assert source.maybe_reload() is False
    assert source.current is good and source.generation == 1
    assert isinstance(source.last_error, ConfigError)
    assert "max_iterations" in str(source.last_error) and str(path) in str(source.last_error)
    assert any(
        r.levelno == logging.ERROR and "max_iterations" in r.getMessage() for r in caplog.records
    )
    assert source.maybe_reload() is False  # the broken file is not re-read every turn

    _write(path, _minimal(max_iterations=11))
    _touch_later(path)
    assert source.maybe_reload() is True
    assert source.current.profile("main").max_iterations == 11
    assert source.last_error is None and source.generation == 2


def test_hot_reload_of_the_shipped_config_copy(tmp_path: Path) -> None:
    folder = tmp_path / "config"
    shutil.copytree(SHIPPED_CONFIG.parent, folder)
    path = folder / "config.json"
    source = ConfigSource(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["default_profile"] = "coder"
    _write(path, data)
    _touch_later(path)
    assert source.maybe_reload() is True and source.current.default_profile == "coder"


def test_a_config_source_on_a_broken_file_fails_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        ConfigSource(_write(tmp_path / "c.json", "{"))


# ------------------------------------------------------------------------- errors


def test_every_error_class_is_a_navi_error() -> None:
    classes = [
        obj
        for obj in vars(errors).values()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__ == errors.__name__
    ]
    assert len(classes) >= 15
    for cls in classes:
        assert issubclass(cls, NaviError), cls.__name__
    for name in (
        "LLMConnectionError",
        "LLMStatusError",
        "LLMStreamError",
        "LLMMalformedStreamError",
        "LLMTimeoutError",
    ):
        assert issubclass(getattr(errors, name), LLMError), name


def test_status_error_quotes_an_excerpt_of_the_body() -> None:
    exc = errors.LLMStatusError(503, '  {"error": "model is loading"}  ', url="http://h/api/chat")
    assert "503" in str(exc) and "model is loading" in str(exc) and "http://h/api/chat" in str(exc)
    assert exc.status == 503 and exc.body == '{"error": "model is loading"}'
    long = errors.LLMStatusError(500, "x" * 5000)
    assert len(long.body) == 500 and len(str(long)) < 700


def test_both_stream_timeouts_are_llm_timeouts_with_their_seconds() -> None:
    first, gap = errors.LLMFirstChunkTimeout(90), errors.LLMChunkTimeout(60)
    for exc, seconds in ((first, 90), (gap, 60)):
        assert isinstance(exc, LLMTimeoutError) and isinstance(exc, LLMError)
        assert exc.seconds == seconds and str(seconds) in str(exc)
    assert "first chunk" in str(first)


def test_backend_level_llm_errors_are_the_backends_own_failures() -> None:
    """A backend-level LLM error ends the turn even when a sub-agent meets it: the
    backend unreachable, dropped, silent, erring or dead; not a request it refused, an
    answer too long, a prompt over its window, or an empty summary."""
    backend = [
        errors.LLMConnectionError("cannot connect"),
        errors.LLMStatusError(500, "boom"),
        errors.LLMStatusError(503, "loading"),
        errors.LLMStatusError(408, "request timeout"),
        errors.LLMStatusError(429, "too many requests"),
        errors.LLMStreamError("the runner stopped"),
        errors.LLMMalformedStreamError("{not json"),
        errors.LocalModelDiedError("SIGILL"),
        errors.LocalModelBrokenError("again and again"),
        errors.LLMFirstChunkTimeout(90),
        errors.LLMChunkTimeout(60),
    ]
    not_backend = [
        errors.LLMStatusError(400, "bad request"),
        errors.LLMStatusError(404, "model 'x' not found"),
        errors.LLMEmptyResponseError("http://h/v1/chat/completions"),
        errors.LLMAnswerTooLongError(100),
        errors.LLMError("the model returned an empty summary"),
    ]
    assert [type(e).__name__ for e in backend if not e.backend_level] == []
    assert [type(e).__name__ for e in not_backend if e.backend_level] == []


def test_context_too_large_names_both_numbers() -> None:
    exc = errors.ContextTooLargeError(tokens=9000, limit=8192)
    assert "9000" in str(exc) and "8192" in str(exc) and (exc.tokens, exc.limit) == (9000, 8192)
