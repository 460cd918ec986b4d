"""`open_daemon`: the one client of the daemon's WebSocket protocol.

    async with open_daemon(url, token) as daemon:
        run = OurRun.of(await daemon.send_message("hi", session_id=sid), "hi")
        while not run.ended:
            frame = await daemon.receive()
            if run.ours(frame):
                ...

Before the hello, the socket at the other end of the connection is looked up when it is
on this machine: it must be an account's the client trusts with its token, or nothing of
the token is sent (`UntrustedDaemonError`).

Like trio-websocket's `open_websocket`, which it is built on: the connect and the hello
are bounded (`connect_timeout`, `hello_timeout`); not getting there is
`DaemonUnreachableError`, raised ``from None`` with the lower layer's words in its
message and `reason`; a refused hello is the `RemoteError` carrying the daemon's wire
code. A close that fails once the caller's work is done is not the caller's error.

One reader at a time: frames are read by the task awaiting `receive` or a request, not
by a task of ours (trio-websocket's reader is the only one in the background). A
request sends its frame with a fresh id and reads until the reply with that id, within
its `timeout`; the frames read meanwhile (at most `PENDING_MAX`) wait for `receive`, in
order. Any number of tasks may send.

What `receive` hands on is a session's stream without gaps or repeats:

- a session frame whose seq is not past the last one delivered for its session (same
  epoch) is dropped: a replay overlapping what was seen. A ``subscribe`` sent through
  `send` moves that mark to its ``last_seq``;
- ``lagged`` (the daemon cut this connection off a session it fell behind on): when it
  names frames past the last one delivered, the session is subscribed again from that
  one, with its epoch; what the daemon then sends twice is dropped as above. The frame
  itself is handed on (the chat says so);
- ``resync`` is handed on (the frames asked for are gone: reload the history); the
  stream goes on from its seq;
- an ``unauthorized`` error (the daemon is closing the connection) raises `RemoteError`;
- a ``sessions`` ``history`` reply is one page of the history: while it names a
  ``next_cursor``, the next page is asked for (`wire.history` with that cursor), and
  once the last came the whole history is handed on as one reply: every page's
  messages, the last page's seq and epoch (subscribe from there), the first request's
  id. A page refused for the frame rate is asked for again shortly.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from navi_trio import wire
from navi_trio.api.our_run import Accepted as Accepted
from navi_trio.api.our_run import OurRun as OurRun
from navi_trio.errors import DaemonUnreachableError, RemoteError
from navi_trio.imports import start_up_over
from navi_trio.wire import Frame

if TYPE_CHECKING:  # trio_websocket is imported on use: an embedded `navi run` never needs it
    from navi_trio.api._trio_websocket import WebSocketConnection

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
HELLO_TIMEOUT = 10.0  # the daemon's own wait for a hello (NAVI_WS_HELLO_TIMEOUT_SEC)
REPLY_TIMEOUT = 30.0
CLOSE_TIMEOUT = 2.0
# A long final answer comes as one frame (a long history comes in pages).
MAX_FRAME = 64 * 1024 * 1024
PENDING_MAX = 10_000  # frames kept for `receive` while a request waits for its reply
RESUBSCRIBING_MAX = 64  # our own subscribes after `lagged` waiting for their reply
PAGE_RETRIES = 10  # a history page refused for the frame rate: asked for again …
PAGE_RETRY_SEC = 0.2  # … after this long, this many times at most


def _reason(exc: BaseException) -> str:
    """The most telling text of a lower-layer error (trio-websocket's are often empty)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, BaseExceptionGroup) and len(seen.exceptions) == 1:
            seen = seen.exceptions[0]
            continue
        if str(seen):
            return f"{type(seen).__name__}: {seen}"
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def _drops() -> tuple[type[BaseException], ...]:
    """What trio-websocket raises when a connection cannot be made or is lost."""
    from navi_trio.api._trio_websocket import ConnectionClosed, HandshakeError

    return (OSError, HandshakeError, ConnectionClosed)


def remote_error(frame: Frame) -> RemoteError:
    """The `RemoteError` an error frame of the daemon says."""
    return RemoteError(str(frame.get("code") or "?"), str(frame.get("message") or ""))


@attrs.define
class _Pages:
    """A history being read page by page: what came so far, for the first request's id."""

    first_id: Any
    session_id: str
    messages: list[Any]
    cursor: str
    retries: int = 0


class DaemonConnection:
    """One open connection to the daemon, after its welcome (see the module docstring)."""

    def __init__(self, ws: WebSocketConnection, url: str) -> None:
        self._ws = ws
        self.url = url
        self.welcome: Frame = {}
        self._pending: collections.deque[Frame] = collections.deque()
        # session id -> (last seq delivered, its epoch)
        self._seen: dict[str, tuple[int, str | None]] = {}
        self._resubscribing: set[str] = set()  # ids of our subscribes after `lagged`
        self._pages: dict[str, _Pages] = {}  # our request id of a history's next page -> it
        self._ids = itertools.count(1)
        self._reading = False

    @property
    def role(self) -> str:
        user = self.welcome.get("user")
        return str(user.get("role") or "user") if isinstance(user, dict) else "user"

    # -- sending ------------------------------------------------------------------------

    async def send(self, frame: Frame) -> None:
        """Send one frame (built with `navi_trio.wire`); a lost connection is
        `DaemonUnreachableError`."""
        from navi_trio.api._trio_websocket import ConnectionClosed

        kind, sid = frame.get("type"), frame.get("session_id")
        if kind in (wire.SUBSCRIBE, wire.UNSUBSCRIBE) and isinstance(sid, str):
            last = frame.get("last_seq")
            if kind == wire.SUBSCRIBE and isinstance(last, int):
                epoch = frame.get("epoch")
                self._seen[sid] = (last, epoch if isinstance(epoch, str) else None)
            else:
                self._seen.pop(sid, None)
        try:
            await self._ws.send_message(wire.encode(frame))
        except ConnectionClosed as exc:
            raise self._lost(exc) from None

    def _lost(self, exc: BaseException) -> DaemonUnreachableError:
        reason = _reason(exc)
        return DaemonUnreachableError(
            f"the daemon at {self.url} closed the connection ({reason})", reason=reason
        )

    # -- following a session across connections -----------------------------------------

    async def follow(self, session_id: str) -> None:
        """Subscribe to `session_id` live, its mark at the session's seq then (the reply's;
        no session yet: 0), so that a later connection that `carry`s this one's marks is
        replayed every frame of it since, even when none came here (an ``ok`` lost)."""
        try:
            reply = await self.request(wire.subscribe(session_id, None))
        except RemoteError as exc:
            if exc.code != "not_found":
                raise
            reply = {}  # a new session: its message makes it, its frames count from 1
        if session_id not in self._seen:
            seq = reply.get("seq")
            self._seen[session_id] = (seq if isinstance(seq, int) else 0, None)

    def mark(self, session_id: str) -> tuple[int, str | None] | None:
        """The seq (and epoch) of the last frame of `session_id` handed on, if any."""
        return self._seen.get(session_id)

    def carry(self, old: DaemonConnection) -> None:
        """Go on from `old`, a connection that dropped: its sessions' marks, and the frames
        it read and did not hand on yet (before any of this one's)."""
        for sid, mark in old._seen.items():
            self._seen.setdefault(sid, mark)
        self._pending.extendleft(reversed(old._pending))
        old._pending.clear()

    # -- receiving ----------------------------------------------------------------------

    async def receive(self) -> Frame:
        """The next frame of the stream (see the module docstring)."""
        if self._pending:
            return self._pending.popleft()
        with self._one_reader():
            return await self._next()

    def __aiter__(self) -> AsyncIterator[Frame]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[Frame]:
        while True:
            yield await self.receive()

    @contextmanager
    def _one_reader(self) -> Iterator[None]:
        if self._reading:
            raise trio.BusyResourceError("another task is already reading this connection")
        self._reading = True
        try:
            yield
        finally:
            self._reading = False

    async def _read(self) -> Frame:
        """The next frame off the wire, decoded."""
        from navi_trio.api._trio_websocket import ConnectionClosed

        try:
            text = await self._ws.get_message()
        except ConnectionClosed as exc:
            raise self._lost(exc) from None
        try:
            return wire.decode(text)
        except wire.BadFrame as exc:
            raise RemoteError("bad_frame", str(exc)) from None

    async def _next(self) -> Frame:
        """The next frame for the caller: replays seen before dropped, `lagged` handled."""
        while True:
            frame = await self._read()
            kind, rid = frame["type"], frame.get("id")
            if isinstance(rid, str) and rid in self._resubscribing:
                self._resubscribing.discard(rid)
                if kind == wire.ERROR:  # the daemon's own resubscription still stands
                    log.warning("subscribing again after lagging was refused: %s", frame)
                continue
            if kind == wire.ERROR and frame.get("code") == "unauthorized":
                raise remote_error(frame)
            if (kind == wire.SESSIONS and frame.get("action") == "history") or (
                kind == wire.ERROR and isinstance(rid, str) and rid in self._pages
            ):
                whole = await self._history_page(frame)
                if whole is None:
                    continue
                frame = whole
            if kind == wire.LAGGED:
                await self._lagged(frame)
            elif self._repeated(frame):
                continue
            return frame

    def _repeated(self, frame: Frame) -> bool:
        """Whether `frame` was delivered already; else it moves its session's mark."""
        sid, seq, epoch = frame.get("session_id"), frame.get("seq"), frame.get("epoch")
        if not isinstance(sid, str) or not isinstance(seq, int):
            return False
        epoch = epoch if isinstance(epoch, str) else None
        if frame["type"] == wire.RESYNC:  # the stream starts again from here
            self._seen[sid] = (seq, epoch)
            return False
        if not wire.is_session_frame(frame):
            return False
        mark = self._seen.get(sid)
        if mark is not None:
            last, last_epoch = mark
            if seq <= last and (epoch is None or last_epoch is None or epoch == last_epoch):
                return True
            epoch = epoch or last_epoch
        self._seen[sid] = (seq, epoch)
        return False

    async def _lagged(self, frame: Frame) -> None:
        """Subscribe again from the last frame delivered, when frames past it were missed."""
        sid, missed_from, missed_to = (
            frame.get("session_id"),
            frame.get("missed_from"),
            frame.get("missed_to"),
        )
        if not isinstance(sid, str) or len(self._resubscribing) >= RESUBSCRIBING_MAX:
            return
        mark = self._seen.get(sid)
        if mark is not None:
            last, epoch = mark
            if isinstance(missed_to, int) and missed_to <= last:
                return  # nothing past what we have
        elif isinstance(missed_from, int) and missed_from > 0:
            last, epoch = missed_from - 1, None  # none delivered: from before the first missed
        else:
            return
        rid = f"navi-resubscribe-{next(self._ids)}"
        self._resubscribing.add(rid)
        await self.send({**wire.subscribe(sid, last, epoch), "id": rid})

    async def _history_page(self, frame: Frame) -> Frame | None:
        """A page of a history (or the refusal of one we asked for): None while pages
        are still coming, else what to hand on (the module docstring)."""
        rid = frame.get("id")
        pages = self._pages.pop(rid, None) if isinstance(rid, str) else None
        if frame["type"] == wire.ERROR:
            assert pages is not None
            if frame.get("code") == "rate_limited" and pages.retries < PAGE_RETRIES:
                pages.retries += 1
                await trio.sleep(PAGE_RETRY_SEC)
                await self._ask_page(pages)
                return None
            return _with_id(frame, pages.first_id)
        messages = frame.get("messages")
        messages = messages if isinstance(messages, list) else []
        cursor = frame.get("next_cursor")
        if pages is not None:
            pages.messages += messages
        if not isinstance(cursor, str):  # the last page
            if pages is None:
                return frame
            return _with_id({**frame, "messages": pages.messages}, pages.first_id)
        if pages is None:
            sid = str(frame.get("session_id"))
            pages = _Pages(first_id=rid, session_id=sid, messages=list(messages), cursor=cursor)
        elif cursor == pages.cursor:
            raise RemoteError("bad_frame", f"the daemon sent the history cursor {cursor!r} twice")
        pages.cursor, pages.retries = cursor, 0
        await self._ask_page(pages)
        return None

    async def _ask_page(self, pages: _Pages) -> None:
        rid = f"navi-history-{next(self._ids)}"
        self._pages[rid] = pages
        await self.send({**wire.history(pages.session_id, pages.cursor), "id": rid})

    # -- requests -------------------------------------------------------------------------

    async def request(self, frame: Frame, *, timeout: float = REPLY_TIMEOUT) -> Frame:  # noqa: ASYNC109
        """Send `frame` with a fresh id and return the daemon's reply to it; an error reply
        is `RemoteError`, no reply within `timeout` seconds `DaemonUnreachableError`."""
        return (await self._exchange(frame, timeout))[-1]

    async def send_message(
        self,
        content: str,
        *,
        session_id: str | None = None,
        profile: str | None = None,
        cwd: str | None = None,
        mode: str | None = None,
        on_busy: str | None = None,
        trace: Mapping[str, str] | None = None,
        key: str | None = None,
        timeout: float = REPLY_TIMEOUT,  # noqa: ASYNC109
    ) -> Accepted:
        """Send a user message and wait until the daemon stored it (its ``ok``);
        `trace`: the W3C trace context its run continues (``traceparent``, ``tracestate``);
        `key`: the message's client key (the ok of a key taken already: `duplicate`)."""
        frame = wire.message(content, session_id, profile, cwd, mode, on_busy, trace, key)
        replies = await self._exchange(frame, timeout)
        try:
            return Accepted.of(replies)
        except ValueError as exc:
            raise RemoteError("bad_frame", str(exc)) from None

    async def stop(self, session_id: str, *, timeout: float = REPLY_TIMEOUT) -> bool:  # noqa: ASYNC109
        """Stop the session's running turn; False when none was running."""
        return bool((await self.request(wire.stop(session_id), timeout=timeout)).get("stopped"))

    async def _exchange(self, frame: Frame, timeout: float) -> list[Frame]:  # noqa: ASYNC109
        """The replies carrying the id sent with `frame`: a ``session`` one (a message
        that made its session), then the last."""
        rid = f"navi-{next(self._ids)}"
        kind = frame.get("type")
        replies: list[Frame] = []
        with self._one_reader():
            await self.send({**frame, "id": rid})
            try:
                with trio.fail_after(timeout):
                    while True:
                        got = await self._next()
                        if got.get("id") != rid:
                            self._keep(got, kind)
                        elif got["type"] == wire.ERROR:
                            raise remote_error(got)
                        else:
                            replies.append(got)
                            if got["type"] != wire.SESSION:
                                return replies
            except trio.TooSlowError:
                raise DaemonUnreachableError(
                    f"the daemon at {self.url} did not answer {kind!r} within {timeout:g} s",
                    reason=f"no answer within {timeout:g} s",
                ) from None

    def _keep(self, frame: Frame, kind: Any) -> None:
        if len(self._pending) >= PENDING_MAX:
            raise DaemonUnreachableError(
                f"the daemon at {self.url} sent more than {PENDING_MAX} frames without "
                f"answering {kind!r}",
                reason="no answer",
            )
        self._pending.append(frame)

    # -- the hello ------------------------------------------------------------------------

    async def _hello(self, token: str, timeout: float) -> None:  # noqa: ASYNC109
        try:
            with trio.fail_after(timeout):
                await self.send(wire.hello(token))
                frame = await self._read()
        except trio.TooSlowError:
            raise DaemonUnreachableError(
                f"the daemon at {self.url} did not answer the hello within {timeout:g} s",
                reason=f"no welcome within {timeout:g} s",
            ) from None
        if frame["type"] == wire.ERROR:
            raise remote_error(frame)
        if frame["type"] != wire.WELCOME:
            raise RemoteError("bad_frame", f"expected a welcome, got a {frame['type']!r} frame")
        self.welcome = frame


@asynccontextmanager
async def open_daemon(
    url: str,
    token: str,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    hello_timeout: float = HELLO_TIMEOUT,
    close_timeout: float = CLOSE_TIMEOUT,
    max_frame: int = MAX_FRAME,
    accounts: Collection[int] | None = None,
    own_listener: bool = False,
) -> AsyncIterator[DaemonConnection]:
    """Connect to the daemon at `url`, say hello with `token`, yield the connection.

    `accounts`: the uids whose socket on this machine may get the token (default:
    `trusted_accounts` of the environment). `own_listener`: `url` is a private server of
    this very process, whose listening socket it holds, so no other account can answer
    there: the socket table is not read (a few ms per connect on a busy machine).

    `bounds` holds the connect and the close to their deadlines: trio-websocket's own
    timeouts leave its reader task waiting on a peer that keeps the socket open without
    answering, and the whole `async with` with it.
    """
    from navi_trio.api._trio_websocket import open_websocket_url

    phase = "connecting"
    bounds = trio.CancelScope(deadline=trio.current_time() + connect_timeout)
    try:
        with bounds:
            async with open_websocket_url(
                url,
                connect_timeout=math.inf,  # `bounds` says when
                disconnect_timeout=close_timeout,
                max_message_size=max_frame,
            ) as ws:
                bounds.deadline = math.inf
                daemon = DaemonConnection(ws, url)
                if not own_listener:
                    await _check_other_end(ws, url, accounts)
                await daemon._hello(token, hello_timeout)
                phase = "open"
                # A client's start-up ends here: the collections it put off are its
                # session's again (a private daemon's runtime has ended it already).
                start_up_over()
                yield daemon
                phase = "closing"
                bounds.deadline = trio.current_time() + close_timeout
    except _drops() as exc:
        if phase == "open":
            raise
        if phase == "closing":  # the caller's work is done; the close handshake is not
            log.debug("closing the connection to %s: %s", url, _reason(exc))
            return
        from navi_trio.api._trio_websocket import ConnectionRejected

        if isinstance(exc, ConnectionRejected):  # a server, but no WebSocket: not navi's
            reason = f"it answered the WebSocket handshake with HTTP {exc.status_code}"
            raise DaemonUnreachableError(
                f"{url} is not a navi daemon ({reason}): check --url", reason=reason
            ) from None
        reason = _reason(exc)
        raise DaemonUnreachableError(
            f"no daemon answers at {url}: start one with `navi serve` ({reason})", reason=reason
        ) from None
    if bounds.cancelled_caught and phase == "connecting":
        reason = f"no WebSocket handshake within {connect_timeout:g} s"
        raise DaemonUnreachableError(
            f"no daemon answers at {url}: start one with `navi serve` ({reason})", reason=reason
        )


async def _check_other_end(
    ws: WebSocketConnection, url: str, accounts: Collection[int] | None
) -> None:
    """`UntrustedDaemonError` unless the other end of `ws` may get a token."""
    from navi_trio.api.listener import check_other_end, trusted_accounts

    local, remote = ws.local, ws.remote
    if isinstance(local, str) or isinstance(remote, str):  # not a socket: nothing to look up
        return
    trusted = trusted_accounts(os.environ) if accounts is None else accounts
    # Read in this thread: /proc/net/tcp is the kernel's table, made in memory, not disk
    # I/O; and the connection must not move (a virtual clock jumping) while it is looked up.
    check_other_end(url, (local.address, local.port), (remote.address, remote.port), trusted)
    await trio.lowlevel.checkpoint()


def _with_id(frame: Frame, rid: Any) -> Frame:
    """`frame` answering the request `rid` (None: a request sent without an id)."""
    frame = {k: v for k, v in frame.items() if k != "id"}
    if rid is not None:
        frame["id"] = rid
    return frame


async def daemon_answers(url: str, timeout: float = 2.0) -> bool:  # noqa: ASYNC109
    """True when a WebSocket handshake at `url` succeeds within `timeout` seconds (no
    hello: a probe needs no token)."""
    from navi_trio.api._trio_websocket import open_websocket_url

    with trio.move_on_after(timeout):
        try:
            async with open_websocket_url(url, connect_timeout=timeout):
                return True
        except _drops():
            return False
    return False
