"""An LLM stream's body cut into lines: at LF, CRLF and CR only, however the reads fall,
each line bounded in bytes; over real HTTP for both dialects."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import llm_served
import pytest
import trio
from hypothesis import assume, given
from hypothesis import strategies as st

from navi_trio.errors import LLMMalformedStreamError
from navi_trio.llm.base import ChatRequest, DoneChunk, TextChunk
from navi_trio.llm.http import _encoding, stream_chunks
from navi_trio.llm.lines import LineSplitter
from navi_trio.llm.ollama import OllamaParser
from navi_trio.testing.fake_llm import open_fake_llm

TIMEOUT = 10
# Line breaks to str.splitlines, but not line ends of NDJSON or server-sent events.
NOT_LINE_ENDS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


_NO_END = st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"])


def _split(body: bytes, cuts: list[int], limit: int = 1 << 20) -> list[bytes]:
    splitter = LineSplitter(limit)
    lines: list[bytes] = []
    start = 0
    for cut in [*sorted(set(cuts)), len(body)]:
        lines += splitter.feed(body[start:cut])
        start = cut
    return lines + splitter.finish()


@given(
    st.lists(
        st.tuples(
            st.text(alphabet=_NO_END, max_size=20),
            st.sampled_from(["\n", "\r\n", "\r"]),
        ),
        max_size=8,
    ),
    st.text(alphabet=_NO_END, max_size=10),
    st.lists(st.integers(min_value=0, max_value=400), max_size=10),
)
def test_lines_come_out_whole_however_the_reads_fall(
    ended: list[tuple[str, str]], last: str, cuts: list[int]
) -> None:
    for (_, end), (after, _) in zip(ended, ended[1:], strict=False):
        assume(end != "\r" or after != "")  # CR then an empty LF line would be a CRLF
    body = ("".join(line + end for line, end in ended) + last).encode()
    want = [line.encode() for line, _ in ended] + ([last.encode()] if last else [])
    assert _split(body, [c for c in cuts if c <= len(body)]) == want


def test_a_crlf_cut_between_two_reads_is_one_line_end() -> None:
    assert _split(b"a\r\nb\r\n", [2]) == [b"a", b"b"]
    assert _split(b"a\r\r\nb", [2, 3]) == [b"a", b"", b"b"]


def test_an_empty_read_between_a_cr_and_its_lf_keeps_them_one_line_end() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"a\r") == [b"a"]
    assert splitter.feed(b"") == []
    assert splitter.feed(b"\nb\n") == [b"b"]


def test_a_line_over_the_bound_is_an_error_naming_it_before_more_is_kept() -> None:
    splitter = LineSplitter(16)
    assert splitter.feed(b"0123456789") == []
    with pytest.raises(LLMMalformedStreamError, match=r"over 16 bytes.*'0123456789abcdefg"):
        splitter.feed(b"abcdefg")  # no line end yet: the part kept is over the bound
    with pytest.raises(LLMMalformedStreamError, match="over 16 bytes"):
        LineSplitter(16).feed(b"ok\n" + b"x" * 17 + b"\nok\n")


class _Counted(bytes):
    """A read whose bytes count every byte a search, split or join passes over, and
    whose joins stay counted: the splitter's work, read as a number, not as a time."""

    touched = 0

    def _touch(self, *others: object) -> None:
        _Counted.touched += len(self) + sum(len(o) for o in others if isinstance(o, bytes))

    def __contains__(self, *args: Any, **kwargs: Any) -> bool:
        self._touch()
        return super().__contains__(*args, **kwargs)

    def find(self, *args: Any, **kwargs: Any) -> int:
        self._touch()
        return super().find(*args, **kwargs)

    def index(self, *args: Any, **kwargs: Any) -> int:
        self._touch()
        return super().index(*args, **kwargs)

    def split(self, *args: Any, **kwargs: Any) -> list[bytes]:
        self._touch()
        return super().split(*args, **kwargs)

    def replace(self, *args: Any, **kwargs: Any) -> bytes:
        self._touch()
        return _Counted(super().replace(*args, **kwargs))

    def __add__(self, other: Any) -> bytes:
        self._touch(other)
        return _Counted(super().__add__(other))

    def __radd__(self, other: Any) -> bytes:
        self._touch(other)
        return _Counted(bytes(other) + bytes(self))


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_a_long_line_in_many_small_reads_is_worked_on_once(end: bytes) -> None:
    """Work linear in the body: each read's bytes are searched (and kept) once, not
    the whole line under way again at every read."""
    reads, size = 2000, 100
    splitter = LineSplitter(reads * size)
    _Counted.touched = 0
    lines: list[bytes] = []
    for i in range(reads):
        lines += splitter.feed(_Counted(bytes([97 + i % 26]) * size))
    lines += splitter.feed(_Counted(end + b"next" + end))
    assert [len(line) for line in lines] == [reads * size, 4]
    assert lines[0][:size] == b"a" * size and lines[0][-size:] == bytes([97 + 1999 % 26]) * size
    assert _Counted.touched <= 4 * reads * size


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
async def test_a_json_string_may_hold_characters_splitlines_would_break_at(dialect: str) -> None:
    """U+2028 and its kind are legal unescaped in JSON (llama.cpp sends them so)."""
    content = f"a{NOT_LINE_ENDS}b"
    if dialect == "ollama":
        message = {"message": {"role": "assistant", "content": content}, "done": False}
        done = {"message": {"role": "assistant", "content": ""}, "done": True}
        lines = f"{json.dumps(message, ensure_ascii=False)}\n{json.dumps(done)}"
    else:
        delta = {"choices": [{"index": 0, "delta": {"content": content}}]}
        stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        lines = f"{json.dumps(delta, ensure_ascii=False)}\n\ndata: {json.dumps(stop)}"
    with trio.fail_after(TIMEOUT):
        async with llm_served.served([{"text": "x", "malformed": lines}], dialect) as (_s, backend):
            chunks = await llm_served.collect(backend, ChatRequest(model="m", messages=[]))
    assert TextChunk(content) in chunks
    assert isinstance(chunks[-1], DoneChunk)


