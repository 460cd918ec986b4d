"""Line input for `navi chat`, read in a worker thread.

prompt_toolkit runs its own asyncio loop, so it gets a worker thread of its own and
never fights trio for the main thread; output printed meanwhile is drawn above the
prompt. Without a terminal a plain line reader does the same job.

`read` never raises for the keys a person presses: it returns an `InputEvent` (a line;
Ctrl-C: ``interrupt``; Ctrl-D: ``eof``; double Esc on an empty prompt: ``rewind``;
Ctrl+X C: ``compact``; a line ended with Ctrl+Enter or Alt+Enter: ``steer``).
`prefill` puts a text on the prompt (a message a rewind removed, or one refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol, TextIO

import attrs

PROMPT = "› "
# What the prompt returns for a double Esc on an empty line (never a typed text: the
# identity is compared, a copy of the same characters is still a line).
REWIND_KEY = "\x1b\x1b"


# What the prompt returns for Ctrl+X C (compact), followed by what was typed (kept).
COMPACT_KEY = "\x00compact\x00"


@attrs.frozen
class InputEvent:
    kind: Literal["line", "steer", "interrupt", "eof", "rewind", "compact"]
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


# What terminals send for Ctrl+Enter when they tell it from Enter: the "CSI u" form
# (kitty, foot, WezTerm, iTerm2) and xterm's modifyOtherKeys form (which prompt_toolkit
# reads as a plain Enter). Both are read as a key of their own that steers.
CTRL_ENTER = ("\x1b[13;5u", "\x1b[27;5;13~")
_STEER = "\x00steer\x00"  # marks a line ended by the steer keys (never typed)


def _steer_keys() -> Any:
    """Key bindings: Ctrl+Enter and Alt+Enter end the line as a steer."""
    from prompt_toolkit.input.ansi_escape_sequences import ANSI_SEQUENCES
    from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
    from prompt_toolkit.keys import Keys

    for sequence in CTRL_ENTER:
        ANSI_SEQUENCES[sequence] = Keys.F24
    bindings = KeyBindings()

    def steer(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        buffer.append_to_history()
        event.app.exit(result=_STEER + buffer.text)

    bindings.add(Keys.F24)(steer)
    bindings.add("escape", "enter")(steer)
    return bindings


def line_event(text: str) -> InputEvent:
    """The event of what the prompt returned: a line, a steer (Ctrl+Enter), or Ctrl+X C
    (compact; its text is what was typed, for the next prompt)."""
    if text.startswith(_STEER):
        return InputEvent("steer", text.removeprefix(_STEER))
    if text.startswith(COMPACT_KEY):
        return InputEvent("compact", text.removeprefix(COMPACT_KEY))
    return InputEvent("line", text)


class PromptReader:
    """prompt_toolkit prompt with history and a bottom status line (`toolbar`)."""

    def __init__(self, toolbar: Callable[[], str], *, terminal: Any = None) -> None:
        """`terminal`: (input, output) of prompt_toolkit instead of the real ones."""
        from prompt_toolkit import PromptSession
        from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent, merge_key_bindings

        keys = KeyBindings()

        @keys.add("escape", "escape")
        def _double_escape(event: KeyPressEvent) -> None:
            # On an empty prompt: /rewind (as in Claude Code); else clear what is typed.
            if event.current_buffer.text:
                event.current_buffer.reset()
            else:
                event.app.exit(result=REWIND_KEY)

        @keys.add("c-x", "c")
        def _compact(event: KeyPressEvent) -> None:
            # Ctrl+X C: /compact (as in the spec's TUI); what is typed stays for later.
            event.app.exit(result=COMPACT_KEY + event.current_buffer.text)

        given = {} if terminal is None else {"input": terminal[0], "output": terminal[1]}
        self._session: PromptSession[str] = PromptSession(
            bottom_toolbar=lambda: " " + toolbar(),
            refresh_interval=0.5,
            key_bindings=merge_key_bindings([keys, _steer_keys()]),
            **given,
        )
        self._idle = threading.Event()
        self._idle.set()
        # A text for the prompt (`prefill`): the one drawn now when nothing is typed on
        # it, else the next one. Shared with the trio thread, under the lock.
        self._lock = threading.Lock()
        self._pending = ""
        self._loop: asyncio.AbstractEventLoop | None = None  # the drawn prompt's loop

    def prefill(self, text: str) -> None:
        """Put `text` on the prompt: the one drawn now if nothing is typed on it (it
        arrives after the prompt was drawn: a rewind's answer, a refused message), else
        the next one. Thread-safe."""
        with self._lock:
            self._pending = text
            loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._fill)
            except RuntimeError:
                pass  # that prompt just ended: the next one takes the text

    def _fill(self) -> None:
        """In the prompt's loop: the pending text onto the prompt, if it is empty."""
        from prompt_toolkit.document import Document

        buffer = self._session.default_buffer
        with self._lock:
            if not self._pending or self._session.app.is_done or buffer.text:
                return  # nothing to put, or the person is typing: the next prompt has it
            text, self._pending = self._pending, ""
        buffer.set_document(Document(text), bypass_readonly=True)
        self._session.app.invalidate()

    def _started(self) -> None:
        """The prompt runs (in its loop): from now on a prefill goes onto it."""
        with self._lock:
            self._loop = asyncio.get_running_loop()
        self._fill()  # a text that came while the prompt was starting

    def read(self) -> InputEvent:
        self._idle.clear()
        with self._lock:
            default, self._pending = self._pending, ""
        try:
            text = self._session.prompt(
                PROMPT,
                handle_sigint=False,
                set_exception_handler=False,
                default=default,
                pre_run=self._started,
            )
        except KeyboardInterrupt:
            return InputEvent("interrupt")
        except EOFError:
            return InputEvent("eof")
        finally:
            with self._lock:
                self._loop = None
            self._idle.set()
        if text is REWIND_KEY:
            return InputEvent("rewind")
        return line_event(text)

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
