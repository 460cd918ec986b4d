"""Every exception navi_trio raises on purpose.

The tree (every subclass of NaviError in navi_trio is defined here)::

    NaviError
    ├── ConfigError                 a config file or env var is missing or malformed
    ├── UsageError                  bad command-line arguments (argparse's own exit is replaced
    │                               by it); also a bad argument of `navi mcp serve`'s tools
    ├── StoreError                  the SQLite store failed (a bad argument, a bad row...)
    │   ├── NotQueuedError          a queued message was gone when its run went to take it
    │   │                           (another daemon ran it, or the queue's cap dropped it)
    │   ├── StorageError            storage: the database cannot be written or read (read-only,
    │   │   │                       an I/O error, damaged); also a RequestError (below), so
    │   │   │                       a request that meets it gets this code on the wire
    │   │   └── StorageFullError    storage_full: the disk holding the database is full
    │   └── SessionExistsError      a session id that is taken, on create; also an ExistsError
    ├── ContextTooLargeError        the built context cannot fit the model's window
    ├── NothingToCompactError       /compact found nothing (new) to summarise
    ├── ToolInputError              a tool got arguments it cannot use
    │   ├── SandboxUnavailableError a sandboxed run was asked for, but bwrap cannot run here
    │   └── RootChangedError        a folder a run holds (its cwd, its session folder) is no
    │                               longer the one that was checked: moved, swapped, deleted
    ├── TaskRejectedError           a background submit was refused (cap, rate limit)
    ├── RequestError                a WebSocket client's request failed; `code` goes on the wire
    │   ├── ProtocolError           bad_frame: not JSON, not an object, binary, a bad field
    │   │   ├── UnknownTypeError    unknown_type: a "type" the server does not know
    │   │   └── FrameTooLargeError  too_large: a frame over the size limit
    │   ├── RateLimitedError        rate_limited: too many frames per second
    │   ├── AuthError               unauthorized: no hello, or a bad token
    │   ├── ForbiddenError          forbidden: another user's session or task
    │   ├── NotFoundError           not_found: no such session or task
    │   ├── LimitError              limit: too many connections or sessions for a user
    │   ├── BusyError               busy: compact while a run is active
    │   ├── SessionBusyError        session_busy: another process runs it (its lease), or a
    │   │   │                       delete while a run is active or queued
    │   │   └── LeaseLostError      a write of an owner whose lease was taken over (fencing,
    │   │                           store/fence.py); also a StoreError
    │   ├── UnsupportedError        unsupported: a frame type kept for a later version
    │   ├── ExistsError             exists: a session that already exists is not created again
    │   │   └── SessionExistsError  (see StoreError above)
    │   ├── StorageError            (see StoreError above)
    │   ├── UnavailableError        internal: the daemon is shutting down
    │   └── InternalError           internal: any other failure, as a client is told of it
    │                               (`client_error`)
    ├── DaemonUnreachableError      a client of the daemon (`open_daemon`): nothing answers at the
    │   │                           URL, no answer in time, or the connection dropped
    │   ├── UntrustedDaemonError    what answers on this machine is another account's socket:
    │   │                           no token was sent to it
    │   └── PeerUnreachableError    (see PeerError below)
    ├── RemoteError                 a client of the daemon: the daemon answered with an error
    │   │                           frame (a refused hello or request); `code` is its wire code
    │   └── PeerRefusedError        (see PeerError below)
    ├── PeerError                   the peer tool: asking another navi daemon failed
    │   ├── PeerUnreachableError    nothing answers at the peer's URL, or the connection dropped;
    │   │                           also a DaemonUnreachableError
    │   └── PeerRefusedError        the peer answered with an error frame; also a RemoteError
    └── LLMError                    anything that went wrong talking to the model
        ├── LLMConnectionError    B could not connect / the connection dropped
        ├── LLMStatusError      (B) HTTP 4xx/5xx; quotes the body (B: 5xx, 408, 429)
        ├── LLMStreamError        B the server reported an error inside a 200 stream
        ├── LLMMalformedStreamError B a line/event we cannot parse
        ├── LLMEmptyResponseError   HTTP 200 with an empty body (prompt over the server's window?)
        ├── LLMAnswerTooLongError   the answer passed answer_max_chars: the stream was cut
        ├── LocalModelDiedError   B the embedded model's process died (a signal, an exit)
        │   └── LocalModelBrokenError   it died at start-up again and again: not restarted now
        └── LLMTimeoutError       B
            ├── LLMFirstChunkTimeout  nothing arrived within first_chunk_timeout
            └── LLMChunkTimeout       a gap between chunks exceeded chunk_timeout

B marks the backend-level LLM errors (`LLMError.backend_level`): the backend itself
failed — unreachable, dropped, silent past the timeouts, a server error, its process
dead, a stream it could not keep whole — so any agent's next call on it would likely
fail the same way. A sub-agent's backend-level error ends its parent's turn with it, as
the parent's own would (agent-loop.md); any other failure of a sub-agent (a request the
server refused, an answer too long, a prompt over the window, its iteration, time or
budget limit) is its spawn_agent call's failed result, and the turn goes on.

The client's errors (DaemonUnreachableError, RemoteError) are the daemon's refusals seen
from the other end of the wire: `RequestError` is what the daemon raises and puts in an
error frame; `RemoteError` is what a client raises when it reads one.

Classes are small and flat: each has one job, and the message says what went wrong
in words a user can act on.
"""

