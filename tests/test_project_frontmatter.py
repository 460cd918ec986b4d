"""The one reader of front matter (skills, agents, commands), and a skill's checks.

Unit tests: no I/O. The formats are those Claude Code and Codex document (the fixture
repository's skills, tests/fixtures/project/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from navi_trio.project.frontmatter import FrontMatterError, front_matter
from navi_trio.project.skill_tool import SkillTool
from navi_trio.project.skills import check

FIXTURE = Path(__file__).parent / "fixtures" / "project"


def test_the_claude_code_and_codex_layouts_are_read() -> None:
    claude = (FIXTURE / ".claude" / "skills" / "pdf-forms" / "SKILL.md").read_text()
    meta, body = front_matter(claude) or ({}, "")
    assert meta["name"] == "pdf-forms"
    assert meta["allowed-tools"] == "Read, Bash(python:*)"
    assert body.lstrip().startswith("# Filling PDF forms")
    codex = (FIXTURE / ".agents" / "skills" / "release-notes" / "SKILL.md").read_text()
    meta, body = front_matter(codex) or ({}, "")
    assert meta["description"] == (
        "Write release notes from the commits since the last tag. "
        "Use when asked for a changelog or release notes.\n"  # `>` keeps one newline
    )
    assert meta["metadata"] == {"short-description": "Draft release notes"}  # unread
    assert "RELEASE-NOTES-BODY" in body


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("description: plain # a comment", "plain"),
        ('description: "quoted: with \\"escapes\\"" # c', 'quoted: with "escapes"'),
        ("description: 'it''s single'", "it's single"),
        ("description: goes\n  on over\n  lines", "goes on over lines"),
        ("description: |\n  kept\n  lines", "kept\nlines\n"),
        ("description: >-\n  folded\n  lines", "folded lines"),
    ],
)
def test_values_plain_quoted_and_in_blocks(text: str, value: str) -> None:
    parsed = front_matter(f"---\nname: x\n{text}\n---\nbody")
    assert parsed is not None and parsed[0]["description"] == value


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("---\nname: x\n", "no closing --- line"),
        ("---\njust words\n---\n", "must be name: value lines"),
        ("---\n- a list\n---\n", "must be name: value lines"),
        ("---\nname: a\nname: b\n---\n", "line 3: the key 'name' is given twice"),
        ("---\nname: !!python/name:os.system x\n---\n", "not valid YAML at line 2"),
        ('---\nname: x\ndescription: "open\n---\n', "not valid YAML at line 4"),
        ("---\n" + "a: " * 3000 + "\n---\n", "over 8192 bytes"),
    ],
)
def test_what_cannot_be_read_is_an_error_naming_the_line(text: str, problem: str) -> None:
    with pytest.raises(FrontMatterError, match=problem):
        front_matter(text)


def test_a_file_without_front_matter_is_none() -> None:
    assert front_matter("# A title\n---\nname: x\n---\n") is None


@pytest.mark.parametrize(
    ("folder", "text", "why"),
    [
        ("a", "# no front matter", "no front matter"),
        ("a", "---\nname: b\ndescription: d\n---\n", "the name 'b' does not match its folder 'a'"),
        ("A", "---\nname: A\ndescription: d\n---\n", "is not 1-64 lowercase letters"),
        ("a", "---\nname: a\n---\n", "has no 'description'"),
        ("a", f"---\nname: a\ndescription: {'d' * 1025}\n---\n", "1025 characters, over 1024"),
        ("a", "---\nname: a\ndescription: d\nx y\n---\n", "cannot be read: .* at line 5"),
        ("a", "---\nname: 7\ndescription: d\n---\n", "its 'name' is not text: 7"),
    ],
)
def test_a_bad_skill_is_refused_with_the_reason(folder: str, text: str, why: str) -> None:
    data = text.encode()
    with pytest.raises(ValueError, match=why):
        check(folder, data, len(data))


def test_a_good_skill_gives_its_name_description_and_body() -> None:
    data = b"---\nname: a-1\ndescription: Does\n  a thing.\n---\n\nThe body.\n"
    assert check("a-1", data, len(data)) == ("a-1", "Does a thing.", "The body.")


def test_the_skill_tool_points_to_its_manual() -> None:
    manual = SkillTool.description.rsplit("`manual:", 1)[1].split("`")[0]
    assert SkillTool.description.endswith("with the filesystem tool.")
    assert (FIXTURE.parents[2] / "manuals" / f"{manual}.md").is_file(), manual
