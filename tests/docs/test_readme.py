"""The README stays a front door, and no page links to a file that is not in the repository.

A README that grows back into a manual, a link left behind when a page moves, or a pointer
to something only one machine has (a folder beside the clone) fail here, in the fast tier.
``mkdocs build --strict`` checks the site's links too, but only where the site is built,
and it never reads the README.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.site_page import PAGE as BENCHMARKS_PAGE

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Pages a mkdocs hook adds at build time: links to them are sound without a file on disk.
GENERATED_PAGES = frozenset({DOCS / BENCHMARKS_PAGE})
MAX_README_LINES = 170

_FENCED = re.compile(r"^(`{3,}).*?^\1\s*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]+`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
# Wording that points at files only the machine a page was written on has.
OUTSIDE_POINTERS = (
    re.compile(r"\.\./shared\b"),
    re.compile(r"shared folder", re.IGNORECASE),
    re.compile(r"beside this repository", re.IGNORECASE),
    re.compile(r"\bDESIGN\.md\b"),
)


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def prose(path: Path) -> str:
    """The page without its code: a link-like text inside a code block is not a link."""
    return _CODE_SPAN.sub("", _FENCED.sub("", path.read_text(encoding="utf-8")))


def relative_links(text: str) -> list[str]:
    """Targets of Markdown links and images that are files of this repository (no URL, no
    bare anchor), without their ``#anchor``."""
    targets = (match.group(1) for match in _LINK.finditer(text))
    return [
        target.split("#", 1)[0]
        for target in targets
        if not _EXTERNAL.match(target) and not target.startswith("#")
    ]


def test_the_readme_has_the_two_quick_start_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text


def test_the_readme_is_a_front_door_not_a_manual() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_the_readme_links_into_the_site() -> None:
    linked = {(README.parent / target).resolve() for target in relative_links(prose(README))}
    for page in ("architecture.md", "guides/researcher.md", "guides/ops.md", "guides/client.md"):
        assert DOCS / page in linked, f"README.md does not link docs/{page}"


@pytest.mark.parametrize("page", pages(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_is_a_file_in_the_repository(page: Path) -> None:
    broken = []
    for target in relative_links(prose(page)):
        resolved = (page.parent / target).resolve()
        if not resolved.is_relative_to(ROOT):
            broken.append(f"{target} (outside the repository)")
        elif not resolved.exists() and resolved not in GENERATED_PAGES:
            broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)} links to files that do not exist"


@pytest.mark.parametrize("page", pages(), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_page_points_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    found = [pattern.pattern for pattern in OUTSIDE_POINTERS if pattern.search(text)]
    assert found == [], f"{page.relative_to(ROOT)} points outside the repository: {found}"


def test_the_link_reader_sees_links_and_skips_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "See [the guide](guides/ops.md#start), ![a plot](img/plot.png) and\n"
        "[the web](https://example.org/x.md), [here](#top), `[not](a-link.md)`.\n"
        "\n"
        "```markdown\n"
        "[also not](in-a-block.md)\n"
        "```\n"
    )
    assert relative_links(prose(page)) == ["guides/ops.md", "img/plot.png"]