from __future__ import annotations


class NaviError(Exception):
    """Root of every error navi_trio raises on purpose."""


class ConfigError(NaviError):
    """A configuration file or environment variable is missing or malformed."""


class UsageError(NaviError):
    """Bad command-line arguments (argparse's own exit is replaced by this)."""


class StoreError(NaviError):
    """The session store failed."""


class NotQueuedError(StoreError):
    """A run went to take its queued message off the queue (`append(dequeue=key)`) and
    it was no longer there: another daemon took it first, or the queue's cap dropped it.
    Nothing of the append was stored; the message runs (or ran) once, elsewhere."""


class DuplicateMessageError(StoreError):
    """A message came with a client key (the ``message`` frame's ``key``) that another
    message of its session took first: nothing of it was stored, and it does not run.
    Its sender gets the first one's ``ok`` again, marked ``duplicate``."""


class ContextTooLargeError(NaviError):
    """The built context does not fit the model's window even after compression."""

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(
            f"the conversation needs ~{tokens} tokens but the model window allows {limit}"
        )
        self.tokens = tokens
        self.limit = limit


class NothingToCompactError(NaviError):
    """Forced compression found nothing that is not already a summary."""


class ToolInputError(NaviError):
    """A tool got arguments it cannot use; the message names the argument."""


class SandboxUnavailableError(ToolInputError):
    """A sandboxed run was asked for, but bwrap cannot run here: the call is refused."""


class RootChangedError(ToolInputError):
    """A folder a run holds (its cwd, its session folder) is no longer the folder that
    was checked: moved, replaced by a symlink, or deleted. The message names it."""


class BudgetExhaustedError(NaviError):
    """A run's budget is spent (core/turn/budgets.py): `scope` (turn, session, user_day,
    subagent), `kind` (tokens, wall_sec, tool_calls, subagents), what was `spent`, the
    `limit`; `held`, what calls under way have reserved of it. The run ends with
    ``budget_exhausted``, saved as a stop is."""

    code = "budget_exhausted"
    _UNITS = {
        "tokens": "tokens",
        "wall_sec": "seconds",
        "tool_calls": "tool calls",
        "subagents": "sub-agents",
    }
    _SCOPES = {"turn": "turn", "session": "session", "user_day": "daily", "subagent": "sub-agent"}

    def __init__(
        self, scope: str, kind: str, *, spent: float, limit: float, held: float = 0.0
    ) -> None:
        self.scope, self.kind, self.spent, self.limit = scope, kind, spent, limit
        self.held = held  # reserved by calls under way (other runs' included)
        unit = self._UNITS.get(kind, kind)
        shown = f"{spent:.1f}" if kind == "wall_sec" else f"{int(spent)}"
        budget = f"the {self._SCOPES.get(scope, scope)} budget of {limit:g} {unit}"
        if held > 0:
            super().__init__(
                f"{budget} has no room left ({shown} used, {int(held)} held by calls under way)"
            )
        else:
            super().__init__(f"{budget} is spent ({shown} used)")


