"""Peer runners for the tool-loop benchmark (run inside the bench venv, one per process).

    python scripts/bench/peers.py RUNNER --url http://127.0.0.1:PORT --rounds 50 --reps 3

Each runner plays the same conversation against navi_trio's fake LLM server: the model
answers `rounds` times with one `echo` tool call, then with a final text. The echo tool
stamps `time.perf_counter()` when it runs; round k takes stamp[k] - stamp[k-1] (stamp[0]
is the start of the run). Prints one JSON object: {"runs": [[ms per round, ...], ...]}
or {"error": "..."}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODEL = "fake-model"
PROMPT = "call echo until told otherwise"


CPU_RUNS: list[list[float]] = []  # CPU ms of each round of each run (all threads)


class Stamps:
    def __init__(self) -> None:
        self.t: list[float] = []
        self.c: list[float] = []

    def start(self) -> None:
        self.t = [time.perf_counter()]
        self.c = [time.process_time()]

    def echo(self, text: str) -> str:
        self.t.append(time.perf_counter())
        self.c.append(time.process_time())
        return text

    def rounds_ms(self) -> list[float]:
        if len(self.t) > 1:
            CPU_RUNS.append([(b - a) * 1000 for a, b in zip(self.c, self.c[1:], strict=False)])
        return [(b - a) * 1000 for a, b in zip(self.t, self.t[1:], strict=False)]


ECHO_SCHEMA = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "echo the text back",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
}


# --- hand loops ----------------------------------------------------------------------


def plain_httpx(url: str, rounds: int, reps: int) -> list[list[float]]:
    """The floor: httpx.Client, NDJSON parsed by hand, the tool run by hand."""
    import httpx

    out = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(reps):
            st = Stamps()
            st.start()
            messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
            while True:
                body = {"model": MODEL, "messages": messages, "tools": [ECHO_SCHEMA]}
                text = ""
                calls: list[dict[str, Any]] = []
                with client.stream("POST", "/api/chat", json=body) as resp:
                    for line in resp.iter_lines():
                        if not line:
                            continue
                        msg = json.loads(line).get("message", {})
                        text += msg.get("content", "")
                        calls += msg.get("tool_calls") or []
                messages.append({"role": "assistant", "content": text, "tool_calls": calls})
                if not calls:
                    break
                for c in calls:
                    result = st.echo(c["function"]["arguments"].get("text", ""))
                    messages.append({"role": "tool", "content": result, "tool_name": "echo"})
            out.append(st.rounds_ms())
    return out


def ollama_client(url: str, rounds: int, reps: int) -> list[list[float]]:
    import ollama

    out = []
    client = ollama.Client(host=url)
    for _ in range(reps):
        st = Stamps()
        st.start()
        messages: list[Any] = [{"role": "user", "content": PROMPT}]
        while True:
            text = ""
            calls: list[Any] = []  # ollama's Message.ToolCall
            for part in client.chat(MODEL, messages=messages, tools=[ECHO_SCHEMA], stream=True):
                text += part.message.content or ""
                calls += part.message.tool_calls or []
            messages.append({"role": "assistant", "content": text, "tool_calls": calls})
            if not calls:
                break
            for c in calls:
                result = st.echo(str(c.function.arguments.get("text", "")))
                messages.append({"role": "tool", "content": result, "tool_name": "echo"})
        out.append(st.rounds_ms())
    return out


# --- frameworks ----------------------------------------------------------------------


def _langgraph(url: str, rounds: int, reps: int, saver: str) -> list[list[float]]:
    from langchain_core.tools import tool
    from langchain_ollama import ChatOllama
    from langgraph.prebuilt import create_react_agent

    st = Stamps()

    @tool  # type: ignore[untyped-decorator]  # not installed where mypy runs (bench venv only)
    def echo(text: str) -> str:
        """echo the text back"""
        return st.echo(text)

    tmp = Path(tempfile.mkdtemp(prefix="bench-lg-"))
    if saver == "sqlite":
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        checkpointer: Any = SqliteSaver(sqlite3.connect(tmp / "lg.db", check_same_thread=False))
    else:
        from langgraph.checkpoint.memory import InMemorySaver

        checkpointer = InMemorySaver()
    llm = ChatOllama(model=MODEL, base_url=url)
    graph = create_react_agent(llm, [echo], checkpointer=checkpointer)
    out = []
    for i in range(reps):
        st.start()
        config = {"configurable": {"thread_id": f"t{i}"}, "recursion_limit": 4 * rounds + 10}
        graph.invoke({"messages": [("user", PROMPT)]}, config)
        out.append(st.rounds_ms())
    return out


def langgraph_memory(url: str, rounds: int, reps: int) -> list[list[float]]:
    return _langgraph(url, rounds, reps, "memory")


def langgraph_sqlite(url: str, rounds: int, reps: int) -> list[list[float]]:
    return _langgraph(url, rounds, reps, "sqlite")


def pydantic_ai(url: str, rounds: int, reps: int) -> list[list[float]]:
    from pydantic_ai import Agent
    from pydantic_ai.providers.openai import OpenAIProvider

    try:
        from pydantic_ai.models.openai import OpenAIChatModel as Model
    except ImportError:  # older releases
        from pydantic_ai.models.openai import OpenAIModel as Model

    st = Stamps()
    model = Model(MODEL, provider=OpenAIProvider(base_url=url + "/v1", api_key="x"))
    agent = Agent(model)

    @agent.tool_plain  # type: ignore[untyped-decorator]  # not installed where mypy runs (bench venv only)
    def echo(text: str) -> str:
        """echo the text back"""
        return st.echo(text)

    async def one() -> None:
        # The fake server always streams, so drive the model through its streaming path.
        from pydantic_ai.usage import UsageLimits

        limits = UsageLimits(request_limit=rounds + 5)
        async with agent.iter(PROMPT, usage_limits=limits) as run:
            async for node in run:
                if Agent.is_model_request_node(node):
                    async with node.stream(run.ctx) as stream:
                        async for _ in stream:
                            pass

    out = []
    for _ in range(reps):
        st.start()
        asyncio.run(one())
        out.append(st.rounds_ms())
    return out


def openai_agents(url: str, rounds: int, reps: int) -> list[list[float]]:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    st = Stamps()

    @function_tool  # type: ignore[untyped-decorator]  # not installed where mypy runs (bench venv only)
    def echo(text: str) -> str:
        """echo the text back"""
        return st.echo(text)

    async def one() -> None:
        client = AsyncOpenAI(base_url=url + "/v1", api_key="x")
        model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
        agent = Agent(name="bench", instructions="", model=model, tools=[echo])
        result = Runner.run_streamed(agent, PROMPT, max_turns=rounds + 5)
        async for _ in result.stream_events():
            pass

    out = []
    for _ in range(reps):
        st.start()
        asyncio.run(one())
        out.append(st.rounds_ms())
    return out


def stream_httpx(url: str, rounds: int, reps: int) -> dict[str, float]:
    """Words per second a plain httpx client reads from one long streamed reply."""
    import httpx

    words = 0
    t0 = time.perf_counter()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "stream"}]}
    with httpx.Client(base_url=url, timeout=60) as client:
        with client.stream("POST", "/api/chat", json=body) as resp:
            for line in resp.iter_lines():
                if line:
                    words += len(json.loads(line).get("message", {}).get("content", "").split())
    dt = time.perf_counter() - t0
    return {"words": words, "seconds": dt, "words_per_s": words / dt}


RUNNERS: dict[str, Callable[[str, int, int], Any]] = {
    "plain_httpx": plain_httpx,
    "ollama_client": ollama_client,
    "langgraph_memory": langgraph_memory,
    "langgraph_sqlite": langgraph_sqlite,
    "pydantic_ai": pydantic_ai,
    "openai_agents": openai_agents,
    "stream_httpx": stream_httpx,
}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("runner", choices=sorted(RUNNERS))
    p.add_argument("--url", required=True)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    try:
        got = RUNNERS[a.runner](a.url, a.rounds, a.reps)
        print(json.dumps(got if isinstance(got, dict) else {"runs": got, "cpu": CPU_RUNS}))
    except Exception as exc:  # reported as "unavailable: why", the rest go on
        traceback.print_exc(file=sys.stderr)
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
