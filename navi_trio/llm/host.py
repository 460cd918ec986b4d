"""ModelHost: the supervisor of the embedded model's process.

llama.cpp runs in a child process (``python -m navi_trio.llm.model_host``), never in
the daemon: a native fault (SIGILL on a CPU the build does not fit, a corrupt GGUF, an
out-of-memory kill) ends that process and one generation, not every session. The
runtime starts `ModelHost.run` in its nursery; the child is started by the first
request, loads the model once, and serves one generation at a time. One process as
the daemon sees it (how it is started, its exit named, its stderr kept): llm/host_process.py.

Why a worker of our own over a pipe, not llama-cpp-python's OpenAI-compatible server:
the local backend's two grammar-constrained steps (choose a tool, then write its
arguments, llm/local_prompt.py) stay one request, done where the model is; a stop is a
frame the child hears within one token (an HTTP server notices a closed connection
only when it next writes); the child starts without fastapi and uvicorn; and a crash is
a process exit with a signal we can name, not a refused connection.

How a request goes (`stream`): the first ``receive`` waits for the model (the slot),
for the child to be ready (started if need be, after the backoff), sends the chat, and
then takes chunks. Leaving early sends a stop and returns at once; the slot is free when
the child says the generation ended, or when it is killed `STOP_GRACE` seconds later.
All of that wait happens inside the consumer's receive, so the stream guard's
first-chunk timeout bounds it, with two kinds of progress that restart it (they are
work, not silence): while another answer holds the model, a `WorkingChunk` every
`SLOT_REPORT_SEC`; and the child's ``working`` frames, sent during the steps that stream
nothing (choosing a tool, writing its arguments: llm/model_host.py).

When the child dies:
- during a generation, that stream raises `LocalModelDiedError` naming the signal;
- while starting, the request that started it gets the same error (“while loading”);
- a start with extra buffer types on and nothing remembered for this CPU is a probe
  (llm/model_host.py): if the child dies in the probe's one token, it is started at once
  without them, and the outcome is remembered in the data folder (llm/host_state.py);
- each death that is not ours counts; a generation that ends resets the count. The next
  start waits ``BACKOFF_FIRST * 2**(n-1)`` seconds (at most `BACKOFF_MAX`); after
  `BROKEN_AFTER` deaths in a row the backend is broken: requests fail at once with the
  signal and the last stderr lines (also in the log and, through the data folder, in
  ``navi doctor``) for `BROKEN_RETRY` seconds, then one start is tried again.
There is no loop that restarts anything: a start only ever happens for a request.
Times are trio's, so a MockClock drives the backoff in tests.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from navi_trio.actor import NurseryHolder
from navi_trio.backoff import backoff_delay
from navi_trio.errors import LLMError, LLMStreamError, LocalModelBrokenError, LocalModelDiedError
from navi_trio.llm import host_state
from navi_trio.llm.base import ChatRequest, LLMChunk, WorkingChunk
from navi_trio.llm.host_process import (
    HostChild,
    LoadSpec,
    Spawn,
    child_command,
    spawn_process,
)
from navi_trio.llm.host_wire import (
    ACK_EVERY,
    WINDOW,
    FrameReader,
    WireError,
    chunk_from_wire,
    request_to_wire,
)

log = logging.getLogger(__name__)

BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
BROKEN_AFTER = 5
BROKEN_RETRY = 600.0
STOP_GRACE = 5.0  # a stopped generation that has not ended by then: the child is killed
SLOT_REPORT_SEC = 5.0  # a request waiting for the model says so this often
WAITING_STEP = "waiting for the model (another answer is being written)"
STEP_MAX = 200  # characters of a step's name the child may send
EXIT_GRACE = 2.0
SEE_DOCTOR = "see navi doctor"


class _Stream(trio.abc.ReceiveChannel[LLMChunk]):
    """One generation: the consumer's channel of chunks."""

    def __init__(self, host: ModelHost, request: ChatRequest, gen_id: int) -> None:
        self.host = host
        self.request = request
        self.id = gen_id
        self.child: HostChild | None = None
        # WINDOW chunks of output (the child's credit), and as many of progress at most.
        self.send_end, self.recv_end = trio.open_memory_channel[LLMChunk](2 * WINDOW)
        self.error: LLMError | None = None
        self.ended = trio.Event()
        self.taken = 0
        self._slotted = False  # holds the model (the host's slot)
        self._began = False

    async def receive(self) -> LLMChunk:
        if not self._began:
            if not self._slotted:
                # Another answer holds the model: that is work, said while we wait.
                with trio.move_on_after(SLOT_REPORT_SEC):
                    await self.host._slot.acquire()
                    self._slotted = True
                if not self._slotted:
                    return WorkingChunk(WAITING_STEP)
            await self.host._begin(self)
            self._began = True
        try:
            chunk = await self.recv_end.receive()
        except trio.EndOfChannel:
            if self.error is not None:
                raise self.error from None
            raise
        if isinstance(chunk, WorkingChunk):
            return chunk  # progress is no output: it takes none of the child's credit
        self.taken += 1
        if self.taken % ACK_EVERY == 0 and self.child is not None and not self.ended.is_set():
            self.child.send({"type": "ack", "id": self.id, "taken": self.taken})
        return chunk

    def working(self, step: str, tokens: int) -> None:
        """The child reports a step that streams nothing: pass it on, unless the consumer
        is behind anyway (then it is dropped: output is waiting to be read)."""
        if self.send_end.statistics().current_buffer_used >= WINDOW:
            return
        try:
            self.send_end.send_nowait(WorkingChunk(step, tokens))
        except (trio.WouldBlock, trio.BrokenResourceError):
            pass  # the consumer left

    async def aclose(self) -> None:
        self.recv_end.close()
        await trio.lowlevel.checkpoint()


