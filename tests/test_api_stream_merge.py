"""The writer merges text deltas waiting for a slow WebSocket reader into fewer frames,
with exactly the same text and strictly increasing seqs; a fast reader loses nothing."""

from __future__ import annotations

from pathlib import Path

import trio
from api_ws import Client, open_daemon
from prometheus_client.parser import text_string_to_metric_families

from navi_trio.api.metrics import DaemonMetrics

TIMEOUT = 60
BIG = {"answer_max_chars": 10**9, "answer_max_tokens": 10**9}


def _words(n: int, width: int) -> list[str]:
    return [f"w{i}".ljust(width, "x") for i in range(n)]


async def _deltas(c: Client, sid: str) -> list[dict[str, object]]:
    await c.until_end(sid)
    return [f for f in c.frames if f["type"] == "text_delta" and f.get("session_id") == sid]


def _check(deltas: list[dict[str, object]], words: list[str]) -> None:
    assert "".join(str(f["text"]) for f in deltas).split() == words
    seqs = [int(str(f["seq"])) for f in deltas]
    assert all(a < b for a, b in zip(seqs, seqs[1:], strict=False)), seqs


async def test_a_slow_reader_gets_merged_deltas_with_the_same_text(tmp_path: Path) -> None:
    # ~1 MB of answer, one word per delta: more than the socket buffers hold while the
    # reader waits, so deltas queue in the outbox and the writer merges them.
    words = _words(2000, 500)
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[{"text": " ".join(words)}], **BIG) as d:
            async with d.connect("alice") as c:
                created = await c.request({"type": "message", "content": "hi"})
                assert created["type"] == "session", created
                assert d.harness.fake is not None
                await d.harness.fake.wait_completed(1)  # the reader was away meanwhile
                sid = str((await c.until_type("ok", id=created["id"]))["session_id"])
                deltas = await _deltas(c, sid)
    _check(deltas, words)
    # How many merge depends on how much the socket's buffers took: at least some did.
    assert len(deltas) < len(words), len(deltas)
    assert max(len(str(f["text"])) for f in deltas) <= 64_000


async def test_a_fast_reader_loses_nothing(tmp_path: Path) -> None:
    words = _words(300, 3)
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[{"text": " ".join(words)}], **BIG) as d:
            async with d.connect("alice") as c:
                created = await c.request({"type": "message", "content": "hi"})
                sid = str((await c.until_type("ok", id=created["id"]))["session_id"])
                deltas = await _deltas(c, sid)
    _check(deltas, words)


async def test_merged_deltas_are_counted_in_the_daemons_metrics(tmp_path: Path) -> None:
    """``navi_frames_merged_total`` moves by the deltas merged for a slow reader: none
    before, some after, never more than the frames the reader was spared."""
    metrics = DaemonMetrics()
    words = _words(2000, 500)
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, metrics=metrics, replies=[{"text": " ".join(words)}], **BIG
        ) as d:
            before = _merged(metrics)
            async with d.connect("alice") as c:
                created = await c.request({"type": "message", "content": "hi"})
                assert d.harness.fake is not None
                await d.harness.fake.wait_completed(1)  # the reader was away meanwhile
                sid = str((await c.until_type("ok", id=created["id"]))["session_id"])
                deltas = await _deltas(c, sid)
            after = _merged(metrics)
    _check(deltas, words)
    assert before == 0
    # The run's own event channel may merge some before they are frames: at most the rest.
    assert 0 < after <= len(words) - len(deltas), (after, len(deltas))


def _merged(metrics: DaemonMetrics) -> float:
    """The counter as a scrape reads it (prometheus_client's parser, the page's text)."""
    for family in text_string_to_metric_families(metrics.page().decode()):
        for s in family.samples:
            if s.name == "navi_frames_merged_total":
                return s.value
    raise AssertionError("navi_frames_merged_total is not on the metrics page")
