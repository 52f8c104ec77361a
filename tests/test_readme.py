"""The README stays a short entry point, and the links between it and the docs lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: Markdown links and images: [text](target) and ![alt](target); the target up to a space or ")"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def links(page: Path) -> list[str]:
    """The link targets of a Markdown page, outside its code blocks."""
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


def anchor(heading: str) -> str:
    """The anchor a heading gets on GitHub: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {anchor(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.MULTILINE)}


def test_the_readme_is_at_most_200_lines() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


@pytest.mark.parametrize("command", ["./platform up", "./platform test"])
def test_the_readme_gives_the_two_commands(command: str) -> None:
    assert command in README.read_text(encoding="utf-8")


def test_the_pages_have_links() -> None:
    assert any(target.startswith("docs/") for target in links(README))


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_points_to_an_existing_file(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target}: no heading #{fragment} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
