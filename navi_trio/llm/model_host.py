"""``python -m navi_trio.llm.model_host``: llama.cpp in a process of its own.

The daemon's `ModelHost` (llm/host.py) starts this program, sends it a ``load`` frame,
then one ``chat`` at a time (the wire: llm/host_wire.py). Frames go over stdin and the
original stdout; fd 1 is pointed at stderr first, so whatever llama.cpp prints can never
break a frame, and stderr (with faulthandler's report of a fatal signal) is what the
daemon keeps of a crash.

Two threads: the main one loads the model and generates; a reader takes frames from
stdin (a stop sets the generation's flag, an ack gives credit, the end of stdin — the
daemon is gone — stops everything). The generation checks its flag after every token,
so a stop ends it within one token. Sampling, prompts and grammars: llm/local_prompt.py.

Extra buffer types (llama.cpp's weight repacking, e.g. AMX on recent Xeons) are on or
off as the ``load`` frame says; with ``probe`` the child runs a one-token generation
before it says ``ready``, so a CPU on which they fault dies here, at start-up, where
the daemon can start it again without them (llm/host.py).

``NAVI_MODEL_HOST_CRASH`` is a test switch: ``SIGNAL:after=N`` (kill itself with that
signal after N generated tokens), ``SIGNAL:load`` (while loading) or ``SIGNAL:extra``
(at the first token computed with the extra buffer types on, the probe's or a chat's:
what the AMX fault looks like), each with an optional ``:starts=K`` to crash only in the
first K starts of a daemon's host (the ``load`` frame's ``start``). SIGNAL is SIGILL,
SIGSEGV, SIGKILL, SIGABRT or SIGBUS.
"""

from __future__ import annotations

import faulthandler
import json
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from navi_trio.llm import local_prompt as lp
from navi_trio.llm.host_wire import (
    WINDOW,
    WireError,
    call_wire,
    done_wire,
    encode,
    read_frame_sync,
    text_wire,
)

CRASH_ENV = "NAVI_MODEL_HOST_CRASH"
CRASH_SIGNALS = ("SIGILL", "SIGSEGV", "SIGKILL", "SIGABRT", "SIGBUS")
PROBE_PROMPT = "Hello"
WORKING_EVERY = 1.0  # seconds between two `working` frames of a step
CHOOSING_STEP = "choosing a tool"
ANSWER_STEP = "writing the answer"


class CrashSwitch:
    """The test switch: which signal, and when (`CRASH_ENV`)."""

    def __init__(self, sig: signal.Signals, *, after: int | None, at: str | None) -> None:
        self.sig = sig
        self.after = after
        self.at = at  # "load" or "extra"
        self.extra_buffers = False  # set once loaded: whether they are on
        self.tokens = 0

    @classmethod
    def parse(cls, text: str, start: int) -> CrashSwitch | None:
        """The switch for start number `start`, or None; ValueError names a bad spec."""
        if not text.strip():
            return None
        name, *parts = text.strip().split(":")
        if name not in CRASH_SIGNALS:
            raise ValueError(f"{CRASH_ENV}={text!r}: the signal must be one of {CRASH_SIGNALS}")
        after: int | None = None
        at: str | None = None
        starts: int | None = None
        for part in parts:
            key, _, value = part.partition("=")
            if key in ("load", "extra") and not value and at is None:
                at = key
            elif key == "after" and value.isdigit():
                after = int(value)
            elif key == "starts" and value.isdigit():
                starts = int(value)
            else:
                raise ValueError(f"{CRASH_ENV}={text!r}: unknown part {part!r}")
        if (at is None) == (after is None):
            raise ValueError(f"{CRASH_ENV}={text!r}: give one of `load`, `extra`, `after=N`")
        if starts is not None and start > starts:
            return None
        return cls(signal.Signals[name], after=after, at=at)

    def fire(self, why: str) -> None:
        print(f"model host: {CRASH_ENV}: {self.sig.name} {why}", file=sys.stderr, flush=True)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from a test
        faulthandler.disable()
        if self.sig != signal.SIGKILL:
            signal.signal(self.sig, signal.SIG_DFL)
        os.kill(os.getpid(), self.sig)
        time.sleep(10)  # the signal is on its way

    def token(self) -> None:
        self.tokens += 1
        if self.at == "extra" and self.extra_buffers:
            self.fire("at the first token with extra buffer types")
        if self.after is not None and self.tokens >= self.after:
            self.fire(f"after {self.tokens} tokens")


