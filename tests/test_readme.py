"""The README as GitHub shows it: every code fence closes where it should,
every `#` heading outside code is a heading, its Python blocks are Python,
and every relative link (and anchor) reaches a file of the repository.

It is rendered with the `markdown` package (MkDocs installs it); fences are
paired as CommonMark pairs them, which is how GitHub reads them.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from test_cli import ROOT

markdown = pytest.importorskip("markdown", reason="markdown is not installed: pip install -e '.[docs]'")

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.+?)\s*#*\s*$")


def fences(text: str) -> list[tuple[int, int | None, str, str]]:
    """(opening line, closing line or None, language, body) of each fenced
    block: a fence closes with the same character, at least as many, and no
    language after it (so a bare ``` after ```python closes it)."""
    blocks, opened, body = [], None, []
    for n, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if opened is None:
            if match:
                opened, body = (n, match[1], match[2].strip()), []
            continue
        start, marker, lang = opened
        if match and match[1][0] == marker[0] and len(match[1]) >= len(marker) and not match[2].strip():
            blocks.append((start, n, lang, "\n".join(body)))
            opened = None
        else:
            body.append(line)
    if opened is not None:
        blocks.append((opened[0], None, opened[2], "\n".join(body)))
    return blocks


def outside_code(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced blocks."""
    inside = {n for start, end, _, _ in fences(text)
              for n in range(start, (end or len(text.splitlines())) + 1)}
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if n not in inside]


def render(path: Path) -> str:
    return markdown.markdown(path.read_text(), extensions=["fenced_code", "tables", "toc"])


class _Collect(HTMLParser):
    """Headings (level, text), links and ids of a rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[tuple[int, str]] = []
        self.links: list[str] = []
        self.ids: set[str] = set()
        self._heading: list | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag in ("a", "img") and (attrs.get("href") or attrs.get("src")):
            self.links.append(attrs.get("href") or attrs["src"])
        if re.fullmatch(r"h[1-6]", tag):
            self._heading = [int(tag[1]), ""]

    def handle_data(self, data):
        if self._heading is not None:
            self._heading[1] += data

    def handle_endtag(self, tag):
        if self._heading is not None and tag == f"h{self._heading[0]}":
            self.headings.append((self._heading[0], self._heading[1].strip()))
            self._heading = None


def collect(path: Path) -> _Collect:
    parser = _Collect()
    parser.feed(render(path))
    return parser


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_fence_closes(page):
    unclosed = [start for start, end, _, _ in fences(page.read_text()) if end is None]
    assert not unclosed, f"{page.name}: the code fence opened on line {unclosed[0]} never closes"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_are_python(page):
    # A fence left open swallows prose, which is no Python; a fragment with
    # `...` still is. Interactive sessions are ```pycon.
    for start, _, lang, body in fences(page.read_text()):
        if lang == "python":
            try:
                compile(body, f"{page.name}, the block on line {start}", "exec")
            except SyntaxError as exc:
                pytest.fail(f"{page.name}: the ```python block on line {start} is not Python: {exc}")


def test_every_heading_outside_code_is_a_heading():
    text = README.read_text()
    written = [(len(m[1]), re.sub(r"[`*]", "", m[2])) for _, line in outside_code(text)
               if (m := HEADING.match(line))]
    assert [level for level, _ in written][:1] == [1] and len(written) > 5
    assert collect(README).headings == written


def test_every_relative_link_reaches_a_file_and_its_anchor():
    page = collect(README)
    checked = 0
    for link in page.links:
        parts = urlsplit(link)
        if parts.scheme or parts.netloc:
            continue
        target = (ROOT / unquote(parts.path)) if parts.path else README
        assert target.exists(), f"README.md links to {link}: {target} does not exist"
        if parts.fragment:
            assert target.suffix == ".md", f"README.md links to {link}: an anchor in a non-Markdown file"
            ids = page.ids if target == README else collect(target).ids
            assert parts.fragment in ids, f"README.md links to {link}: {target.name} has no such heading"
        checked += 1
    assert checked > 10


# ------------------------------------------------------------ tables

CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)")
DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def cells(row: str) -> int:
    """How many cells a table row has: its pipes that are not escaped and not
    in code (`a|b` is one cell's text)."""
    row = CODE_SPAN.sub("code", row.replace("\\|", "")).strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") else row
    return row.count("|") + 1


def tables(text: str) -> list[list[tuple[int, str]]]:
    """Each table outside code: its header, delimiter and body rows, numbered."""
    lines = outside_code(text)
    found = []
    for i in range(1, len(lines)):
        (n, line), (before, header) = lines[i], lines[i - 1]
        if DELIMITER.match(line) and "|" in line + header and before == n - 1:
            rows = [(before, header), (n, line)]
            for m, row in lines[i + 1:]:
                if m != rows[-1][0] + 1 or "|" not in row or not row.strip():
                    break
                rows.append((m, row))
            found.append(rows)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_row_has_as_many_cells_as_its_header(page):
    # Markdown drops a cell past the header's count and leaves a missing one
    # empty: a row of the wrong length loses what it says on the site.
    for rows in tables(page.read_text()):
        (start, header), *_ = rows
        wrong = [f"line {n}: {cells(row)} cells" for n, row in rows if cells(row) != cells(header)]
        assert not wrong, f"{page.name}: the table on line {start} has {cells(header)} columns; {wrong}"


def test_tables_are_found():
    counted = sum(len(tables(page.read_text())) for page in PAGES)
    assert counted > 10
    assert cells("| a `x|y` | b \\| c | d |") == 3
