"""The chat's slash commands: ``/help``, ``/new``, ``/compact``, ``/resume ID``,
``/rewind`` ... Each changes the chat's session state or sends the daemon a frame.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from navi_trio import wire
from navi_trio.command_text import CommandTooLongError, expand_command, usable
from navi_trio.wire import Frame

if TYPE_CHECKING:
    from navi_trio.client.app import ChatApp


HELP = """\
Type a message and press Enter; while a run is active your message is queued.
Ctrl+Enter (Alt+Enter where the terminal does not report Ctrl+Enter) steers the
running turn with it instead: the agent reads it before its next step.
  /steer TEXT     steer the running turn with TEXT (no run: it runs as a message)
  /interrupt TEXT stop the running turn and run TEXT next, ahead of the queue
  /schedule every 10m TEXT | cron "*/30 * * * *" TEXT | at 2030-01-31T09:00 TEXT
                  run TEXT on a schedule, in this session (none yet: a new one each time)
  /schedule pause ID | resume ID | remove ID       /schedules lists yours
  /compact        summarise the conversation to free context (Ctrl+X C too)
  /rewind [N]     list messages, or rewind chat and files to before message N (Esc Esc too;
                  /rewind N chat|files|both [force], /rewind undo); a preview comes first:
                  y applies; force also restores the conflicts (files you changed too)
  /fork [N] [files]  a new session from the history before N, with its files: move to it
  /tasks          list background tasks
  /usage          what this session spent: tokens, time, cost (no session yet: all yours)
  /context        the project's instruction files and skills your runs get, with sizes
  /approvals      list what you approved for a session or always; /approvals revoke ID
  /profile NAME   use profile NAME from your next message on (no NAME: show it)
  /sessions       list your sessions
  /resume ID      continue session ID (its history is replayed)
  /new            start a new session with the next message
  /mode NAME      ask for mode read-only, workspace or full in your messages (no NAME: show it)
  /thinking       show or hide the model's thinking in full
  /help           this list
  /quit           leave (Ctrl+D too); Ctrl+C stops a run, twice on an idle prompt quits
