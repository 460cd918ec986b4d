"""A message handed to the daemon that runs its session keeps its trace context.

Two `navi serve` processes on one PostgreSQL, both tracing over OTLP/HTTP to a collector
in this test on 127.0.0.1; a fake LLM over real HTTP. B runs a turn; a message with a
`traceparent` sent on A waits in B's queue (the queued row), and B's turn for it must
continue the sender's trace. Waits are on frames and on spans received; every test under
`trio.fail_after`; every process is killed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
from daemons import pg_daemons
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from navi_trio.testing import open_fake_llm
from navi_trio.testing._http import MAX_BODY, read_request, send_whole

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 150
SENDER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BODY_MAX = 4 << 20  # one export request, at most


class Collector:
    """An OTLP/HTTP trace receiver: keeps the spans posted to it, answers 200."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.changed = trio.Event()

    async def serve(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_BODY)
        # A daemon stopped while its exporter sends (the end of the test) resets its
        # connection: what it had sent before is in, as the fake LLM server has it.
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async with stream:
                await self._requests(stream, conn)

    async def _requests(self, stream: trio.SocketStream, conn: h11.Connection) -> None:
        while (got := await read_request(stream, conn)) is not None:
            body = got[1]
            assert len(body) <= BODY_MAX, len(body)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.spans.extend(scope.spans)
            self.changed.set()
            self.changed = trio.Event()
            await send_whole(stream, conn, 200, b"", "application/x-protobuf")
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def turns(self, n: int) -> list[Span]:
        """The first `n` turn spans received, once they are in."""
        while len(found := [s for s in self.spans if s.name == "navi.turn"]) < n:
            await self.changed.wait()
        return sorted(found, key=lambda s: s.start_time_unix_nano)


@asynccontextmanager
async def collector() -> AsyncIterator[tuple[Collector, str]]:
    c = Collector()
    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, c.serve, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        yield c, f"http://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


async def test_a_message_handed_to_the_running_daemon_continues_its_senders_trace(
    tmp_path: Path, pg_url: str
) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "B holds the session a while", "delay_chunk": 0.05},
        {"text": "the handed message ran"},
    ]
    with trio.fail_after(TIMEOUT):
        async with collector() as (spans, url), open_fake_llm(replies) as llm:
            async with pg_daemons(
                tmp_path,
                pg_url,
                llm.url,
                2,
                OTEL_EXPORTER_OTLP_ENDPOINT=url,
                OTEL_BSP_SCHEDULE_DELAY="50",  # ms: spans leave soon after they end
            ) as (a, b):
                sid = "admin.traced"
                async with b.connect() as on_b, a.connect() as on_a:
                    first = {"type": "message", "session_id": sid, "content": "one"}
                    assert (await on_b.request(first))["type"] == "session"
                    await llm.wait_requests(1)  # B runs it now
                    ok = await on_a.request({
                        "type": "message", "session_id": sid, "content": "two",
                        "on_busy": "enqueue", "traceparent": SENDER, "tracestate": "rojo=1",
                    })  # fmt: skip
                    assert (ok["type"], ok["queued"]) == ("ok", True), ok
                    for _ in range(2):
                        assert (await on_b.until_end(sid))["reason"] == "complete"
                    one, two = await spans.turns(2)
    assert not one.parent_span_id
    assert two.trace_id.hex() == SENDER[3:35]
    assert two.parent_span_id.hex() == SENDER[36:52]
    assert two.trace_state == "rojo=1"
