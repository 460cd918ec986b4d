"""The README is a front page and the docs hold together: every example of the docs is
run by a test, the README's links and its test command are right, and every page of
docs/pages is in the site's navigation (``mkdocs build --strict`` in .ci/run checks the
links between pages)."""

from __future__ import annotations

import re

from doc_examples import PAGES, README, doc_pages, example_names, section

from navi_trio.settings import REPO_ROOT

TESTS = REPO_ROOT / "tests"
# Each example of the docs, and the test module that runs it.
RUN_BY = {
    "fake-server": "test_readme.py",
    "harness": "test_readme.py",
    "run-stream": "test_docs_harnesses.py",
    "run": "test_docs_harnesses.py",
    "stop": "test_docs_harnesses.py",
    "compact-stream": "test_docs_harnesses.py",
    "run-ephemeral": "test_docs_harnesses.py",
    "subagent-events": "test_docs_harnesses.py",
}
MARKDOWN_LINK = r"!?\[[^\]]*\]\(([^)\s]+)\)"


def slug(heading: str) -> str:
    """The anchor a heading gets (GitHub's and MkDocs' rule agree on our headings)."""
    words = re.sub(r"[^\w\s-]", "", heading.lower()).strip()
    return re.sub(r"[-\s]+", "-", words)


def anchors(page_text: str) -> set[str]:
    fence = False
    out = set()
    for line in page_text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6} (.*)", line)):
            out.add(slug(m.group(1)))
    return out


def test_every_example_of_the_docs_is_run_by_a_test() -> None:
    names = [name for page in doc_pages() for name in example_names(page)]
    assert sorted(names) == sorted(RUN_BY), "an example of the docs that no test runs"
    for name, module in RUN_BY.items():
        assert f'"{name}"' in (TESTS / module).read_text(encoding="utf-8"), (name, module)


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move text to docs/pages"


def test_the_readmes_test_command_is_the_one_ci_runs() -> None:
    body = section(README, "## Install")
    install = body.split("**Install and run the whole test suite**", 1)[1]
    line = re.search(r"```sh\n(.*?)\n```", install, re.S)
    assert line, "the README shows no command to install and test"
    readme_cmd = line.group(1).split(" && ")[-1]
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    ci_cmds = [c.strip() for c in ci if c.strip() and not c.lstrip().startswith("#")]
    assert ci_cmds[-1] == readme_cmd, f"README: {readme_cmd!r}, .ci/run: {ci_cmds[-1]!r}"


def test_the_readmes_links_reach_a_file_and_its_heading() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(MARKDOWN_LINK, text)
    local = [link for link in links if not re.match(r"https?://", link)]
    assert len(local) > 20, "the README's links into the docs were not found"
    broken = []
    for link in local:
        path, _, anchor = link.partition("#")
        target = REPO_ROOT / path if path else README
        if not target.is_file():
            broken.append(link)
        elif anchor and target.suffix == ".md":
            if anchor not in anchors(target.read_text(encoding="utf-8")):
                broken.append(link)
    assert broken == []


def test_getting_started_tells_try_it_as_the_readme_does() -> None:
    page = section(PAGES / "getting-started.md", "## Try it without a model")
    readme = section(README, "## Try it without a model")
    readme = re.sub(r"<!-- example: [^>]*-->\n", "", readme).replace("docs/pages/", "")
    assert page.strip() == readme.strip()


def test_every_page_is_in_the_sites_navigation() -> None:
    config = (REPO_ROOT / "docs" / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^docs_dir: pages$", config, re.M)
    listed = set(re.findall(r"^\s+- [^\n]*: ([\w-]+\.md)$", config, re.M))
    assert listed == {page.name for page in PAGES.glob("*.md")}
