"""Make docs/pages/img/chat.png, the README's picture of `navi chat`.

`navi chat` runs in a tmux window of its own (a private tmux server) against the fake LLM
server, with a data folder in a temp folder and a daemon on a free loopback port; one
message is sent, the pane is captured with its colours, rendered by rich's SVG export
and photographed by Chromium. Needs tmux, /usr/bin/chromium and a font with ⏺ and ⎿
(Debian's fonts-symbola). Everything it starts is stopped before it returns.

    python scripts/docs_chat_screenshot.py [--out docs/pages/img/chat.png]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.text import Text

from navi_trio.settings import REPO_ROOT

WIDTH, HEIGHT = 100, 26  # the terminal, in characters
DEADLINE = 60.0  # seconds for the daemon to start and the answer to show
MESSAGE = "What is in this folder? Make a plan first."
ANSWER = (
    "The folder holds two files:\n\n- **main.py**, a one-line script that prints `hi`;\n"
    "- **notes.md**, your notes, with one item: *ship the docs*.\n\nShall I start on the docs?"
)
PLAN = {"action": "replace", "texts": ["list the folder", "read notes.md", "summarise"]}
REPLIES = [
    {"text": "DIRECT"},  # planning: a simple request
    {"tool_calls": [{"name": "todo", "arguments": PLAN}]},
    {
        "tool_calls": [
            {"name": "filesystem", "arguments": {"action": "list", "path": "."}},
            {"name": "filesystem", "arguments": {"action": "read", "path": "notes.md"}},
        ]
    },
    {"text": ANSWER},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pane(tmux: list[str], *flags: str) -> str:
    command = [*tmux, "capture-pane", "-p", *flags, "-t", "chat"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def capture(tmux: list[str], until: str) -> str:
    """The pane with its colours once its text shows `until` and the status bar at its
    foot has been drawn. tmux tells no one when a pane changes, so this looks every 0.2 s,
    at most DEADLINE seconds."""
    end = time.monotonic() + DEADLINE
    while True:
        plain = pane(tmux)
        if until in plain and " · model " in plain.rstrip().rsplit("\n", 1)[-1]:
            return pane(tmux, "-e")
        if time.monotonic() > end:
            raise SystemExit(f"no {until!r} in the chat after {DEADLINE:.0f} s:\n{plain}")
        time.sleep(0.2)


def render(pane: str, command: str, out: Path, work: Path) -> None:
    lines = pane.rstrip("\n").split("\n")
    while len(lines) > 2 and not lines[-2].strip():  # the blank rows above the status bar
        del lines[-2]
    with open(os.devnull, "w") as nowhere:
        console = Console(record=True, width=WIDTH + 2, force_terminal=True, file=nowhere)
        console.print(Text.from_ansi(f"$ {command}\n" + "\n".join(lines)), soft_wrap=True)
    svg = console.export_svg(title="navi chat")
    page = work / "chat.html"
    page.write_text(f"<html><body style='margin:0'>{svg}</body></html>")
    box = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg)
    assert box, "rich's SVG has no viewBox"
    size = f"--window-size={math.ceil(float(box[1]))},{math.ceil(float(box[2])) + 1}"
    shot = ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    shot += ["--force-device-scale-factor=1", size, f"--screenshot={out}", page.as_uri()]
    subprocess.run(shot, capture_output=True, check=True, timeout=DEADLINE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs/pages/img/chat.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="navi-chat-shot-") as tmp:
        work = Path(tmp)
        folder = work / "work"
        folder.mkdir()
        (folder / "notes.md").write_text("# Notes\n- ship the docs\n")
        (folder / "main.py").write_text('print("hi")\n')
        (work / "replies.json").write_text(json.dumps(REPLIES))
        fake_cmd = [sys.executable, "-m", "navi_trio.testing.fake_llm", "--port", "0"]
        fake_cmd += ["--script", str(work / "replies.json")]
        fake = subprocess.Popen(fake_cmd, stdout=subprocess.PIPE, text=True)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NAVI_", "OLLAMA_"))}
        env |= {"NAVI_DATA_DIR": str(work / "data"), "NAVI_LLM_BACKEND": "ollama"}
        tmux = ["tmux", "-L", f"navi-shot-{os.getpid()}"]
        try:
            assert fake.stdout is not None
            env["OLLAMA_HOST"] = fake.stdout.readline().strip().removeprefix("listening on ")
            command = f"navi chat --url ws://127.0.0.1:{port}"
            chat = [*tmux, "new-session", "-d", "-s", "chat", "-x", str(WIDTH), "-y", str(HEIGHT)]
            chat += ["-c", str(folder), f"{command}; sleep {DEADLINE:.0f}"]
            subprocess.run(chat, env=env, check=True)
            capture(tmux, "\n›")  # connected: the prompt is up
            subprocess.run([*tmux, "send-keys", "-t", "chat", MESSAGE, "Enter"], check=True)
            pane = capture(tmux, "Shall I start on the docs?\nsession")
            render(pane, command, args.out, work)
        finally:
            subprocess.run([*tmux, "kill-server"], capture_output=True)
            stop = [sys.executable, "-m", "navi_trio", "stop", "--port", str(port)]
            subprocess.run(stop, env=env, capture_output=True, timeout=DEADLINE)
            fake.terminate()
            fake.wait(timeout=DEADLINE)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
