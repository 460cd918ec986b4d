"""Every exception navi_trio raises on purpose.

The tree::

    NaviError
    ├── ConfigError                 a config file or env var is missing or malformed
    ├── StoreError                  the SQLite store failed
    ├── ContextTooLargeError        the built context cannot fit the model's window
    ├── NothingToCompactError       /compact found nothing (new) to summarise
    ├── SessionBusyError            another process runs this session right now
    ├── ToolInputError              a tool got arguments it cannot use
    ├── TaskRejectedError           a background submit was refused (cap, rate limit)
    └── LLMError                    anything that went wrong talking to the model
        ├── LLMConnectionError      could not connect / the connection dropped
        ├── LLMStatusError          HTTP 4xx/5xx; quotes the body
        ├── LLMStreamError          the server reported an error inside a 200 stream
        ├── LLMMalformedStreamError a line/event we cannot parse
        └── LLMTimeoutError
            ├── LLMFirstChunkTimeout  nothing arrived within first_chunk_timeout
            └── LLMChunkTimeout       a gap between chunks exceeded chunk_timeout

Classes are small and flat: each has one job, and the message says what went wrong
in words a user can act on.
"""

from __future__ import annotations


class NaviError(Exception):
    """Root of every error navi_trio raises on purpose."""


class ConfigError(NaviError):
    """A configuration file or environment variable is missing or malformed."""


class StoreError(NaviError):
    """The session store failed."""


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


class SessionBusyError(NaviError):
    """Another live owner (process) holds the session's lease; the message names it."""


class ToolInputError(NaviError):
    """A tool got arguments it cannot use; the message names the argument."""


class TaskRejectedError(NaviError):
    """A background submit was refused; the message is the reason."""


class LLMError(NaviError):
    """Anything that went wrong talking to the model."""


class LLMConnectionError(LLMError):
    """Could not connect to the LLM endpoint, or the connection dropped mid-stream."""


class LLMStatusError(LLMError):
    """The endpoint answered an HTTP error status. `body` is an excerpt of its body."""

    def __init__(self, status: int, body: str, url: str = "") -> None:
        excerpt = body.strip()[:500]
        where = f" from {url}" if url else ""
        super().__init__(f"LLM endpoint answered HTTP {status}{where}: {excerpt}")
        self.status = status
        self.body = excerpt


class LLMStreamError(LLMError):
    """The server sent an error object inside an otherwise successful stream."""


class LLMMalformedStreamError(LLMError):
    """The stream carried a line or event that cannot be parsed."""


class LLMTimeoutError(LLMError):
    """The stream took too long."""

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
