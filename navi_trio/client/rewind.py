"""The chat's ``/rewind`` and ``/fork`` (and the double Esc that opens ``/rewind``).

    /rewind                      list the session's messages (numbered) and branches
    /rewind N [chat|files|both] [force]
                                 preview a rewind to just before message N (-1: the last)
    /rewind undo                 preview bringing back the newest branch (undo a rewind)
    /fork [N] [files]            a new session from the history before N; the chat moves to it

A preview asks "apply it? (y/n)": ``y`` or ``yes`` applies it, anything else leaves the
session as it was. A chat rewind puts the message it removed back on the prompt.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from navi_trio import wire
from navi_trio.client.rewind_text import (
    print_done,
    print_forked,
    print_overview,
    print_preview,
)
from navi_trio.wire import Frame

if TYPE_CHECKING:
    from navi_trio.client.app import ChatApp

RESTORES = ("chat", "files", "both")
YES = ("y", "yes")
NO = ("n", "no")
BRANCH_HINT = "/rewind undo brings the newest back"
UNDO_HINT = "/rewind undo brings it back"
FORCE_HINT = "add force (/rewind N files force) to restore them too"
FORCE = "force"


def _text(show: Callable[[TextIO], None]) -> str:
    out = io.StringIO()
    show(out)
    return out.getvalue().rstrip()


class RewindFlow:
    def __init__(self, app: ChatApp) -> None:
        self.app = app
        self.listed: Frame | None = None  # the latest `checkpoints` reply of our session
        self.after_list: tuple[str, str] | None = None  # (command, arg) waiting for it
        self.confirming: Frame | None = None  # the preview whose y/n is awaited
        self._asked: Frame | None = None  # the rewind frame of that preview
        self._removed_text = ""  # the message a confirmed chat rewind removes

    def reset(self) -> None:
        self.listed = self.after_list = self.confirming = self._asked = None

    @property
    def waiting(self) -> bool:
        return self.after_list is not None or self._asked is not None

    async def rewind(self, arg: str) -> None:
        await self._with_list("rewind", arg)

    async def fork(self, arg: str) -> None:
        await self._with_list("fork", arg)

    async def _with_list(self, command: str, arg: str) -> None:
        sid = self.app.session_id
        if sid is None:
            self.app.renderer.notice(f"nothing to {command} yet: this session has no messages")
            return
        words = arg.split()
        if command == "rewind" and (not words or words[0] == "list"):
            self.after_list = ("list", "")
        else:
            self.after_list = (command, arg)
        await self.app.send(wire.checkpoints(sid))  # numbers are resolved on a fresh list

    def _resolve(self, given: str) -> str | None:
        messages = list((self.listed or {}).get("messages") or [])
        ids = [str(m.get("message_id")) for m in messages]
        if given in ids:
            return given
        try:
            n = int(given)
        except ValueError:
            n = 0
        more = int((self.listed or {}).get("more_messages") or 0)
        index = n - 1 - more if n > 0 else n
        if n == 0 or not -len(ids) <= index < len(ids):
            self.app.renderer.error(f"no message {given!r} in the list: /rewind lists them")
            return None
        return ids[index]

    def _next(self) -> list[Frame]:
        """What the list was asked for: show it, or send the preview / the fork."""
        assert self.after_list is not None and self.app.session_id is not None
        command, arg = self.after_list
        self.after_list = None
        sid, listed = self.app.session_id, self.listed or {}
        words = arg.split()
        if command == "list":
            self._show(_text(lambda out: print_overview(listed, out, branch_hint=BRANCH_HINT)))
            self.app.renderer.notice("/rewind N previews a rewind to before message N")
            return []
        if command == "fork":
            files = "files" in words
            rest = [w for w in words if w != "files"]
            at = self._resolve(rest[0]) if rest else None
            if rest and at is None:
                return []
            return [wire.fork(sid, at=at, files=files)]
        restore = next((w for w in words[1:] if w in RESTORES), "both")
        conflicts = "restore" if FORCE in words[1:] else None
        if words[0] == "undo":
            branches = list(listed.get("branches") or [])
            if not branches:
                self.app.renderer.notice("no rewind to undo in this session")
                return []
            branch = str(branches[-1]["branch_id"])
            frame = wire.rewind(sid, branch=branch, restore=restore, conflicts=conflicts)
        else:
            to = self._resolve(words[0])
            if to is None:
                return []
            frame = wire.rewind(sid, to=to, restore=restore, conflicts=conflicts)
        self._asked = frame
        return [frame]

    def on_reply(self, frame: Frame) -> list[Frame]:
        """A ``checkpoints``, ``rewind`` or ``fork`` reply; the frames to send next."""
        if frame.get("session_id") != self.app.session_id:
            return []
        kind = frame.get("type")
        if kind == wire.CHECKPOINTS:
            self.listed = frame
            return self._next() if self.after_list is not None else []
        if kind == wire.FORK:
            return self._forked(frame)
        if frame.get("action") == "preview":
            self.confirming = frame
            self._show(_text(lambda out: print_preview(frame, out, force_hint=FORCE_HINT)))
            self.app.renderer.notice("apply it? (y/n)")
        elif frame.get("action") == "done":
            self._asked = None
            if frame.get("messages_removed") or frame.get("messages_restored"):
                self.app.history_rewritten()
            sid = str(self.app.session_id)
            self._show(_text(lambda out: print_done(frame, sid, out, undo_hint=UNDO_HINT)))
            if frame.get("messages_removed") and frame.get("to") and self._removed_text:
                self.app.prefill(self._removed_text)  # to send again, as it is or edited
            self._removed_text = ""
        return []

    def failed(self) -> None:
        """A request of ours was refused (the error is shown): nothing waits any more."""
        self.after_list = self.confirming = self._asked = None

    async def answer(self, line: str) -> bool:
        """A line typed while a preview waits; True when it was the answer."""
        preview, asked = self.confirming, self._asked
        self.confirming = None
        if preview is None or asked is None:
            return False
        word = line.strip().lower()
        if word in YES:
            self._removed_text = str(preview.get("text") or "")
            await self.app.send({**asked, "confirm": str(preview.get("token"))})
            return True
        self._asked = None
        self.app.renderer.notice("rewind not applied: nothing was changed")
        return word in NO

    def _forked(self, frame: Frame) -> list[Frame]:
        self._show(_text(lambda out: print_forked(frame, out)))
        new = str(frame.get("new_session_id"))
        folder = frame.get("folder")
        if isinstance(folder, str) and folder:
            self.app.set_cwd(folder)  # the fork's runs work in its copy
        # The chat moves to the fork, as /resume does: its history, then its frames.
        self.app.resuming = new
        return [wire.history(new)]

    def _show(self, text: str) -> None:
        self.app.renderer.console.print(text, markup=False, highlight=False)