class ModelHost(NurseryHolder):
    """The actor that owns the model host process (see the module docstring); its `run`
    (NurseryHolder's) holds the nursery the child's tasks live in, until cancelled."""

    def __init__(
        self,
        spec: LoadSpec,
        *,
        data_dir: Path | None = None,
        extra_buffers: bool | None = None,
        spawn: Spawn = spawn_process,
    ) -> None:
        self.spec = spec
        self.data_dir = data_dir  # None: nothing remembered (the doctor only reads)
        self.extra_buffers = extra_buffers  # None: probe once, then as remembered
        self._spawn = spawn
        self._slot = trio.Semaphore(1)
        self._child: HostChild | None = None
        self._running: dict[HostChild, _Stream] = {}  # a child's generation, while it runs
        self._starts = 0
        self._ids = 0
        self.failures = 0  # deaths in a row with no generation that ended
        self._next_start = -float("inf")
        self._broken_until: float | None = None
        self.broken_message: str | None = None
        self.last_death: dict[str, Any] | None = None
        self._remembered: bool | None = None
        self._remembered_read = False
        self._state_writes = trio.Lock()  # fair: the writes happen in the order asked
        self._started_once = False  # a child of this host was ready once
        # Of the last generation: tokens the child generated, and whether a stop ended it.
        self.last_tokens = 0
        self.last_stopped = False

    @asynccontextmanager
    async def stream(
        self, request: ChatRequest
    ) -> AsyncIterator[trio.abc.ReceiveChannel[LLMChunk]]:
        """``async with host.stream(request) as chunks`` — one generation."""
        if not self.running:
            raise RuntimeError("ModelHost.run is not running (open_runtime starts it)")
        self._ids += 1
        stream = _Stream(self, request, self._ids)
        try:
            yield stream
        finally:
            stream.recv_end.close()
            if stream.child is not None and not stream.ended.is_set():
                self._abandon(stream.child, stream)

    async def idle(self) -> None:
        """Wait until no generation holds the model (a stopped one has ended)."""
        async with self._slot:
            pass

    def status(self) -> dict[str, Any]:
        child = self._child
        state = "idle" if child is None else "ready" if child.ready.is_set() else "starting"
        if self._broken_until is not None:
            state = "broken"
        return {
            "state": state,
            "failures": self.failures,
            "last_death": self.last_death,
            "broken": self.broken_message,
            "extra_buffers": child.extra_buffers if child is not None else None,
            "system_info": child.info.get("system_info", "") if child is not None else "",
            "pid": child.proc.pid if child is not None and child.proc else None,
        }

    # -- a request's way in --------------------------------------------------------------

    async def _begin(self, stream: _Stream) -> None:
        """With the slot held (`stream` took it): the child ready, the chat sent."""
        try:
            child = await self._ready_child()
        except BaseException:
            self._slot.release()
            raise
        stream.child = child
        self._running[child] = stream
        child.send({"type": "chat", "id": stream.id, "request": request_to_wire(stream.request)})

    async def _ready_child(self) -> HostChild:
        child = self._child
        if child is not None and not child.dead:
            await child.settled.wait()  # a start an earlier request left (its timeout)
            if child.ready.is_set() and not child.dead:
                return child
        now = trio.current_time()
        if self._broken_until is not None and now < self._broken_until:
            raise LocalModelBrokenError(self.broken_message or "the local model is broken")
        await trio.sleep_until(self._next_start)
        extra, probe = await self._extra_mode()
        child = await self._start(extra_buffers=extra, probe=probe)
        if child.ready.is_set():
            if probe:
                await self._remember(True, "the one-token probe with them answered")
            return child
        if child.probing and child.fatal is None:
            log.warning(
                "the local model process died with llama.cpp's extra buffer types on (%s): "
                "starting it again without them",
                child.how(),
            )
            first = child.how()
            child = await self._start(extra_buffers=False, probe=False)
            if child.ready.is_set():
                await self._remember(False, f"with them the probe died ({first})")
                return child
        raise self._start_error(child)

    async def _start(self, *, extra_buffers: bool, probe: bool) -> HostChild:
        self._starts += 1
        child = HostChild(self._starts, extra_buffers=extra_buffers, probe=probe)
        self._child = child
        child.send(self.spec.frame(extra_buffers=extra_buffers, probe=probe, start=child.start))
        await self.nursery.start(self._life, child)
        await child.settled.wait()
        return child

    def _start_error(self, child: HostChild) -> LocalModelDiedError:
        if self.broken_message is not None:
            return LocalModelBrokenError(self.broken_message)
        if child.fatal is not None:
            return LocalModelDiedError(f"the local model could not be loaded: {child.fatal}")
        return LocalModelDiedError(
            f"the local model process died while loading the model ({child.how()}) — {SEE_DOCTOR}"
        )

    async def _extra_mode(self) -> tuple[bool, bool]:
        """(extra buffer types on, probe them): the setting, else what was remembered for
        this CPU and llama-cpp-python, else on with a probe."""
        if self.extra_buffers is not None:
            return self.extra_buffers, False
        if not self._remembered_read and self.data_dir is not None:
            self._remembered_read = True
            state = await trio.to_thread.run_sync(host_state.read_state, self.data_dir)
            key = await trio.to_thread.run_sync(host_state.state_key)
            self._remembered = host_state.remembered_extra_buffers(state, key)
        if self._remembered is not None:
            return self._remembered, False
        return True, True

    async def _remember(self, on: bool, why: str) -> None:
        self._remembered = on
        if self.data_dir is None:
            return
        key = await trio.to_thread.run_sync(host_state.state_key)
        log.info("local model: extra buffer types %s for %s (%s)", "on" if on else "off", key, why)
        await self._write_state(host_state.remember_extra_buffers, self.data_dir, key, on, why)

    def _abandon(self, child: HostChild, stream: _Stream) -> None:
        """The consumer left before the end: stop the generation, or kill the child."""
        if child.dead:
            return
        child.send({"type": "stop", "id": stream.id})
        if self.running:
            self.nursery.start_soon(self._watch_stop, child, stream)
        else:
            child.kill("the daemon is shutting down")

    async def _watch_stop(self, child: HostChild, stream: _Stream) -> None:
        with trio.move_on_after(STOP_GRACE):
            await stream.ended.wait()
            return
        log.warning("the local model did not stop within %g s: its process is killed", STOP_GRACE)
        child.kill(f"it did not stop within {STOP_GRACE:g} s")

    # -- the child's life ---------------------------------------------------------------------

    async def _life(self, child: HostChild, *, task_status: trio.TaskStatus[None]) -> None:
        argv, env = child_command()
        try:
            child.proc = await self._spawn(argv, env)
        except OSError as exc:
            child.fatal = f"its process could not start: {exc}"
            task_status.started()
            self._died(child)
            return
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                stderr_done = trio.Event()
                nursery.start_soon(self._pump_stderr, child, stderr_done)
                nursery.start_soon(self._write_loop, child)
                await self._read_loop(child)
                # Its stdout closed: it is exiting (or it broke the wire: killed).
                with trio.move_on_after(EXIT_GRACE):
                    await child.proc.wait()
                if child.proc.returncode is None:
                    child.kill("it closed its output but did not exit")
                await child.proc.wait()
                with trio.move_on_after(EXIT_GRACE):
                    await stderr_done.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if child.proc.returncode is None:
                    child.kill("the daemon is shutting down")
                with trio.move_on_after(EXIT_GRACE):
                    await child.proc.wait()
                child.outbox.close()
                self._died(child)

    async def _read_loop(self, child: HostChild) -> None:
        assert child.proc is not None and child.proc.stdout is not None
        reader = FrameReader(child.proc.stdout)
        try:
            while (frame := await reader.read()) is not None:
                self._on_frame(child, frame)
        except WireError as exc:
            child.wire_error = str(exc)
            child.kill("it broke the wire")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _write_loop(self, child: HostChild) -> None:
        assert child.proc is not None and child.proc.stdin is not None
        async with child._outbox_recv:
            async for data in child._outbox_recv:
                try:
                    await child.proc.stdin.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return  # it is dying: the read loop sees the end

    async def _pump_stderr(self, child: HostChild, done: trio.Event) -> None:
        assert child.proc is not None and child.proc.stderr is not None
        try:
            while data := await child.proc.stderr.receive_some(65536):
                child.stderr.feed(bytes(data))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            child.stderr.close()
            done.set()

    def _on_frame(self, child: HostChild, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        if kind == "ready":
            child.info = frame
            child.ready.set()
            child.settled.set()
            self._recovered()
            return
        if kind == "probing":
            child.probing = child.probe
            return
        if kind == "fatal":
            child.fatal = str(frame.get("message", ""))[:2000]
            return
        stream = self._running.get(child)
        if kind == "working":  # a step that streams nothing: progress for the guard
            tokens = frame.get("tokens")
            count = tokens if isinstance(tokens, int) else 0
            if stream is not None and frame.get("id") == stream.id:
                stream.working(str(frame.get("step", ""))[:STEP_MAX], count)
            return
        if kind not in ("chunk", "error", "end"):
            raise WireError(f"a frame of unknown type {kind!r}")
        if stream is None or frame.get("id") != stream.id:
            raise WireError(f"a {kind} frame for no generation running")
        if kind == "chunk":
            try:
                stream.send_end.send_nowait(chunk_from_wire(frame.get("chunk")))
            except trio.WouldBlock:
                raise WireError("more chunks than its window") from None
            except trio.BrokenResourceError:
                pass  # the consumer left: the stop is on its way
        elif kind == "error":
            stream.error = LLMStreamError(str(frame.get("message", ""))[:2000])
        else:
            self.last_tokens = int(frame.get("tokens", 0))
            self.last_stopped = bool(frame.get("stopped"))
            if stream.error is None:
                self.failures = 0  # this child works
            self._end(child, stream)

    def _end(self, child: HostChild, stream: _Stream) -> None:
        stream.ended.set()
        stream.send_end.close()
        self._running.pop(child, None)
        self._slot.release()

    def _recovered(self) -> None:
        """A child is ready: the model is not broken (any more), here and in the data
        folder, where an earlier daemon may have left its mark."""
        first, self._started_once = not self._started_once, True
        if self._broken_until is None:
            if first:
                self._write_broken(None)  # a no-op unless a mark is there
            return
        self._broken_until = None
        self.broken_message = None
        log.warning("the local model process started again: it is no longer marked broken")
        self._write_broken(None)

    def _died(self, child: HostChild) -> None:
        child.dead = True
        how = child.how()
        stream = self._running.get(child)
        if stream is not None:
            stream.error = LocalModelDiedError(
                f"the local model process died ({how}) — {SEE_DOCTOR}"
            )
            self._end(child, stream)
        probed = child.probing and not child.ready.is_set() and child.fatal is None
        if child.killed is None and not probed:
            self._count_death(child, how)
        elif child.killed:
            log.info("the local model process ended: %s", child.killed)
        child.settled.set()
        if self._child is child:
            self._child = None

    def _count_death(self, child: HostChild, how: str) -> None:
        self.failures += 1
        tail = child.stderr.tail()
        when = "while loading the model" if not child.ready.is_set() else "while running"
        self.last_death = {"how": how, "when": when, "stderr": tail, "fatal": child.fatal}
        now = trio.current_time()
        self._next_start = now + backoff_delay(self.failures, base=BACKOFF_FIRST, cap=BACKOFF_MAX)
        lines = "\n".join(f"    {line}" for line in tail) or "    (nothing)"
        pid = child.proc.pid if child.proc is not None else "-"
        log.warning(
            "the local model process (pid %s) died %s (%s); its last stderr lines:\n%s",
            pid,
            when,
            how,
            lines,
        )
        if self.failures < BROKEN_AFTER:
            return
        self._broken_until = now + BROKEN_RETRY
        quoted = " | ".join(tail) or "(nothing)"
        cause = f"{how}; {child.fatal}" if child.fatal else how
        self.broken_message = (
            f"the local model is broken: its process died {self.failures} times in a row "
            f"before it could answer (last: {cause}); the last lines of its stderr: {quoted} — "
            f"{SEE_DOCTOR}. It is tried again in {BROKEN_RETRY / 60:g} minutes, or when the "
            "daemon restarts"
        )
        log.error("%s", self.broken_message)
        self._write_broken({"message": self.broken_message, **self.last_death})

    def _write_broken(self, report: dict[str, Any] | None) -> None:
        if self.data_dir is not None and self.running:
            write = host_state.remember_broken
            self.nursery.start_soon(self._write_state, write, self.data_dir, report)

    async def _write_state(self, write: Callable[..., None], *args: Any) -> None:
        """A write of the data folder's state file, one at a time in the order asked (each
        reads the file and replaces it: two at once could undo each other), finished even
        when the daemon stops meanwhile (what `navi doctor` reads); failing, it is only
        logged (it is a note)."""
        with trio.CancelScope(shield=True):
            async with self._state_writes:
                try:
                    await trio.to_thread.run_sync(write, *args)
                except OSError as exc:
                    log.warning("could not write %s: %s", host_state.STATE_FILE, exc)
