"""Line input for `navi chat`, read in a worker thread.

prompt_toolkit runs its own asyncio loop; it gets a worker thread of its own
(`trio.to_thread.run_sync`) so it never fights trio for the main thread. Output printed
meanwhile goes through `patch_stdout`, which draws it above the prompt. Without a
terminal (stdin is a pipe) a plain line reader does the same job.

`read` never raises for the keys a person presses: it returns an `InputEvent`
(a line, Ctrl-C as ``interrupt``, Ctrl-D or end of input as ``eof``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Literal, Protocol, TextIO

import attrs

PROMPT = "› "


@attrs.frozen
class InputEvent:
    kind: Literal["line", "interrupt", "eof"]
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

        self._session: PromptSession[str] = PromptSession(
            bottom_toolbar=lambda: " " + toolbar(), refresh_interval=0.5
        )
        self._idle = threading.Event()
        self._idle.set()

    def read(self) -> InputEvent:
        self._idle.clear()
        try:
            text = self._session.prompt(PROMPT, handle_sigint=False, set_exception_handler=False)
        except KeyboardInterrupt:
            return InputEvent("interrupt")
        except EOFError:
            return InputEvent("eof")
        finally:
            self._idle.set()
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