class TaskRejectedError(NaviError):
    """A background submit was refused; the message is the reason."""


class RequestError(NaviError):
    """A client request the daemon refused; `code` is the stable wire code.

    `request_id` and `session_id` (when known) are echoed in the error frame."""

    code = "internal"

    def __init__(
        self, message: str, *, request_id: str | int | None = None, session_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.session_id = session_id


class ProtocolError(RequestError):
    """A frame the daemon cannot read: not JSON, not an object, binary, a bad field."""

    code = "bad_frame"


class UnknownTypeError(ProtocolError):
    code = "unknown_type"


class FrameTooLargeError(ProtocolError):
    code = "too_large"


class RateLimitedError(RequestError):
    code = "rate_limited"


class AuthError(RequestError):
    code = "unauthorized"


class ForbiddenError(RequestError):
    code = "forbidden"


class NotFoundError(RequestError):
    code = "not_found"


class LimitError(RequestError):
    code = "limit"


class BusyError(RequestError):
    code = "busy"


class SessionBusyError(RequestError):
    """The session is in use: another process holds its lease (the message names it), or
    a client asked to delete it while a run is active or queued, or a message sent with
    ``on_busy: reject`` met a running turn (`run_id` names it; the error frame too)."""

    code = "session_busy"
    run_id: str | None = None


class LeaseLostError(StoreError, SessionBusyError):
    """A write to a session by a daemon that no longer owns it: another daemon took its
    lease over (store/fence.py). Nothing of the write was stored."""


class UnsupportedError(RequestError):
    code = "unsupported"


class ExistsError(RequestError):
    """A session that already exists cannot be created again."""

    code = "exists"


class SessionExistsError(StoreError, ExistsError):
    """A session is created with an id that is taken. The message names the id only:
    never whose session it is, or anything of it."""


class StorageError(StoreError, RequestError):
    """The database cannot be written or read: read-only, an I/O error, or damaged.

    Raised by the store for the operation that failed (the message names it, and the
    session when there is one); nothing of that operation was stored, unless the
    connection to a database server was lost as its commit came back: then it may have
    landed (core/turn/session_state.py reads a session again after a failed write of it). A
    RequestError too, so a client's request that met it gets an error frame with this
    code."""

    code = "storage"


class StorageFullError(StorageError):
    """The disk holding the database is full (SQLite's SQLITE_FULL): nothing was stored;
    reads go on, and writes work again once space is freed."""

    code = "storage_full"


class UnavailableError(RequestError):
    """The daemon cannot take the request now (it is shutting down)."""

    code = "internal"


class InternalError(RequestError):
    """A failure that has no wire code of its own, as a client is told of it."""

    code = "internal"


def client_error(exc: Exception) -> RequestError:
    """What a client is told of a failed request or run: a RequestError as it is; any
    other failure is `internal`. A NaviError keeps its own words (they are written for
    people); anything else is our bug, named by its class ("internal error: KeyError:
    'x'") so a report says what broke. The caller logs it."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, NaviError):
        return InternalError(str(exc))
    return InternalError(f"internal error: {type(exc).__name__}: {exc}")


class ChangedError(RequestError):
    """What a rewind's preview showed changed before it was confirmed: preview again."""

    code = "changed"


class RestoreError(RequestError):
    """A rewind or a fork could not use a checkpoint (damaged, a folder unusable)."""

    code = "restore_failed"


class DaemonUnreachableError(NaviError):
    """No daemon answers at the URL, it did not answer in time, or the connection dropped.

    `reason` is the lower layer's word for it (empty when there is none), for a caller
    that words the message its own way (the peer tool)."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class UntrustedDaemonError(DaemonUnreachableError):
    """What answers at the URL on this machine is a socket of an account the client does
    not trust with its token (api/listener.py): nothing of the token was sent."""


class RemoteError(NaviError):
    """The daemon answered with an error frame: `code` is its wire code, `detail` its
    message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.detail = message


class PeerError(NaviError):
    """Asking a peer failed; the message says why (never with the token)."""


class PeerUnreachableError(PeerError, DaemonUnreachableError):
    """Nothing answers at the peer's URL, or the connection dropped."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        DaemonUnreachableError.__init__(self, message, reason=reason)


class PeerRefusedError(PeerError, RemoteError):
    """The peer answered with an error frame (``code``: its wire code)."""

    def __init__(self, code: str, message: str) -> None:
        RemoteError.__init__(self, code, message)


class LLMError(NaviError):
    """Anything that went wrong talking to the model."""

    # The stable error code a client sees in the error event; subclasses name their own.
    code = "llm_error"
    # The backend itself failed, not this one request or answer (the tree above).
    backend_level = False


class LLMConnectionError(LLMError):
    """Could not connect to the LLM endpoint, or the connection dropped mid-stream."""

    code = "llm_connection"
    backend_level = True


class LLMStatusError(LLMError):
    """The endpoint answered an HTTP error status. `body` is an excerpt of its body."""

    code = "llm_status"

    def __init__(self, status: int, body: str, url: str = "") -> None:
        excerpt = body.strip()[:500]
        where = f" from {url}" if url else ""
        super().__init__(f"LLM endpoint answered HTTP {status}{where}: {excerpt}")
        self.status = status
        self.body = excerpt
        # A server error, a timeout or an overload is the server's state; any other 4xx
        # refuses this request (a model the server lacks, a body it will not take).
        self.backend_level = status >= 500 or status in (408, 429)


class LLMStreamError(LLMError):
    """The server sent an error object inside an otherwise successful stream."""

    backend_level = True


class LLMMalformedStreamError(LLMError):
    """The stream carried a line or event that cannot be parsed."""

    backend_level = True


class LLMEmptyResponseError(LLMError):
    """The server answered 200 with no body at all.

    llama.cpp does this when the prompt does not fit its context window, so the message
    says so and names the setting to change, instead of blaming the connection.
    """

    code = "llm_empty_response"

    def __init__(self, url: str) -> None:
        super().__init__(
            f"the LLM at {url} answered with an empty body: the prompt is probably larger "
            "than the server's context window (llama.cpp answers like this). Set "
            "OLLAMA_NUM_CTX to the server's window or less (`navi doctor` shows it), or "
            "start the server with a larger context"
        )
        self.url = url


class LLMAnswerTooLongError(LLMError):
    """The answer (text + thinking) passed answer_max_chars; the stream was cut."""

    code = "answer_too_long"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the model's answer passed {limit} characters (NAVI_ANSWER_MAX_CHARS) without "
            "ending: the stream was cut and the partial answer kept"
        )
        self.limit = limit


class LocalModelDiedError(LLMError):
    """The embedded model's process (llm/host.py) died or could not load the model.

    The message names how (``SIGILL, illegal instruction``, ``exit status 1``); the
    daemon goes on and the next request starts the process again, after a backoff."""

    code = "local_model_died"
    backend_level = True


class LocalModelBrokenError(LocalModelDiedError):
    """The embedded model's process died at start-up too many times in a row: requests
    fail at once for a while instead of restarting it (the message says for how long)."""

    code = "local_model_broken"


class LLMTimeoutError(LLMError):
    """The stream took too long."""

    code = "llm_timeout"
    backend_level = True

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


class LLMFirstChunkTimeout(LLMTimeoutError):
    """Nothing arrived from the model within first_chunk_timeout (prefill stalled)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the model sent nothing within {seconds:g} s (first chunk)", seconds)


class LLMChunkTimeout(LLMTimeoutError):
    """The model went silent mid-stream for longer than chunk_timeout."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the model went silent for {seconds:g} s mid-stream", seconds)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside `exc`, however deeply grouped (`exc` itself when not a group)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]
