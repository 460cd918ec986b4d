"""Error text of refused frames: in the client's terms (field names and JSON types, no
Python type reprs or interpreter hints) and bounded (a value is quoted up to ~64
characters, an error message up to `ERROR_MAX_CHARS`), whatever the client sent.

Rules: see tests/test_api_server.py (loopback, port 0, absolute timeouts).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client, open_daemon

from navi_trio.api.protocol import COMMANDS, ERROR_MAX_CHARS, error_frame, parse_frame
from navi_trio.errors import ProtocolError

TIMEOUT = 30
MAX_BYTES = 1 << 20
# What must never reach a client: Python's words for types and its own hints.
PYTHON_WORDS = ("typing", "<class", "NoneType", "Literal[", "Optional", "Union", "sys.",
                "set_int_max_str_digits", "ValidationError", "Traceback")  # fmt: skip
CATTRS_PATH = re.compile(r" @ \$?\w*[.\[]")  # "… @ message.mode"
HUGE_INT = "9" * 5000
LONG_ID = "s" * 10_000
# A bad message quotes at most ~64 characters of a value, plus its own words.
MESSAGE_BOUND = 400

FIELDS = ["token", "content", "session_id", "cwd", "profile", "mode", "last_seq", "epoch",
          "action", "task_id", "call_id", "scope"]  # fmt: skip
VALUES: list[str] = [
    "null", "true", "1", "1.5", '"x"', '"god"', "[1]", '{"a": 1}', "1e999", HUGE_INT,
    json.dumps(LONG_ID), json.dumps("/" + "d" * 10_000), json.dumps(" "),
]  # fmt: skip


def _refusal(raw: str) -> str:
    with pytest.raises(ProtocolError) as info:
        parse_frame(raw, MAX_BYTES)
    return str(info.value)


def _assert_clean(message: str, what: Any) -> None:
    for word in PYTHON_WORDS:
        assert word not in message, (what, message)
    assert not CATTRS_PATH.search(message), (what, message)
    assert len(message) <= MESSAGE_BOUND, (what, len(message), message[:200])


def test_every_bad_field_value_is_said_in_the_clients_terms_and_bounded() -> None:
    seen = 0
    for kind in COMMANDS:
        for field in FIELDS:
            for value in VALUES:
                raw = f'{{"type": "{kind}", "{field}": {value}}}'
                try:
                    parse_frame(raw, MAX_BYTES)
                except ProtocolError as exc:
                    _assert_clean(str(exc), raw[:120])
                    seen += 1
    assert seen > len(COMMANDS) * len(FIELDS) * len(VALUES) // 2


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ('{"type":"message","content":"x","mode":"god"}',
         "field 'mode' must be one of read-only, workspace, full, not 'god'"),
        ('{"type":"message","content":"x","mode":5}',
         "field 'mode' must be one of read-only, workspace, full, not 5"),
        ('{"type":"subscribe","session_id":"s","last_seq":"3"}',
         "field 'last_seq' must be a whole number, not a string"),
        ('{"type":"subscribe","session_id":"s","last_seq":1.5}',
         "field 'last_seq' must be a whole number, not 1.5"),
        ('{"type":"subscribe","session_id":"s","last_seq":' + HUGE_INT + "}",
         "field 'last_seq' must be a whole number of at most 18 digits, not one of 5000"),
        ('{"type":"sessions","action":"list","id":' + HUGE_INT + "}",
         "field 'id' must be a string"),
        ('{"type":"stop","session_id":"s","id":[' + HUGE_INT[:20] + "]}",
         """at most 18 digits, not ["<a number of 20 digits>"]"""),
        ('{"type":"tasks","action":{"a":' + HUGE_INT + "}}",
         """field 'action' must be one of list, check, cancel, not {"a": "<a number of 5000"""),
        ('{"type":"message","content":null}', "field 'content' must be a string, not null"),
        ('{"type":"stop"}', "field 'session_id' is required"),
        ('{"type":"tasks","action":"list","x":1}', "unknown field 'x'"),
        ('{"type":"message","content":"x","session_id":"' + LONG_ID + '"}',
         "field 'session_id' must be 1-128 letters"),
        ('{"type":"' + LONG_ID + '"}', "(10000 characters)"),
        ('{"type":"message","content":"x","profile":"' + LONG_ID + '"}',
         "field 'profile' must be at most 128 characters, not 10000"),
    ],
)  # fmt: skip
def test_a_bad_field_is_named_with_what_it_must_be(raw: str, words: str) -> None:
    message = _refusal(raw)
    assert words in message, message
    _assert_clean(message, raw[:120])


def test_an_error_frame_never_echoes_a_value_whole() -> None:
    frame = error_frame("not_found", f"no session {LONG_ID!r}", session_id=LONG_ID)
    assert len(frame["message"]) <= ERROR_MAX_CHARS + 1 and frame["message"].endswith("…")
    assert len(frame["session_id"]) <= 129 and frame["session_id"].endswith("…")


async def test_over_the_wire_huge_numbers_and_ids_get_short_plain_errors(tmp_path: Path) -> None:
    frames = [
        '{"type":"subscribe","session_id":"s","last_seq":' + HUGE_INT + ',"id":"r1"}',
        json.dumps({"type": "message", "content": "x", "session_id": LONG_ID, "id": "r2"}),
        json.dumps({"type": "stop", "session_id": LONG_ID, "id": "r3"}),
        json.dumps({"type": "subscribe", "session_id": LONG_ID, "id": "r4"}),
        json.dumps({"type": "tasks", "action": "check", "task_id": LONG_ID, "id": "r5"}),
        json.dumps({"type": "message", "content": "x", "mode": None, "cwd": 5, "id": "r6"}),
    ]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d, d.connect("alice") as c:
            for i, raw in enumerate(frames, 1):
                await c.send(raw)
                err = await c.until(lambda f, i=i: f.get("id") == f"r{i}")  # type: ignore[misc]
                assert err["type"] == "error" and err["code"] == "bad_frame", err
                _assert_clean(err["message"], raw[:120])
                assert len(json.dumps(err)) < MESSAGE_BOUND + 100, err
                assert len(err.get("session_id", "")) <= 128
            listed = await c.request({"type": "sessions", "action": "list"})
            assert listed["sessions"] == []  # nothing was created; the connection goes on


