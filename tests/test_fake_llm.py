"""The fake LLM server itself: raw HTTP against it, the script format, the shell entry.

Rules: loopback only, port 0; the autojump clock for anything that sleeps (the server
sleeps with trio.sleep in the same run); every I/O test has an absolute timeout. The
shell test runs a real subprocess, so it uses real time with a generous bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from test_testing_lifeline import signal_state

from navi_trio.errors import ConfigError
from navi_trio.llm.script import Reply, load_script, parse_reply, split_words
from navi_trio.testing.fake_llm import FakeLLMServer, open_fake_llm

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 10
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def test_get_endpoints_answer_like_ollama() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm() as server, httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.get("/")).text == "Ollama is running"
            tags = (await client.get("/api/tags")).json()
            models = (await client.get("/v1/models")).json()
            missing = await client.get("/nope")
    assert tags["models"][0]["name"] and models["data"][0]["id"]
    assert missing.status_code == 404 and "/nope" in missing.json()["error"]
    assert [r["path"] for r in server.requests] == ["/", "/api/tags", "/v1/models", "/nope"]
    assert server.url.startswith("http://127.0.0.1:") and server.port > 0


async def test_ollama_lines_arrive_one_chunk_at_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = {"thinking": "hm", "text": "a b", "delay_first": 10, "delay_chunk": 2}
    with trio.fail_after(100):
        async with open_fake_llm([reply]) as server, httpx.AsyncClient(timeout=None) as client:
            start = trio.current_time()
            lines: list[tuple[float, dict[str, Any]]] = []
            async with client.stream("POST", f"{server.url}/api/chat", json=CHAT) as resp:
                assert resp.headers["content-type"] == "application/x-ndjson"
                async for line in resp.aiter_lines():
                    if line:
                        lines.append((trio.current_time() - start, json.loads(line)))
    assert [t for t, _ in lines] == pytest.approx([10, 12, 14, 16])
    assert [
        obj["message"].get("thinking") or obj["message"]["content"] for _, obj in lines[:3]
    ] == ["hm", "a ", "b"]
    final = lines[-1][1]
    assert final["done"] is True and final["done_reason"] == "stop" and final["eval_count"] == 3
    assert server.requests[0]["body"] == CHAT and server.requests[0]["time"] >= start
    assert server.completed == 1


async def test_a_held_reply_stops_after_its_chunks_until_released_then_goes_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = {"text": "a b c d", "delay_first": 10, "delay_chunk": 2}
    with trio.fail_after(1000):
        async with open_fake_llm([reply]) as server, httpx.AsyncClient(timeout=None) as client:
            release = server.hold_after(2)
            start = trio.current_time()
            times: list[float] = []

            async def read() -> None:
                async with client.stream("POST", f"{server.url}/api/chat", json=CHAT) as resp:
                    async for line in resp.aiter_lines():
                        if line:
                            times.append(trio.current_time() - start)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await server.wait_held()
                await trio.sleep(500)  # held however long the test takes
                assert (len(times), server.held) == (2, 1)
                release.set()
    assert times == pytest.approx([10, 12, 512, 512, 512])  # the rest at once, no delays
    assert (server.held, server.completed) == (0, 1)


async def test_a_hold_for_one_reply_of_the_script_lets_the_others_by() -> None:
    def words(body: str) -> list[str]:
        return [json.loads(line)["message"]["content"] for line in body.splitlines()[:3]]

    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": "a b c"}, {"text": "d e f"}]) as server:
            release = server.hold_after(1, reply=1)
            async with httpx.AsyncClient() as client:
                first = await client.post(f"{server.url}/api/chat", json=CHAT)
                assert words(first.text) == ["a ", "b ", "c"]  # whole: not held
                second: list[str] = []

                async def ask() -> None:
                    second.append((await client.post(f"{server.url}/api/chat", json=CHAT)).text)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(ask)
                    await server.wait_held()
                    assert second == [] and server.held == 1
                    release.set()
    assert words(second[0]) == ["d ", "e ", "f"]


async def test_openai_stream_is_sse_with_fragmented_tool_calls_and_done_marker() -> None:
    reply = {"tool_calls": [{"name": "f", "arguments": {"path": "abc"}}]}
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([reply]) as server, httpx.AsyncClient() as client:
            url = f"{server.url}/v1/chat/completions"
            async with client.stream("POST", url, json=CHAT) as resp:
                assert resp.headers["content-type"] == "text/event-stream"
                events = [line async for line in resp.aiter_lines() if line]
    assert events[-1] == "data: [DONE]"
    objs = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    fragments = [o["choices"][0]["delta"]["tool_calls"][0] for o in objs[:2]]
    assert fragments[0]["id"] and fragments[0]["function"]["name"] == "f"
    assert "id" not in fragments[1]
    joined = "".join(f["function"]["arguments"] for f in fragments)
    assert json.loads(joined) == {"path": "abc"} and fragments[1]["function"]["arguments"]
    assert objs[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert objs[-1]["usage"]["completion_tokens"] == 1


async def test_script_exhausted_then_loop_then_add_replies() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": "x"}]) as server, httpx.AsyncClient() as client:
            assert (await client.post(f"{server.url}/api/chat", json=CHAT)).status_code == 200
            exhausted = await client.post(f"{server.url}/api/chat", json=CHAT)
            assert exhausted.status_code == 500 and exhausted.json() == {
                "error": "script exhausted"
            }
            server.add_replies({"text": "more"})
            later = await client.post(f"{server.url}/api/chat", json=CHAT)
            assert json.loads(later.text.splitlines()[0])["message"]["content"] == "more"
        async with open_fake_llm([{"text": "a"}, {"text": "b"}], loop=True) as server:
            async with httpx.AsyncClient() as client:
                texts = []
                for _ in range(3):
                    resp = await client.post(f"{server.url}/api/chat", json=CHAT)
                    texts.append(json.loads(resp.text.splitlines()[0])["message"]["content"])
    assert texts == ["a", "b", "a"]


async def test_drop_unread_leaves_the_next_added_reply_to_the_next_request() -> None:
    with trio.fail_after(TIMEOUT):
        script = [{"text": "a"}, {"text": "b"}, {"text": "c"}]
        async with open_fake_llm(script) as server, httpx.AsyncClient() as client:
            first = await client.post(f"{server.url}/api/chat", json=CHAT)
            assert server.drop_unread() == 2
            server.add_replies({"text": "d"})
            second = await client.post(f"{server.url}/api/chat", json=CHAT)
            assert server.drop_unread() == 0
            exhausted = await client.post(f"{server.url}/api/chat", json=CHAT)
    said = [json.loads(r.text.splitlines()[0])["message"]["content"] for r in (first, second)]
    assert said == ["a", "d"]
    assert exhausted.status_code == 500 and exhausted.json() == {"error": "script exhausted"}


async def test_shape_makes_each_reply_from_the_request_it_answers() -> None:
    def echo(body: dict[str, Any], reply: Reply) -> Reply:
        last = body["messages"][-1]["content"]
        return attrs.evolve(reply, text=f"{reply.text} {last}")

    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": "re"}], loop=True, shape=echo) as server:
            async with httpx.AsyncClient() as client:
                texts = []
                for asked in ("one", "two"):
                    body = {**CHAT, "messages": [{"role": "user", "content": asked}]}
                    resp = await client.post(f"{server.url}/api/chat", json=body)
                    lines = [json.loads(line) for line in resp.text.splitlines() if line]
                    texts.append("".join(o["message"]["content"] for o in lines))
    assert texts == ["re one", "re two"]
    assert server.replies[0].text == "re"  # the script itself is left as it was


async def test_a_client_leaving_a_stalled_stream_is_recorded_as_a_disconnect() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": "a b", "stall": True}]) as server:
            async with httpx.AsyncClient() as client:
                async with client.stream("POST", f"{server.url}/api/chat", json=CHAT) as resp:
                    seen = 0
                    async for line in resp.aiter_lines():
                        seen += bool(line)
                        if seen == 2:
                            break  # both words arrived; the server now stalls
            await server.wait_disconnects(1)
    assert server.disconnects[0]["path"] == "/api/chat"
    assert server.disconnects[0]["chunks_sent"] == 2
    assert server.completed == 0


ROUNDS = 20  # the ending races the server's last step: each round is a fresh try


@pytest.mark.parametrize(
    ("path", "stream"),
    [("/api/chat", True), ("/v1/chat/completions", False)],
    ids=["ndjson", "whole"],
)
@pytest.mark.parametrize("who_ends", ["server", "client"])
async def test_an_answer_the_client_read_to_its_end_is_completed_whoever_ends_first(
    path: str, stream: bool, who_ends: str
) -> None:
    """Read to its end, an answer counts in `completed` and never as a disconnect,
    whether the server is shut down or the client hangs up right after."""
    body = {**CHAT, "stream": stream}
    for _ in range(ROUNDS):  # a bound for each round: twenty in 10 s was too few on load 15
        with trio.fail_after(TIMEOUT):
            async with httpx.AsyncClient() as client:
                async with open_fake_llm([{"text": "a b"}]) as server:
                    resp = await client.post(server.url + path, json=body)
                    assert resp.status_code == 200 and "b" in resp.text
                    if who_ends == "client":
                        await client.aclose()
        assert (server.completed, server.disconnects) == (1, [])


async def test_drop_after_cuts_the_body_and_is_not_a_client_disconnect() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": "a b c", "drop_after": 1}]) as server:
            async with httpx.AsyncClient() as client:
                with pytest.raises(httpx.RemoteProtocolError):
                    async with client.stream("POST", f"{server.url}/api/chat", json=CHAT) as resp:
                        async for _line in resp.aiter_lines():
                            pass
    assert server.disconnects == [] and server.completed == 0


@pytest.mark.parametrize(
    ("reply", "ctype", "body"),
    [
        (
            {"status": 404, "error_body": "model 'x' not found"},
            "application/json",
            '{"error": "model \'x\' not found"}',
        ),
        ({"status": 503, "error_body": "busy", "error_raw": True}, "text/plain", "busy"),
        ({"status": 400, "error_body": {"detail": "no"}}, "application/json", '{"detail": "no"}'),
    ],
)
async def test_http_error_replies(reply: dict[str, Any], ctype: str, body: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([reply]) as server, httpx.AsyncClient() as client:
            resp = await client.post(f"{server.url}/api/chat", json=CHAT)
    assert resp.status_code == reply["status"]
    assert resp.headers["content-type"] == ctype and resp.text == body


async def test_a_body_that_is_not_json_gets_400_and_consumes_no_reply() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": "kept"}]) as server, httpx.AsyncClient() as client:
            bad = await client.post(f"{server.url}/api/chat", content=b"{nope")
            good = await client.post(f"{server.url}/api/chat", json=CHAT)
    assert bad.status_code == 400 and "invalid JSON body" in bad.json()["error"]
    assert json.loads(good.text.splitlines()[0])["message"]["content"] == "kept"


async def test_serve_in_a_caller_nursery_reports_started() -> None:
    server = FakeLLMServer([{"text": "x"}])
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            started = await nursery.start(server.serve)
            assert started is server and server.port > 0
            async with httpx.AsyncClient() as client:
                assert (await client.get(server.url)).status_code == 200
            nursery.cancel_scope.cancel()


# --- the script format ------------------------------------------------------------------


def test_load_script_reads_a_list_and_names_the_file_and_reply_on_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"text": "hi", "delay_first": 1}, {"status": 503}]))
    assert load_script(good) == [Reply(text="hi", delay_first=1.0), Reply(status=503)]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"text": "ok"}, {"text": "x", "stal": True}]))
    with pytest.raises(ConfigError, match=r"bad.json: reply 1: unknown key 'stal'"):
        load_script(bad)
    bad.write_text('{"text": "x"}')
    with pytest.raises(ConfigError, match="expected a JSON list"):
        load_script(bad)
    bad.write_text("[{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_script(bad)
    with pytest.raises(ConfigError, match="cannot read script"):
        load_script(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"drop_after": -1}, "drop_after must be >= 0"),
        ({"status": 200}, "400-599"),
        ({"stall": "yes"}, r"expected bool \(true or false\), got .yes. @ \$.stall"),
        ({"tool_calls": [{"name": "f", "arguments": 1}]}, "object or a string"),
        ({"thinking_field": "thoughts"}, "thinking_field"),
    ],
)
def test_bad_values_are_named(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_reply(data)


@given(st.text(max_size=60))
def test_split_words_joins_back_to_the_text(text: str) -> None:
    assert "".join(split_words(text)) == text


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 700),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.lists(st.dictionaries(st.text(max_size=9), st.text(max_size=5)), max_size=2),
)


@given(
    st.dictionaries(
        st.sampled_from([f.name for f in Reply.__attrs_attrs__] + ["bogus"]), _values, max_size=6
    )
)
def test_fuzzed_replies_parse_or_fail_with_config_error(data: dict[str, Any]) -> None:
    try:
        reply = parse_reply(data)
    except ConfigError as exc:
        assert str(exc)
        return
    assert isinstance(reply, Reply)
    reply.content()


# --- the shell entry point ---------------------------------------------------------------


async def _read_line(stream: trio.abc.ReceiveStream) -> str:
    buf = b""
    while b"\n" not in buf:
        data = await stream.receive_some(1024)
        if not data:
            break
        buf += data
    return buf.decode().split("\n", 1)[0]


@pytest.mark.slow
async def test_shell_entry_point_serves_the_script_in_a_loop_until_ctrl_c(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"text": "from the shell"}]))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "navi_trio.testing.fake_llm",
        "--port",
        "0",
        "--script",
        str(script),
        "--loop",
    ]
    # Started with SIGINT ignored, as a script's background job (`… &`) is (exec keeps
    # it): Ctrl-C stops it all the same.
    ignoring = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    ignoring += "os.execv(sys.executable, sys.argv[1:])"
    cmd = [sys.executable, "-c", ignoring, *cmd]
    proc = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE, env=env, cwd=str(REPO))
    try:
        with trio.fail_after(30):
            assert proc.stdout is not None
            first = await _read_line(proc.stdout)
            assert first.startswith("listening on http://127.0.0.1:"), first
            url = first.removeprefix("listening on ")
            async with httpx.AsyncClient() as client:
                for _ in range(2):  # --loop: the one reply serves every request
                    resp = await client.post(f"{url}/api/chat", json=CHAT)
                    words = [json.loads(x)["message"]["content"] for x in resp.text.splitlines()]
                    assert "".join(words) == "from the shell"
        # Its own bound; if it is missed, what the server blocks or ignores says why.
        proc.send_signal(signal.SIGINT)
        with trio.move_on_after(30) as waited:
            assert await proc.wait() == 0
        if waited.cancelled_caught:
            pytest.fail(f"no exit 30 s after SIGINT ({signal_state(proc.pid)})")
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.move_on_after(5):
                await proc.wait()


@pytest.mark.slow
async def test_shell_entry_point_rejects_a_bad_script(tmp_path: Path) -> None:
    script = tmp_path / "bad.json"
    script.write_text(json.dumps([{"txet": "typo"}]))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "navi_trio.testing.fake_llm", "--script", str(script)]
    with trio.fail_after(30):
        result = await trio.run_process(
            cmd, capture_stdout=True, capture_stderr=True, check=False, env=env
        )
    assert result.returncode == 2
    assert b"unknown key 'txet'" in result.stderr


def test_the_fakes_prompt_count_is_not_far_below_navis_for_a_tool_call_history() -> None:
    """The fake counts the prompt like a server does: a long history of tool calls (empty
    content, JSON arguments) and todo lists must not look cut (turn.py's
    prompt_truncated check: a count under TRUNCATION_RATIO of navi's estimate), else a
    long scripted session compresses for nothing and fails (the crash suite did)."""
    from navi_trio.core.turn import TokenCounter
    from navi_trio.core.turn.turn import TRUNCATION_RATIO
    from navi_trio.llm.script import rough_tokens

    history: list[dict[str, Any]] = [{"role": "user", "content": "message 1 of life 0"}]
    for i in range(40):
        calls = [{"id": f"call_{i:06x}{n:06x}", "type": "function", "function": {
                     "name": "scratchpad",
                     "arguments": '{"action": "append", "content": "note"}'}}
                 for n in range(2)]  # fmt: skip
        history.append({"role": "assistant", "content": "", "tool_calls": calls})
        for call in calls:
            history.append({"role": "tool", "tool_call_id": call["id"], "name": "scratchpad",
                            "content": "appended 4 characters (68/20000 used)"})  # fmt: skip
    navi = TokenCounter().estimate_messages(history)
    assert rough_tokens(history) >= navi * TRUNCATION_RATIO, (rough_tokens(history), navi)