While an approval request waits, answer it with y (once), s (this session), a (always)
or n (deny); anything else you type is still a message."""

MODES = ("read-only", "workspace", "full")


# An answer typed while an approval request waits: (approve, scope).
ANSWERS = {
    "y": (True, "once"),
    "yes": (True, "once"),
    "s": (True, "session"),
    "session": (True, "session"),
    "a": (True, "always"),
    "always": (True, "always"),
    "n": (False, "once"),
    "no": (False, "once"),
}


class SlashCommands:
    def __init__(self, app: ChatApp) -> None:
        self.app = app
        self._by_name: dict[str, Callable[[str], Awaitable[None]]] = {
            "help": self.help,
            "quit": self.quit,
            "exit": self.quit,
            "new": self.new,
            "compact": self.compact,
            "tasks": self.tasks,
            "usage": self.usage,
            "approvals": self.approvals,
            "profile": self.profile,
            "sessions": self.sessions,
            "resume": self.resume,
            "thinking": self.thinking,
            "mode": self.mode,
            "rewind": self.app.rewinds.rewind,
            "fork": self.app.rewinds.fork,
            "steer": self.steer,
            "interrupt": self.interrupt,
            "schedule": self.schedule,
            "schedules": self.schedules,
            "context": self.context,
        }
        # Commands kept as files (navi_trio/project/commands.py), as the daemon listed
        # them for our folder: name -> its fields (description, body ...).
        self.files: dict[str, dict[str, str]] = {}
        self._told: set[str] = set()  # notices already shown

    async def run(self, name: str, arg: str) -> None:
        """``/name arg``; a command kept as a file is sent as its prompt with `arg` in
        it; an unknown name is one error line."""
        command = self._by_name.get(name.lower())
        if command is not None:
            await command(arg)
            return
        kept = self.files.get(name.lower())
        if kept is None:
            self.app.renderer.error(f"unknown command /{name}: type /help for the list")
            return
        try:
            text = expand_command(kept.get("body", ""), arg)
        except CommandTooLongError as exc:
            self.app.renderer.error(f"/{name}: {exc}")
            return
        await self.app.line(text, literal=True)

    def listed(self, frame: Frame) -> None:
        """The daemon's list of the commands kept as files: offered from now on, but for
        those named as one of ours (a notice says so, once)."""
        items = [c for c in frame.get("commands") or [] if isinstance(c, dict)]
        self.files, notices = usable(items, self._by_name)
        for notice in [*notices, *(str(n) for n in frame.get("notices") or [])]:
            if notice not in self._told:
                self._told.add(notice)
                self.app.renderer.notice(notice)

    async def help(self, arg: str) -> None:
        self.app.renderer.console.print(HELP, highlight=False, markup=False)
        if self.files:
            lines = ["Commands kept as files (.navi/commands, .claude/commands, yours):"]
            for name, c in sorted(self.files.items()):
                hint = f" {c['argument_hint']}" if c.get("argument_hint") else ""
                lines.append(f"  /{name}{hint}  {c.get('description', '')}")
            self.app.renderer.console.print("\n".join(lines), highlight=False, markup=False)

    async def quit(self, arg: str) -> None:
        self.app.quit()

    async def new(self, arg: str) -> None:
        if self.app.session_id:
            await self.app.send(wire.unsubscribe(self.app.session_id))
        self.app.set_session(None)
        self.app.renderer.status.profile = self.app.profile  # a new session starts with it
        self.app.renderer.notice("new session: it starts with your next message")

    async def compact(self, arg: str) -> None:
        if self.app.session_id is None:
            self.app.renderer.notice("nothing to compact yet: this session has no messages")
            return
        if await self.app.send(wire.compact(self.app.session_id)):
            self.app.renderer.notice("compacting…")

    async def approvals(self, arg: str) -> None:
        words = arg.split()
        if not words or words == ["list"]:
            await self.app.send(wire.grants())
        elif words[0] == "revoke" and len(words) == 2:
            await self.app.send(wire.grants("revoke", words[1]))
        else:
            self.app.renderer.error("usage: /approvals, or /approvals revoke ID")

    async def tasks(self, arg: str) -> None:
        await self.app.send(wire.tasks_list(self.app.session_id))

    async def usage(self, arg: str) -> None:
        await self.app.send(wire.usage("model", session_id=self.app.session_id))

    async def profile(self, arg: str) -> None:
        if not arg:
            if self.app.session_id is None:
                shown = self.app.profile or "the daemon's default"
            else:
                current = self.app.renderer.status.profile
                shown = current or "?"
                if self.app.profile and self.app.profile != current:
                    shown += f" ({self.app.profile} from your next message)"
            self.app.renderer.notice(f"profile: {shown} (/profile NAME changes it)")
            return
        known = self.app.profiles
        if known is not None and arg not in known:
            self.app.renderer.error(
                f"unknown profile {arg!r}: the daemon has {', '.join(known)} (the profile is "
                "unchanged)"
            )
            return
        # The daemon switches the session to a message's profile (a new one starts with
        # it); the status line shows the session's own until the daemon says it changed.
        self.app.profile = arg
        if self.app.session_id is None:
            self.app.renderer.status.profile = arg
        self.app.renderer.notice(f"profile {arg}: used from your next message")

    async def context(self, arg: str) -> None:
        await self.app.send(wire.context(self.app.run_cwd(), self.app.session_id))

    async def sessions(self, arg: str) -> None:
        await self.app.send(wire.sessions_list())

    async def resume(self, arg: str) -> None:
        if not arg:
            self.app.renderer.error("/resume needs a session id: /sessions lists them")
            return
        self.app.resuming = arg
        await self.app.send(wire.history(arg))

    async def steer(self, arg: str) -> None:
        await self._busy_message(arg, "steer")

    async def interrupt(self, arg: str) -> None:
        await self._busy_message(arg, "interrupt")

    async def _busy_message(self, arg: str, on_busy: str) -> None:
        if not arg:
            self.app.renderer.error(f"/{on_busy} needs the text of the message: /{on_busy} TEXT")
            return
        await self.app.line(arg, on_busy)

    async def schedules(self, arg: str) -> None:
        await self.app.send(wire.schedule("list"))

    async def schedule(self, arg: str) -> None:
        try:
            words = shlex.split(arg)
        except ValueError as exc:
            self.app.renderer.error(f"/schedule: {exc}")
            return
        if len(words) == 2 and words[0] in ("pause", "resume", "remove"):
            await self.app.send(wire.schedule(words[0], schedule_id=words[1]))
            return
        if len(words) < 3 or words[0] not in ("every", "cron", "at"):
            self.app.renderer.error(
                '/schedule every 10m TEXT, cron "*/30 * * * *" TEXT, at ISO TEXT, '
                "or pause / resume / remove ID"
            )
            return
        kind, when, text = words[0], words[1], " ".join(words[2:])
        where: dict[str, object] = (
            {"session_id": self.app.session_id}
            if self.app.session_id
            else {"new": True, "profile": self.app.profile}
        )
        await self.app.send(wire.schedule("add", message=text, **{kind: when}, **where))

    async def mode(self, arg: str) -> None:
        if not arg:
            shown = self.app.mode or "the daemon's default"
            self.app.renderer.notice(f"mode: {shown} (/mode {' | '.join(MODES)} changes it)")
            return
        if arg not in MODES:
            self.app.renderer.error(f"unknown mode {arg!r}: use one of {', '.join(MODES)}")
            return
        # The daemon clamps it to what our role allows (docs/pages/tools.md, "Safety").
        self.app.mode = arg
        self.app.renderer.notice(f"mode {arg}: asked for in your next messages")

    async def thinking(self, arg: str) -> None:
        self.app.renderer.show_thinking = not self.app.renderer.show_thinking
        shown = "shown in full" if self.app.renderer.show_thinking else "summarised"
        self.app.renderer.notice(f"thinking is {shown} from now on")
