"""Reading the examples and sections of the docs (README.md, docs/pages/*.md) so a test
can run or check them.

A runnable example is the fenced block right after an ``<!-- example: NAME ... -->``
marker, on whichever page holds it (`doc_example`); what it prints, when the page shows
it, is the ``text`` block after the words "It prints:". `clean_env` is the environment
to run one in: no navi setting of the machine's leaks in.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from subprocess import CompletedProcess

import attrs
import trio

from navi_trio.settings import REPO_ROOT, Settings

MARKER = r"<!-- example: ([\w-]+)\b[^>]*-->\n```(\w+)\n(.*?)```"
OUTPUT = r"\s*It prints:\n\n```text\n(.*?)```"
README = REPO_ROOT / "README.md"
PAGES = REPO_ROOT / "docs" / "pages"


def doc_pages() -> list[Path]:
    """The README and every page of the docs site (docs/pages, the mkdocs docs_dir)."""
    return [README, *sorted(PAGES.glob("*.md"))]


def page_of(name: str) -> Path:
    """The one page of the docs that holds example `name`."""
    pages = [page for page in doc_pages() if name in example_names(page)]
    assert len(pages) == 1, f"example {name} is on {len(pages)} pages of the docs: {pages}"
    return pages[0]


def doc_example(name: str, lang: str) -> str:
    """The `lang` block of example `name`, on whichever page of the docs holds it."""
    return example_block(page_of(name), name, lang)


def section(page: Path, heading: str) -> str:
    """The text under the Markdown heading `heading` (``## Title``, ``### Title``), up
    to the next heading of its level or above outside a code fence; not the heading."""
    level = len(heading) - len(heading.lstrip("#"))
    assert level and heading[level] == " ", f"not a Markdown heading: {heading!r}"
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    body: list[str] | None = None
    fence = False
    for line in lines:
        if line.startswith("```"):
            fence = not fence
        depth = len(line) - len(line.lstrip("#"))
        is_heading = not fence and 0 < depth <= level and line[depth : depth + 1] == " "
        if body is not None and is_heading:
            break
        if body is not None:
            body.append(line)
        elif line.rstrip("\n") == heading:
            body = []
    assert body is not None, f"{page.name} has no heading {heading!r}"
    return "".join(body)


def example_names(page: Path) -> list[str]:
    """The names of the page's examples, in page order."""
    return [m.group(1) for m in re.finditer(MARKER, page.read_text(encoding="utf-8"), re.S)]


def example_block(page: Path, name: str, lang: str) -> str:
    """The fenced `lang` block right after the ``<!-- example: NAME ... -->`` marker."""
    for m in re.finditer(MARKER, page.read_text(encoding="utf-8"), re.S):
        if m.group(1) == name:
            assert m.group(2) == lang, f"{page.name}: example {name} is {m.group(2)}, not {lang}"
            return m.group(3)
    raise AssertionError(f"{page.name} has no {lang} block marked 'example: {name}'")


def example_output(page: Path, name: str) -> str:
    """The ``text`` block that follows example `name` after "It prints:"."""
    text = page.read_text(encoding="utf-8")
    for m in re.finditer(MARKER, text, re.S):
        if m.group(1) == name:
            shown = re.match(OUTPUT, text[m.end() :], re.S)
            assert shown, f"{page.name}: example {name} is not followed by 'It prints:'"
            return shown.group(1)
    raise AssertionError(f"{page.name} has no example {name}")


def clean_env(tmp_path: Path) -> dict[str, str]:
    """os.environ without navi's settings; the data under `tmp_path`."""
    names = {f.metadata["env"] for f in attrs.fields(Settings)} | {"NAVI_DEBUG"}
    env = {k: v for k, v in os.environ.items() if k not in names}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    return env


async def run_python(tmp_path: Path, *args: str, deadline: float) -> CompletedProcess[bytes]:
    """``python ARGS`` in `tmp_path` with `clean_env`, its output captured; at most
    `deadline` seconds."""
    with trio.fail_after(deadline):
        return await trio.run_process(
            [sys.executable, *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=clean_env(tmp_path),
            cwd=tmp_path,
        )