def extra_buffers_off() -> None:
    """Load every later model of this process without llama.cpp's extra buffer types.

    ``Llama()`` takes no such argument (0.3.x): it reads the C library's default model
    parameters and loads at once, so those defaults are where ``use_extra_bufts`` is
    turned off. Process-wide, which is what a process of its own is for.
    """
    import llama_cpp.llama_cpp as capi

    defaults = capi.llama_model_default_params

    def without_extra_buffers() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    capi.llama_model_default_params = without_extra_buffers


class _Stopped(Exception):
    """The daemon asked to stop this generation (or is gone)."""


class Generation:
    """One chat request, as the reader thread received it."""

    def __init__(self, gen_id: int, request: dict[str, Any]) -> None:
        self.id = gen_id
        self.request = request
        self.stop = threading.Event()
        self.taken = 0  # chunks the consumer has taken (its acks)
        self.sent = 0
        self.tokens = 0
        self.said_working = -float("inf")  # when the last `working` frame went


class Host:
    """The loaded model and the frames it writes."""

    def __init__(
        self,
        load: dict[str, Any],
        out: IO[bytes],
        crash: CrashSwitch | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = load
        self.out = out
        self.crash = crash
        self.clock = clock  # paces the `working` frames
        self.llama: Any = None
        self.model_name = Path(str(load["model_file"])).stem
        self.credit = threading.Condition()
        self.gens: dict[int, Generation] = {}

    def send(self, frame: dict[str, Any]) -> None:
        self.out.write(encode(frame))
        self.out.flush()

    # -- loading --------------------------------------------------------------------------

    def load(self) -> None:
        started = time.monotonic()
        import llama_cpp

        extra = bool(self.spec.get("extra_buffers", True))
        if not extra:
            extra_buffers_off()
        threads = int(self.spec.get("threads", 2))
        self.llama = llama_cpp.Llama(
            model_path=str(self.spec["model_file"]),
            n_ctx=int(self.spec.get("n_ctx", 4096)),
            n_threads=threads,
            # Prompts too: left out, llama-cpp-python reads them with one thread per CPU,
            # whose barriers spin against other work on a shared machine (prompt reading
            # 2-10 times slower than one thread under load, for twice the CPU).
            n_threads_batch=threads,
            seed=int(self.spec.get("seed", 0)),
            verbose=False,
        )
        if self.crash is not None:
            self.crash.extra_buffers = extra
            if self.crash.at == "load":
                self.crash.fire("while loading")
        if self.spec.get("probe"):
            self.send({"type": "probing"})
            if self.crash is not None:
                self.crash.token()
            self.llama.create_completion(PROBE_PROMPT, max_tokens=1, temperature=0.0)
        self.send(
            {
                "type": "ready",
                "model": self.model_name,
                "extra_buffers": extra,
                "threads": [self.llama.n_threads, self.llama.n_threads_batch],
                "llama_cpp": getattr(llama_cpp, "__version__", "?"),
                "system_info": llama_cpp.llama_print_system_info().decode(errors="replace"),
                "load_s": round(time.monotonic() - started, 3),
            }
        )

    # -- the reader thread --------------------------------------------------------------------

    def read_loop(self, inp: IO[bytes], work: queue.Queue[Generation | None]) -> None:
        try:
            while (frame := read_frame_sync(inp)) is not None:
                kind = frame["type"]
                if kind == "chat":
                    new = Generation(int(frame["id"]), frame["request"])
                    self.gens[new.id] = new
                    work.put(new)
                    continue
                gen = self.gens.get(int(frame["id"]))
                if gen is None:
                    continue  # it has ended: a late stop or ack
                with self.credit:
                    if kind == "stop":
                        gen.stop.set()
                    elif kind == "ack":
                        gen.taken = max(gen.taken, int(frame["taken"]))
                    self.credit.notify_all()
        except (WireError, OSError, KeyError, ValueError, TypeError) as exc:
            print(f"model host: bad input from the daemon: {exc!r}", file=sys.stderr, flush=True)
        finally:
            # The daemon is gone (or talks nonsense): stop what runs, take nothing more.
            for gen in list(self.gens.values()):
                gen.stop.set()
            with self.credit:
                self.credit.notify_all()
            work.put(None)

    # -- generating -----------------------------------------------------------------------------

    def serve(self, gen: Generation) -> None:
        stopped = False
        try:
            self.generate(gen)
        except _Stopped:
            stopped = True
        except ValueError as exc:  # llama.cpp: "Requested tokens (N) exceed context window"
            self.send(
                {
                    "type": "error",
                    "id": gen.id,
                    "message": f"the local model refused the prompt: {exc}. The prompt is "
                    f"larger than its window (n_ctx={self.spec.get('n_ctx')}, OLLAMA_NUM_CTX): "
                    "compact the session or start a new one",
                }
            )
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the host
            self.send(
                {"type": "error", "id": gen.id, "message": f"the local model failed: {exc!r}"}
            )
        self.gens.pop(gen.id, None)
        self.send({"type": "end", "id": gen.id, "tokens": gen.tokens, "stopped": stopped})

    def working(self, gen: Generation, step: str, tokens: int, *, now: bool = False) -> None:
        """Say that `step` goes on (at its start, `now`; then every WORKING_EVERY s):
        a step that streams nothing is work, not silence, to the daemon's timeout."""
        at = self.clock()
        if now or at - gen.said_working >= WORKING_EVERY:
            gen.said_working = at
            self.send({"type": "working", "id": gen.id, "step": step, "tokens": tokens})

    def put(self, gen: Generation, chunk: dict[str, Any]) -> None:
        """Send one chunk once the consumer is less than WINDOW chunks behind."""
        with self.credit:
            while gen.sent - gen.taken >= WINDOW and not gen.stop.is_set():
                self.credit.wait()
        if gen.stop.is_set():
            raise _Stopped
        gen.sent += 1
        self.send({"type": "chunk", "id": gen.id, "chunk": chunk})

    def generate(self, gen: Generation) -> None:
        request = gen.request
        history: list[dict[str, Any]] = list(request.get("messages") or [])
        messages = lp.local_messages(history)
        params = lp.sampling(dict(request.get("options") or {}), int(self.spec.get("seed", 0)))
        functions = lp.tool_functions(list(request.get("tools") or []))
        if lp.tool_rounds(history) >= int(self.spec.get("tool_rounds", 1)):
            functions = {}
        after_tool = bool(history) and history[-1].get("role") == "tool"
        completion = prompt = 0
        if functions:
            from llama_cpp.llama_grammar import LlamaGrammar

            note = {"role": "system", "content": lp.choice_note(functions, after_tool)}
            grammar = LlamaGrammar.from_string(lp.choice_grammar_text(functions), verbose=False)
            asked = lp.with_system(messages, note)
            choice, (prompt, completion) = self.complete(
                gen, CHOOSING_STEP, asked, grammar, lp.CHOICE_MAX_TOKENS, params
            )
            if choice.startswith("tool:") and choice[5:] in functions:
                name = choice[5:]
                fn = functions[name]
                schema = json.dumps(lp.args_schema(fn))
                grammar = LlamaGrammar.from_json_schema(schema, verbose=False)
                note = {"role": "system", "content": lp.args_note(name, fn)}
                limit = int(self.spec.get("args_max_tokens", lp.ARGS_MAX_TOKENS))
                step = f"writing the arguments of {name}"
                args, used = self.complete(
                    gen, step, lp.with_system(messages, note), grammar, limit, params
                )
                completion += used[1]
                if lp.json_object(args):
                    self.put(gen, call_wire(name, args))
                    self.put(gen, done_wire(self.model_name, prompt, completion, "tool_calls"))
                    return
                # Cut at the limit (a string that never ends): no call, an answer.
        if after_tool:
            messages = lp.with_system(messages, {"role": "system", "content": lp.ANSWER_NOTE})
        finish: str | None = None
        text_tokens = 0
        self.working(gen, ANSWER_STEP, 0, now=True)  # its prompt is read first: silence
        stream = self.llama.create_chat_completion(messages, stream=True, **params)
        for content, reason in self.tokens(gen, stream):
            if content:
                text_tokens += 1
                self.put(gen, text_wire(content))
            finish = reason or finish
        prompt = max(prompt, int(self.llama.n_tokens) - text_tokens)
        self.put(
            gen, done_wire(self.model_name, prompt, completion + text_tokens, finish or "stop")
        )

    def complete(
        self,
        gen: Generation,
        step: str,
        messages: list[dict[str, str]],
        grammar: Any,
        max_tokens: int,
        params: dict[str, Any],
    ) -> tuple[str, tuple[int, int]]:
        """A constrained, collected generation that still stops within one token; it
        streams nothing, so it says it works (`working`) as `step`."""
        self.working(gen, step, 0, now=True)
        stream = self.llama.create_chat_completion(
            messages,
            stream=True,
            grammar=grammar,
            **{**params, "max_tokens": max_tokens, "temperature": 0.0, "repeat_penalty": 1.0},
        )
        parts = []
        for content, _ in self.tokens(gen, stream):
            if content:
                parts.append(content)
            self.working(gen, step, len(parts))
        tokens = len(parts)
        return "".join(parts).strip(), (max(0, int(self.llama.n_tokens) - tokens), tokens)

    def tokens(self, gen: Generation, stream: Any) -> Iterator[tuple[str | None, str | None]]:
        """(content, finish_reason) of each generated token, counted; within one token of
        a stop the generation ends (`_Stopped`) and the stream is closed either way."""
        try:
            for chunk in stream:
                gen.tokens += 1
                if self.crash is not None:
                    self.crash.token()
                if gen.stop.is_set():
                    raise _Stopped
                choice = chunk["choices"][0]
                yield choice["delta"].get("content"), choice.get("finish_reason")
        finally:
            stream.close()


def main() -> int:
    faulthandler.enable()  # a fatal signal leaves the Python stack on stderr, for the daemon
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is the daemon's
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed now lands on stderr, never inside a frame
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    try:
        load = read_frame_sync(inp)
        if load is None or load.get("type") != "load":
            raise WireError("the first frame is not `load`")
        crash = CrashSwitch.parse(os.environ.get(CRASH_ENV, ""), int(load.get("start", 1)))
    except (WireError, ValueError) as exc:
        out.write(encode({"type": "fatal", "message": str(exc)}))
        out.flush()
        return 2
    host = Host(load, out, crash)
    try:
        host.load()
    except Exception as exc:  # noqa: BLE001 - reported to the daemon, then exit
        host.send({"type": "fatal", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    work: queue.Queue[Generation | None] = queue.Queue()
    threading.Thread(target=host.read_loop, args=(inp, work), daemon=True).start()
    try:
        while (gen := work.get()) is not None:
            host.serve(gen)
    except BrokenPipeError:
        pass  # the daemon is gone
    return 0


if __name__ == "__main__":
    sys.exit(main())