async def test_a_stream_line_over_the_bound_is_an_error_naming_it() -> None:
    big = json.dumps({"message": {"role": "assistant", "content": "x" * 5000}, "done": False})
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm([{"text": "a", "malformed": big}]) as fake,
            httpx.AsyncClient() as client,
        ):
            url = fake.url + "/api/chat"
            chunks = stream_chunks(
                client, url, {"model": "m"}, OllamaParser("m", url), line_max=4096
            )
            with pytest.raises(LLMMalformedStreamError, match="over 4096 bytes"):
                async for _ in chunks:
                    pass


async def test_a_compressed_stream_is_split_after_it_is_decompressed() -> None:
    """A unit test (httpx's mock transport): a server or proxy may gzip the stream."""
    lines = [
        {"message": {"role": "assistant", "content": "hi"}, "done": False},
        {"message": {"role": "assistant", "content": ""}, "done": True},
    ]
    body = gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode())

    async def pieces() -> AsyncIterator[bytes]:
        yield body[:10]
        yield body[10:]

    def answer(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=pieces())

    url = "http://llm.test/api/chat"
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        chunks = [c async for c in stream_chunks(client, url, {}, OllamaParser("m", url))]
    assert chunks[0] == TextChunk("hi") and isinstance(chunks[-1], DoneChunk)


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/x-ndjson",
        "text/event-stream",
        "text/event-stream; charset=latin-1",
        "text/event-stream; CHARSET=ISO-8859-1",
        'application/json; charset="utf-16"',
        "application/json; charset=no-such-codec",
        "application/json; note=charsets",
    ],
)
@pytest.mark.parametrize("default", ["utf-8", "latin-1", "", lambda data: "cp1252"])
def test_the_lines_charset_is_the_one_httpx_reads(content_type: str | None, default: Any) -> None:
    """The charset the lines are decoded in is what httpx says for a streamed answer
    (its Content-Type's charset, else the client's default), read without its parser
    when the header names no charset."""
    headers = {} if content_type is None else {"Content-Type": content_type}

    def response() -> httpx.Response:
        stream = httpx.ByteStream(b"")
        return httpx.Response(200, headers=headers, stream=stream, default_encoding=default)

    assert _encoding(response()) == (response().encoding or "utf-8")
