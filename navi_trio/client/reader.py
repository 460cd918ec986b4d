"""Line input for `navi chat`, read in a worker thread.

prompt_toolkit runs its own asyncio loop; it gets a worker thread of its own
(`trio.to_thread.run_sync`) so it never fights trio for the main thread. Output printed
meanwhile goes through `patch_stdout`, which draws it above the prompt. Without a
terminal (stdin is a pipe) a plain line reader does the same job.

`read` never raises for the keys a person presses: it returns an `InputEvent`
(a line, Ctrl-C as ``interrupt``, Ctrl-D or end of input as ``eof``, a double Esc on an
empty prompt as ``rewind``: the chat opens /rewind). `prefill` puts a text on the next
prompt (the message a rewind removed, to send again or edit).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Literal, Protocol, TextIO

import attrs

PROMPT = "› "
# What the prompt returns for a double Esc on an empty line (never a typed text: the
# identity is compared, a copy of the same characters is still a line).
REWIND_KEY = "\x1b\x1b"


@attrs.frozen
class InputEvent:
    kind: Literal["line", "interrupt", "eof", "rewind"]
    text: str = ""


class Reader(Protocol):
    def read(self) -> InputEvent:
        """Block until the person enters a line or presses Ctrl-C / Ctrl-D."""
        ...

    def abort(self) -> None:
        """Thread-safe: make a blocked `read` return ``eof`` (used when quitting)."""
        ...

    def wait_idle(self, timeout: float) -> None:
        """Block until no read is in progress (the terminal is restored), at most `timeout`."""
        ...

    def output(self) -> contextlib.AbstractContextManager[None]:
        """Where printing goes while this reader may be prompting."""
        ...


class PromptReader:
    """prompt_toolkit prompt with history and a bottom status line (`toolbar`)."""

    def __init__(self, toolbar: Callable[[], str]) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

        keys = KeyBindings()

        @keys.add("escape", "escape")
        def _double_escape(event: KeyPressEvent) -> None:
            # On an empty prompt: /rewind (as in Claude Code); else clear what is typed.
            if event.current_buffer.text:
                event.current_buffer.reset()
            else:
                event.app.exit(result=REWIND_KEY)

        self._session: PromptSession[str] = PromptSession(
            bottom_toolbar=lambda: " " + toolbar(), refresh_interval=0.5, key_bindings=keys
        )
        self._idle = threading.Event()
        self._idle.set()
        self._default = ""

    def prefill(self, text: str) -> None:
        """The next prompt starts with `text` (thread-safe enough: read at its start)."""
        self._default = text

    def read(self) -> InputEvent:
        self._idle.clear()
        default, self._default = self._default, ""
        try:
            text = self._session.prompt(
                PROMPT, handle_sigint=False, set_exception_handler=False, default=default
            )
        except KeyboardInterrupt:
            return InputEvent("interrupt")
        except EOFError:
            return InputEvent("eof")
        finally:
            self._idle.set()
        if text is REWIND_KEY:
            return InputEvent("rewind")
        return InputEvent("line", text)

    def abort(self) -> None:
        app = self._session.app
        loop = app.loop
        if app.is_running and loop is not None:
            loop.call_soon_threadsafe(lambda: app.exit(exception=EOFError()))

    def wait_idle(self, timeout: float) -> None:
        """Block until no prompt is drawn (the terminal is restored), at most `timeout`."""
        self._idle.wait(timeout)

    @contextlib.contextmanager
    def output(self) -> Iterator[None]:
        from prompt_toolkit.patch_stdout import patch_stdout

        with patch_stdout(raw=True):
            yield


class LineReader:
    """Plain lines from a stream (stdin that is not a terminal)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdin

    def read(self) -> InputEvent:
        line = self._stream.readline()
        if not line:
            return InputEvent("eof")
        return InputEvent("line", line.rstrip("\n"))

    def abort(self) -> None:
        pass  # a blocked readline cannot be woken; the read is abandoned instead

    def wait_idle(self, timeout: float) -> None:
        pass

    @contextlib.contextmanager
    def output(self) -> Iterator[None]:
        yield
