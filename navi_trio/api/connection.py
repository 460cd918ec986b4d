"""One WebSocket connection as an actor: hello, then a reader and a writer.

    reader  ws -> parse_frame -> Commands.handle -> session actors / store
    waits   a command's wait that may take long (a message until it is stored): beside
            the reader, at most DEFERRED_MAX at a time, each bounded by its command
    pumps   one per subscribed session: its Follower (core/session/broadcast.py) -> outbox
    writer  outbox (ONE, bounded in frames and bytes: api/outbox.py) -> ws

Every frame the connection sends goes through the outbox, except that while the
writer waits with nothing queued, a session's frame is written to the socket in the
publisher's call (`_send_now`); what the socket does not take, the writer sends next,
before anything else (api/web.py `ReplayStream`). A slow client fills the outbox and
the pumps block; meanwhile the deltas waiting in each subscription merge
(core/turn/channel.py), so the writer itself never merges. When a subscription's
queue is full anyway, the session's broadcast (core/session/broadcast.py) drops it
with ``lagged`` set; the pump's `Follower` subscribes again from the last seq it
delivered, and the pump sends a ``lagged`` frame (api/protocol.py, where every frame
is built) before the frames that follow. A run never waits for a client. The
connection sees the daemon's core through `DaemonCore` (api/services.py), never the
concrete Runtime.

A bad frame gets an error frame and the connection goes on; so does any refused
request (`RequestError`). The reader never waits for a message to be stored: the
frames behind it (a stop, a sessions list) are answered meanwhile. Only a missing or
bad hello, too many connections for a user, or a token revoked while it is open closes
the connection (after the error frame).

Revocation: the token is checked again after every change of the users table
(core/session/user_watch.py, whichever process or daemon made it): rotated away, or its user
removed, the connection ends at once, with an ``unauthorized`` error frame saying which,
and closes with code 1008. Nothing it sent after that is read.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio
from wsproto import WSConnection
from wsproto.connection import ConnectionState

from navi_trio.api._trio_websocket import CloseReason, ConnectionClosed, WebSocketConnection
from navi_trio.api.auth import Tokens, User
from navi_trio.api.commands import Commands
from navi_trio.api.limits import TokenBucket
from navi_trio.api.outbox import Outbox
from navi_trio.api.protocol import (
    SHOWN_AS_IS,
    Approval,
    Frame,
    Hello,
    RequestId,
    Stop,
    encode,
    error_frame_for,
    for_user,
    lagged_frame,
    notice_frame,
    parse_frame,
    welcome_frame,
)
from navi_trio.api.signin import SigninCodes
from navi_trio.api.web import ReplayStream
from navi_trio.core.session import Follower, Lagged
from navi_trio.core.turn import effective_mode
from navi_trio.errors import (
    AuthError,
    LimitError,
    NaviError,
    ProtocolError,
    RateLimitedError,
    RequestError,
    client_error,
)

if TYPE_CHECKING:
    from navi_trio.api.metrics import DaemonMetrics
    from navi_trio.api.services import DaemonCore
    from navi_trio.core.session import SessionActor


class ConnectionHost(Protocol):
    """What a connection needs of its server (api/server.py `ApiServer`)."""

    runtime: DaemonCore
    tokens: Tokens  # whose a hello's token is
    metrics: DaemonMetrics | None  # `navi serve`'s (frames sent, lagged)
    signin: SigninCodes  # the one-time codes a hello may say instead of a token

    async def connected(self, user: User) -> str | None: ...
    async def released(self, key: str | None) -> None: ...
    def disconnected(self, user: User) -> None: ...


log = logging.getLogger(__name__)

OUTBOX_SIZE = 256
MESSAGE_TOO_BIG = 1009  # trio-websocket's close of a message over its limit
# What waits for a client that does not read, in memory (api/outbox.py): past it, the
# reader stops taking its requests and its subscriptions fall behind (lagged).
OUTBOX_MAX_BYTES = 4 * 1024 * 1024
CLOSE_SEND_TIMEOUT = 5.0
# Command waits running beside the reader at once; past that the reader waits for one to
# end (each is bounded: a message's by NAVI_MESSAGE_ACCEPT_TIMEOUT_SEC).
DEFERRED_MAX = 64
# Commands the frames-per-second limit never drops (control frames: stop, approve, deny).
RATE_EXEMPT = (Stop, Approval)


class Connection:
    def __init__(
        self,
        server: ConnectionHost,
        ws: WebSocketConnection,
        peer: str,
        *,
        on_hello: Callable[[], object] = lambda: None,
        wire: ReplayStream | None = None,
    ) -> None:
        self.server = server
        self.ws = ws
        self._wire = wire  # the stream under `ws`, for a frame written at once
        self._proto: WSConnection | None = None  # `ws`'s wsproto state, once asked for
        self.peer = peer
        self._on_hello = on_hello  # the server's: no longer a connection without a hello
        self.user: User | None = None
        self._token: str | None = None  # the hello's (or the one its code stood for)
        self._outbox = Outbox(OUTBOX_SIZE, OUTBOX_MAX_BYTES, f"connection {peer}")
        self._nursery: trio.Nursery | None = None
        # session id -> (its follower, the pump's cancel scope)
        self._subs: dict[str, tuple[Follower, trio.CancelScope]] = {}
        settings = server.runtime.settings
        self._bucket = TokenBucket(settings.ws_frames_per_sec, settings.ws_frames_burst)
        self._deferred = trio.Semaphore(DEFERRED_MAX)

    # -- life -------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            user, token, seen, redeemed = await self._hello()
        except RequestError as exc:
            log.info("connection %s refused: %s", self.peer, exc)
            await self._close_with(error_frame_for(exc))
            return
        except ConnectionClosed:
            closed = self.ws.closed
            if closed is not None and closed.code == MESSAGE_TOO_BIG:
                log.info(
                    "connection %s refused: %s (NAVI_WS_HELLO_MAX_BYTES)", self.peer, closed.reason
                )
            return
        self._on_hello()
        self.user = user
        self._token = token
        try:
            slot = await self.server.connected(user)
        except LimitError as exc:
            log.warning("connection %s of %s refused: %s", self.peer, user.name, exc)
            await self._close_with(error_frame_for(exc))
            return
        log.info("connection %s: user %s (%s) connected", self.peer, user.name, user.role)
        commands = Commands(self.server.runtime, self, user)
        revoked: list[AuthError] = []
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                nursery.start_soon(self._notices, user.id)
                nursery.start_soon(self._watch_token, user, token, seen, revoked)
                rt = self.server.runtime
                config = rt.config.current
                welcome = welcome_frame(
                    user.name,
                    user.role,
                    rt.settings.llm_backend,
                    profiles=config.profiles_for(user.role),
                    default_profile=config.default_for(user.role),
                    default_modes={
                        p: effective_mode(config.profile(p).policy, user.role, None)
                        for p in config.profiles_for(user.role)
                    },
                    token=token if redeemed else None,  # a code's page keeps it as pasted
                )
                await self.ws.send_message(encode(welcome))
                await self._reader(commands)
                nursery.cancel_scope.cancel()
            if revoked:
                await self._close_with(error_frame_for(revoked[0]))
        except* ConnectionClosed:
            pass  # the client went away: its subscriptions end, its runs go on
        finally:
            self._nursery = None
            self.server.runtime.client_tools.drop(self)  # their calls waiting fail now
            self._outbox.close()  # what waited for this client goes now, not at a gc
            for follower, _ in self._subs.values():
                follower.close()
            self._subs.clear()
            self.server.disconnected(user)
            await self.server.released(slot)
            log.info("connection %s: user %s disconnected", self.peer, user.name)

    async def _hello(self) -> tuple[User, str, int, bool]:
        """The user of the hello's token, the token, the generation of the users'
        watch read before the token was checked (a change committed after the check is
        a later generation for `_watch_token`, never one it missed), and whether the
        token came from a one-time sign-in code (api/signin.py)."""
        settings = self.server.runtime.settings
        with trio.move_on_after(settings.ws_hello_timeout_sec):
            message = await self.ws.get_message()
            try:
                rid, command = parse_frame(message, settings.ws_frame_max_bytes)
            except ProtocolError as exc:
                raise AuthError(f"the first frame must be a hello with a token ({exc})") from None
            if not isinstance(command, Hello):
                raise AuthError("the first frame must be a hello with a token", request_id=rid)
            seen = self.server.runtime.users.generation
            try:
                token = command.token
                if command.code is not None:
                    token = self.server.signin.redeem(command.code)
                assert token is not None  # a Hello holds one of the two
                user = await self.server.tokens.user(token)
            except AuthError as exc:
                exc.request_id = rid
                raise
            return user, token, seen, command.code is not None
        raise AuthError(f"no hello within {settings.ws_hello_timeout_sec:g} s")

    async def _watch_token(
        self, user: User, token: str, seen: int, revoked: list[AuthError]
    ) -> None:
        """After each change of the users table, the token again: rotated away or its
        user removed, the connection ends (the error goes in `revoked`, for `run`)."""
        rt = self.server.runtime
        while True:
            seen = await rt.users.wait(seen)
            try:
                why = await self.server.tokens.revoked(user, token)
            except NaviError as exc:  # the next change looks again
                log.warning(
                    "connection %s: checking the token of %s failed: %s", self.peer, user.name, exc
                )
                continue
            if why is None:
                continue
            log.warning("connection %s closed: %s", self.peer, why)
            revoked.append(
                AuthError(f"{why}: this connection is closed; connect again with a valid token")
            )
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()
            return

    async def _close_with(self, frame: Frame) -> None:
        with trio.move_on_after(CLOSE_SEND_TIMEOUT):
            try:
                await self.ws.send_message(encode(frame))
                await self.ws.aclose(code=1008, reason=str(frame.get("code", "")))
            except ConnectionClosed:
                pass

    def signin_code(self) -> tuple[str, float]:
        """A one-time code for this connection's token, and for how many seconds it holds."""
        assert self._token is not None  # commands run after the hello only
        return self.server.signin.issue(self._token), self.server.signin.ttl

    # -- reader / writer ----------------------------------------------------------------

    async def _reader(self, commands: Commands) -> None:
        settings = self.server.runtime.settings
        while True:
            message = await self.ws.get_message()
            rid = None
            try:
                try:
                    rid, command = parse_frame(message, settings.ws_frame_max_bytes)
                except ProtocolError:
                    self._bucket.take()  # a bad frame counts against the rate too
                    raise
                # stop / approve / deny are never dropped for rate: a dropped stop let a
                # run go on to its timeout. They still pass the size limit and auth.
                if not isinstance(command, RATE_EXEMPT) and not self._bucket.take():
                    raise RateLimitedError(
                        f"more than {settings.ws_frames_per_sec:g} frames per second: "
                        "this frame was dropped"
                    )
                await commands.handle(rid, command)
            except Exception as exc:  # every failure is answered, the connection goes on
                await self._failed(rid, exc)

    async def _failed(self, rid: RequestId, exc: Exception) -> None:
        """Answer a request that failed: its code, or internal (and keep going)."""
        answer = client_error(exc)
        if answer.request_id is None:
            answer.request_id = rid
        if answer is exc:
            log.info(
                "refused a request of %s (session %s): %s %s",
                self._who(),
                answer.session_id or "-",
                answer.code,
                answer,
            )
        elif isinstance(exc, NaviError):
            log.warning("request of %s failed: %s", self._who(), exc)
        else:  # our bug: say so, keep the connection and the daemon
            log.error("request of %s failed", self._who(), exc_info=exc)
        await self.send(error_frame_for(answer))

    async def defer(self, rid: RequestId, work: Callable[[], Awaitable[None]]) -> None:
        """Run the rest of a command beside the reader; its failure is answered as the
        reader's are. `work` must bound its own waits."""
        assert self._nursery is not None
        await self._deferred.acquire()
        self._nursery.start_soon(self._deferred_work, rid, work)

    async def _deferred_work(self, rid: RequestId, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except Exception as exc:  # every failure is answered, as the reader answers it
            await self._failed(rid, exc)
        finally:
            self._deferred.release()

    async def _writer(self) -> None:
        # No merging here: deltas merge while they wait in the subscription's queue
        # (core/session/broadcast.py), where a slow client's pump is blocked on the outbox.
        metrics = self.server.metrics
        while True:
            text = await self._outbox.next()
            if text is None:  # the rest of a frame written at once (`_send_now`)
                await self._flush()
                continue
            await self.ws.send_message(text)
            if metrics is not None:
                metrics.frames_sent.n += 1

    async def _flush(self) -> None:
        assert self._wire is not None
        try:
            await self._wire.flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # As trio-websocket's own send ends: the client is gone.
            raise ConnectionClosed(CloseReason(1006, "the connection broke")) from None

    async def send(self, frame: Frame) -> None:
        """Queue `frame` for the writer; waits while the outbox is full (api/outbox.py).
        An error shows its addresses to admins only, and credentials to nobody (`for_user`)."""
        await self._outbox.put(self._text(frame))

    def _send_now(self, frame: Frame) -> bool:
        """`send` without waiting (a pump's hand: its session's frame, in the
        publisher's call), or False: the pump sends it, as it would have.

        While the writer waits with nothing queued and nothing is being sent, the
        frame goes to the socket here, with no task switch: its bytes (`text_frame`,
        while wsproto says the connection is open) to the socket at once, and what it
        does not take the writer sends before anything else (`ReplayStream.write_now`)."""
        try:
            text = self._text(frame)
            wire = self._wire
            outbox = self._outbox
            if (
                wire is not None
                and outbox.may_send_at_once(text)
                and wire.can_write_now()
                and self.ws.closed is None
                and (self._proto or self._wsproto()).state is ConnectionState.OPEN
            ):
                if not wire.write_now(text_frame(text)):
                    outbox.wake()
                outbox.sent_at_once(text)
                metrics = self.server.metrics
                if metrics is not None:
                    metrics.frames_sent.n += 1
                return True
            return outbox.put_nowait(text)
        except Exception:  # the pump meets it again in its own task, where it belongs
            return False

    def _wsproto(self) -> WSConnection:
        self._proto = _wsproto(self.ws)  # the same object for the connection's life
        return self._proto

    def _text(self, frame: Frame) -> str:
        if self.user is not None and frame.get("type") not in SHOWN_AS_IS:
            frame = for_user(frame, admin=self.user.is_admin)
        return encode(frame)

    async def _notices(self, user_id: str) -> None:
        """The user's notices (a scheduled run ended: notices.py) to this client."""
        with self.server.runtime.notices.subscribe(user_id) as notices:
            async for notice in notices:
                await self.send(notice_frame(notice))

    def _who(self) -> str:
        return self.user.name if self.user is not None else self.peer

    # -- subscriptions --------------------------------------------------------------------

    def subscribed(self, session_id: str) -> bool:
        return session_id in self._subs

    def subscribe(self, actor: SessionActor, last_seq: int | None, epoch: str | None) -> None:
        """(Re)subscribe to `actor`'s frames; an old subscription to it is replaced."""
        self.unsubscribe(actor.session_id)
        assert self._nursery is not None
        follower = Follower(actor.subscribe, lambda: actor.epoch, last_seq, epoch, self._send_now)
        scope = trio.CancelScope()
        self._subs[actor.session_id] = (follower, scope)
        self._nursery.start_soon(self._pump, actor.session_id, follower, scope)

    def unsubscribe(self, session_id: str) -> bool:
        entry = self._subs.pop(session_id, None)
        if entry is None:
            return False
        follower, scope = entry
        scope.cancel()
        follower.close()
        return True

    def _current(self, session_id: str) -> Follower | None:
        entry = self._subs.get(session_id)
        return entry[0] if entry is not None else None

    async def _pump(self, sid: str, follower: Follower, scope: trio.CancelScope) -> None:
        with scope:
            async for item in follower:
                if isinstance(item, Lagged):  # the follower subscribed again already
                    log.warning("%s lagged on session %s: resubscribed", self._who(), sid)
                    if self.server.metrics is not None:
                        self.server.metrics.frames_lagged.inc()
                    item = lagged_frame(sid, item.missed_from, item.missed_to)
                await self.send(item)
        if self._current(sid) is follower:
            # The actor ended the subscription (retired or shutting down).
            del self._subs[sid]


def text_frame(text: str) -> bytes:
    """A server's WebSocket frame holding all of `text` (RFC 6455 5.2: FIN, the text
    opcode, no mask), as wsproto makes it for a connection with no extension (the
    server accepts none: api/server.py), without its layers (a tenth of the time)."""
    data = text.encode()
    size = len(data)
    if size < 126:
        return bytes((0x81, size)) + data
    if size < 65536:
        return _HEAD_16.pack(0x81, 126, size) + data
    return _HEAD_64.pack(0x81, 127, size) + data


_HEAD_16 = struct.Struct("!BBH")
_HEAD_64 = struct.Struct("!BBQ")


def _wsproto(ws: WebSocketConnection) -> WSConnection:
    """The wsproto state of `ws`, which makes its frames' bytes. trio-websocket (0.12)
    keeps it without a public name; tests/test_api_direct_write.py fails if it moves."""
    state: Any = ws
    proto = state._wsproto
    assert isinstance(proto, WSConnection), "trio-websocket moved its wsproto state"
    return proto