async def two_turns_watched(alice: Client, root: Client) -> str:
    """alice's two turns in a new session the admin `root` follows; its id."""
    ok = await alice.request({"type": "message", "content": "hi"})
    sid = str(ok["session_id"])
    await root.request({"type": "subscribe", "session_id": sid, "last_seq": 0})
    await alice.until_end(sid)
    await alice.request({"type": "message", "content": "again", "session_id": sid})
    await alice.until_end(sid)
    return sid


async def test_an_llm_error_names_the_endpoint_to_admins_only(tmp_path: Path) -> None:
    dropped = {"text": "I will now explain everything", "drop_after": 3}
    refused = {"status": 400, "error_body": '{"error": "bad request, see https://llm.example/x"}'}
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[dropped, refused]) as d:
            endpoint = d.harness.runtime.settings.llm_url.split("//")[1]  # host:port
            async with d.connect("alice") as alice, d.connect("root") as root:
                sid = await two_turns_watched(alice, root)
                while len([f for f in root.frames if f["type"] == "stream_end"]) < 2:
                    await root.until_end(sid)
                seen: dict[str, list[str]] = {}
                for name, c in (("alice", alice), ("root", root)):
                    errors = [f["message"] for f in c.frames if f["type"] == "error" and "seq" in f]
                    history = await c.request(
                        {"type": "sessions", "action": "history", "session_id": sid}
                    )
                    marks = [m["error"] for m in history["messages"] if "error" in m]
                    seen[name] = errors + marks
        assert len(seen["root"]) == len(seen["alice"]) == 3, seen
        dropped_error, refused_error, mark = seen["root"]
        assert endpoint in dropped_error and endpoint in mark and "dropped" in mark
        assert endpoint in refused_error and "https://llm.example/x" in refused_error
        for text in seen["alice"]:
            assert "[address hidden]" in text and "://" not in text and endpoint not in text
            assert "127.0.0.1" not in text, text
        assert "HTTP 400" in seen["alice"][1] and "dropped" in seen["alice"][2]


async def test_credentials_in_the_llm_address_are_shown_to_nobody(tmp_path: Path) -> None:
    url = "http://navi:s3cret@127.0.0.1:9"  # nothing listens on port 9
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, llm_url=url) as d:
            async with d.connect("alice") as alice, d.connect("root") as root:
                ok = await alice.request({"type": "message", "content": "hi"})
                sid = str(ok["session_id"])
                await root.request({"type": "subscribe", "session_id": sid, "last_seq": 0})
                await alice.until_end(sid)
                await root.until_end(sid)
                seen = {
                    name: [f["message"] for f in c.frames if f["type"] == "error" and "seq" in f]
                    for name, c in (("alice", alice), ("root", root))
                }
    assert seen["root"] and seen["alice"], seen
    assert all("http://***@127.0.0.1:9" in m and "s3cret" not in m for m in seen["root"]), seen
    for message in seen["alice"]:  # the HTTP library's words name the host and port too
        assert "[address hidden]" in message and "127.0.0.1" not in message, message
        assert "s3cret" not in message and ":9" not in message, message


def spawn(**arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": "spawn_agent", "arguments": {"task": "look", **arguments}}]}


async def test_a_sub_agents_error_names_the_endpoint_to_admins_only(tmp_path: Path) -> None:
    # A sub-agent's failed LLM call reaches the user as its spawn's tool result, and a
    # background one's as the job's `task_update` and `tasks check`: each hides the
    # address from a user who is not an admin, as a turn's own error does.
    refused = {"status": 400, "error_body": '{"error": "bad request, see https://llm.example/x"}'}
    replies: list[dict[str, Any]] = [
        spawn(),
        refused,
        {"text": "the helper failed"},
        spawn(background=True),
        {"text": "started it"},
        refused,
    ]
    profiles = {"general": {"planning_first_message": False, "tools": {"agent": ["spawn_agent"]}}}
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies, profiles=profiles) as d:
            endpoint = d.harness.runtime.settings.llm_url.split("//")[1]  # host:port
            async with d.connect("alice") as alice, d.connect("root") as root:
                sid = await two_turns_watched(alice, root)
                seen: dict[str, list[str]] = {}
                for name, c in (("alice", alice), ("root", root)):
                    update = await c.until_type("task_update", session_id=sid, status="failed")
                    check = await c.request(
                        {"type": "tasks", "action": "check", "session_id": sid,
                         "task_id": update["task_id"]}
                    )  # fmt: skip
                    told = [f for f in c.frames if f["type"] in ("tool_result", "task_update")]
                    results = [f["error"] for f in told if f.get("error")]
                    seen[name] = [*results, update["error"], check["task"]["error"]]
                    seen[name + " whole"] = [json.dumps([*told, check])]
                history = await alice.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
    assert endpoint not in json.dumps(history), history
    assert len(seen["root"]) == len(seen["alice"]) == 4, seen
    assert all(endpoint in text for text in seen["root"]), seen
    for text in seen["alice"] + seen["alice whole"]:
        assert "[address hidden]" in text and endpoint not in text, text
        assert "127.0.0.1" not in text and "://" not in text, text
