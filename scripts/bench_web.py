"""Benchmark: the browser client's size, its time to first render, and how fast a long
answer reaches the screen in the browser and in `navi chat`.

    python scripts/bench_web.py [--words 20000] [--runs 3]

Everything on 127.0.0.1: the fake LLM server and `navi serve` as subprocesses (a SQLite
file in a temp folder), Debian's headless Chromium driven by Playwright (the `test`
extra), `navi chat` in a pseudo-terminal (pexpect). Prints:

- bytes shipped: the sum of the static files the page loads (no build step, nothing
  fetched elsewhere);
- time to first render: navigation start to the first contentful paint, and a reload
  with the token in sessionStorage until the page says "connected";
- stream: one answer of N words (paragraphs of 100 words, Markdown) from Enter to the
  last word on screen, in words/s; for the browser also first word to last word in the
  DOM (a MutationObserver's clock). `navi chat`: Enter to the last word printed.

Bounded: a fixed number of runs, each wait with its own timeout, every process ended.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from navi_trio.api.web import bytes_shipped, load_files  # noqa: E402

CHROMIUM = os.environ.get("NAVI_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
WAIT = 120.0


def answer(words: int) -> str:
    paragraphs = []
    for start in range(0, words, 100):
        paragraphs.append(" ".join(f"w{i}" for i in range(start, min(words, start + 100))))
    return "\n\n".join(paragraphs)


def _line(proc: subprocess.Popen[str], pattern: str) -> re.Match[str]:
    deadline = time.monotonic() + WAIT
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        found = re.search(pattern, line)
        if found:
            return found
    raise SystemExit(f"no line matching {pattern!r}")


class Stack:
    """The fake LLM (one looping reply) and `navi serve`, in a temp folder."""

    def __init__(self, folder: Path, words: int) -> None:
        self.folder = folder
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("NAVI_", "OLLAMA_"))}
        self.env.update(NAVI_DB=str(folder / "navi.db"), NAVI_DATA_DIR=str(folder / "data"),
                        PYTHONPATH=str(REPO))  # fmt: skip
        script = folder / "replies.json"
        script.write_text(json.dumps([{"text": answer(words)}]))
        py = sys.executable
        self.llm = subprocess.Popen(
            [py, "-m", "navi_trio.testing.fake_llm", "--port", "0", "--script", str(script),
             "--loop"], env=self.env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        llm_url = _line(self.llm, r"listening on (\S+)").group(1)
        self.serve = subprocess.Popen(
            [py, "-m", "navi_trio", "serve", "--port", "0", "--llm-url", llm_url],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        port = _line(self.serve, r"listening on ws://127\.0\.0\.1:(\d+)/").group(1)
        self.url = f"http://127.0.0.1:{port}/"
        self.token = (folder / "data" / "local-token").read_text().strip()

    def close(self) -> None:
        for proc in (self.serve, self.llm):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


# Stamps the time of the first and of the last word reaching the transcript.
WATCH = """([first, last]) => new Promise((resolve, reject) => {
    const root = document.getElementById("transcript");
    const t0 = performance.now();
    let seen = null;
    const timer = setTimeout(() => reject(new Error("the answer did not arrive")), WAIT_MS);
    const check = () => {
        const text = root.textContent;
        if (seen === null && text.includes(first)) seen = performance.now();
        if (text.includes(last)) {
            const done = performance.now();
            observer.disconnect();
            clearTimeout(timer);
            resolve({sent: t0, first: seen ?? done, last: done});
        }
    };
    const observer = new MutationObserver(check);
    observer.observe(root, {childList: true, subtree: true, characterData: true});
    const input = document.getElementById("input");
    input.value = "hi";
    document.getElementById("composer").requestSubmit();
})""".replace("WAIT_MS", str(int(WAIT * 1000)))


# The page's renderer alone: one text_delta frame per word fed to a Transcript as fast as
# the page takes them (one per macrotask, as WebSocket messages come), drawn per frame.
RENDER_ONLY = """async (text) => {
    const { Transcript } = await import("/view.js");
    const root = document.createElement("div");
    root.style.height = "400px";
    document.body.append(root);
    const t = new Transcript(root, { answer: () => false, activity: () => {} });
    const parts = text.split(/(?<= )/);
    const start = performance.now();
    let i = 0;
    await new Promise((resolve) => {
        const channel = new MessageChannel();
        channel.port1.onmessage = () => {
            for (const end = Math.min(parts.length, i + 50); i < end; i++) {
                t.frame({ type: "text_delta", seq: i + 1, text: parts[i] });
            }
            if (i < parts.length) channel.port2.postMessage(0);
            else resolve();
        };
        channel.port2.postMessage(0);
    });
    t.frame({ type: "stream_end", seq: parts.length + 1, text: "" });
    const took = (performance.now() - start) / 1000;
    const shown = [...root.querySelectorAll("p")]
        .reduce((n, p) => n + p.textContent.split(" ").filter(Boolean).length, 0);
    root.remove();
    return { seconds: took, words: shown };
}"""


def browser_figures(stack: Stack, words: int, runs: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    out: dict[str, Any] = {k: [] for k in ("fcp_ms", "connected_ms", "send_to_last")}
    out["first_to_last"] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        for _ in range(runs):
            context = browser.new_context(viewport={"width": 1280, "height": 860})
            page = context.new_page()
            page.goto(stack.url)
            page.wait_for_selector("#login-token")
            fcp = page.evaluate(
                "performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? null"
            )
            out["fcp_ms"].append(fcp)
            page.fill("#login-token", stack.token)
            page.click("#login-submit")
            page.wait_for_selector("#conn-state.up")
            page.reload()  # the token is in sessionStorage now: load to connected
            page.wait_for_selector("#conn-state.up", timeout=WAIT * 1000)
            out["connected_ms"].append(page.evaluate("performance.now()"))
            page.click("#new-session")
            page.wait_for_selector(".placeholder")
            t = page.evaluate(WATCH, ["w0", f"w{words - 1}"])
            out["send_to_last"].append((t["last"] - t["sent"]) / 1000)
            out["first_to_last"].append((t["last"] - t["first"]) / 1000)
            page.wait_for_selector("#stop:disabled", timeout=WAIT * 1000)
            shown = page.locator(".lane.main .answer").last.inner_text().split()
            assert len(shown) == words, f"the page shows {len(shown)} words, not {words}"
            out.setdefault("render_only", []).append(page.evaluate(RENDER_ONLY, answer(words)))
            context.close()
        browser.close()
    return out


def chat_figures(stack: Stack, words: int, runs: int) -> list[float]:
    import pexpect

    times = []
    env = {**stack.env, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1"}
    for _ in range(runs):
        child = pexpect.spawn(
            sys.executable, ["-m", "navi_trio", "chat", "--url", stack.url.replace("http", "ws")],
            env=env, dimensions=(50, 160), encoding="utf-8", timeout=WAIT, cwd=str(stack.folder),
        )  # fmt: skip
        try:
            child.expect("connected to navi_trio")
            child.sendline("hi")
            start = time.monotonic()
            child.expect(f"w{words - 1}\\b")
            times.append(time.monotonic() - start)
            child.expect("context")
            child.sendline("/quit")
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
    return times


def raw_figures(stack: Stack, words: int, runs: int) -> list[float]:
    """A bare WebSocket client (no rendering): what the daemon delivers, the ceiling."""
    import trio
    from trio_websocket import open_websocket_url

    async def one() -> float:
        with trio.fail_after(WAIT):
            return await _stream()

    async def _stream() -> float:
        async with open_websocket_url(stack.url.replace("http", "ws")) as ws:
            await ws.send_message(json.dumps({"type": "hello", "token": stack.token}))
            await ws.get_message()
            start = time.monotonic()
            await ws.send_message(json.dumps({"type": "message", "content": "hi"}))
            while True:
                frame = json.loads(await ws.get_message())
                if frame["type"] == "stream_end" and not frame.get("is_subagent"):
                    return time.monotonic() - start

    return [trio.run(one) for _ in range(runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--words", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    files = load_files()
    print(f"bytes shipped: {bytes_shipped(files)} in {len(files) - 1} files "
          f"({', '.join(sorted(p[1:] for p in files if p != '/'))})")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp), args.words)
        try:
            web = browser_figures(stack, args.words, args.runs)
            chat = chat_figures(stack, args.words, args.runs)
            raw = raw_figures(stack, args.words, args.runs)
        finally:
            stack.close()

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    fcp = [x for x in web["fcp_ms"] if x is not None]
    print(f"time to first render: first contentful paint {med(fcp):.0f} ms (runs: "
          f"{', '.join(f'{x:.0f}' for x in fcp)}); reload to connected "
          f"{med(web['connected_ms']):.0f} ms")  # fmt: skip
    n = args.words
    rendered = web["render_only"]
    assert all(r["words"] == n for r in rendered), rendered
    for name, xs in (("browser, Enter to last word", web["send_to_last"]),
                     ("the page's renderer alone, frames fed in the page",
                      [r["seconds"] for r in rendered]),
                     ("browser, first word to last in the DOM", web["first_to_last"]),
                     ("navi chat, Enter to last word", chat),
                     ("a bare WebSocket client, send to stream_end", raw)):  # fmt: skip
        runs = ", ".join(f"{n / x:.0f}" for x in xs)
        print(f"{name}: {n / med(xs):.0f} words/s (median of {len(xs)}: {runs})")


if __name__ == "__main__":
    main()
