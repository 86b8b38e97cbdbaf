"""README.md is a front page: short, its two commands on the first screen, and every link in it and in docs/ leads somewhere."""

import re
from pathlib import Path

import pytest

from bench.report import slug

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "serve" / "README.md", ROOT / "bench" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", re.S)


def test_the_front_page_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150
    assert max(len(line) for line in lines) <= 300


def test_the_two_commands_are_on_the_first_screen():
    first_screen = "\n".join(README.read_text().splitlines()[:60])
    assert "./scripts/main.sh" in first_screen and "./scripts/test.sh" in first_screen
    assert "./scripts/test.sh" in (ROOT / ".ci" / "run").read_text(), "CI runs the README's test command"


def anchors(page):
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", CODE.sub("", page.read_text()), re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in LINK.findall(CODE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to what is not there: {broken}"
