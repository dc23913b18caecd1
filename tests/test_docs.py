"""The documentation site (docs/, mkdocs.yml): it builds with every internal
link and anchor checked, its command-line page is what docs/gen_cli.py writes
from the parser now, and its runnable examples run.

Runnable examples are marked with an HTML comment on the line before the fence
(invisible in the built site); unmarked blocks are fragments and are not run:

    <!-- file: NAME -->  the block is written to NAME in the page's folder
    <!-- run -->         a ```python block runs there as a script; in a ```console
                         block, every line starting with "$ " runs there (bash)

A page's blocks share one temporary folder and run in page order, each command
must exit 0. A ```python block that has `if __name__ == "__main__":` is a whole
script, so it must be marked.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import ENV, ROOT

DOCS = ROOT / "docs"
BLOCK = re.compile(r"^(?:<!--\s*(run|file:\s*\S+)\s*-->\n)?```(\w*)\n(.*?)^```$", re.S | re.M)
BIN = str(Path(sys.executable).parent)
RUN_ENV = {**ENV, "PATH": BIN + os.pathsep + ENV.get("PATH", "")}
TIMEOUT = 300


def _blocks(page: Path) -> list[tuple[str | None, str, str]]:
    """(marker, language, body) of each fenced block of a page, in order."""
    return [(m.group(1), m.group(2), m.group(3)) for m in BLOCK.finditer(page.read_text())]


PAGES = sorted(DOCS.rglob("*.md"))
RUNNABLE = [p for p in PAGES if any(marker for marker, _, _ in _blocks(p))]


def test_the_site_builds_with_links_and_anchors_checked(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed: pip install -e '.[docs]'")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert (tmp_path / "site" / "api" / "index.html").read_text().count('id="hpo.run"') == 1
    assert (tmp_path / "site" / "screenshots" / "leaderboard.png").is_file()


def test_the_cli_page_is_what_the_generator_writes_now():
    spec = importlib.util.spec_from_file_location("gen_cli", DOCS / "gen_cli.py")
    gen_cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_cli)
    assert (DOCS / "cli.md").read_text() == gen_cli.render(), \
        "docs/cli.md is out of date: run python docs/gen_cli.py"


def test_the_readme_links_to_pages_that_exist():
    links = re.findall(r"\]\((docs/[^)#]+)", (ROOT / "README.md").read_text())
    assert links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing


def test_whole_scripts_are_marked_runnable():
    unmarked = [str(page.relative_to(ROOT)) for page in PAGES
                for marker, lang, body in _blocks(page)
                if lang == "python" and '__name__ == "__main__"' in body and marker != "run"]
    assert not unmarked, f"mark these with <!-- run --> before the fence: {unmarked}"
    assert RUNNABLE, "no runnable examples found: is the marker regex broken?"


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(DOCS)))
def test_runnable_examples_run(page, tmp_path):
    for n, (marker, lang, body) in enumerate(_blocks(page)):
        if marker is None:
            continue
        if marker.startswith("file:"):
            (tmp_path / marker.split(":", 1)[1].strip()).write_text(body)
            continue
        if lang == "python":
            script = tmp_path / f"block_{n}.py"
            script.write_text(body)
            commands = [[sys.executable, str(script)]]
        elif lang == "console":
            commands = [["bash", "-c", line[2:]] for line in body.splitlines() if line.startswith("$ ")]
            assert commands, f"{page.name}: a runnable console block without '$ ' lines"
        else:
            raise AssertionError(f"{page.name}: <!-- run --> on a ```{lang} block")
        for command in commands:
            proc = subprocess.run(command, cwd=tmp_path, env=RUN_ENV, capture_output=True,
                                  text=True, timeout=TIMEOUT)
            assert proc.returncode == 0, (f"{page.name} block {n}: {command[-1]} exited "
                                          f"{proc.returncode}\n{proc.stdout}\n{proc.stderr}")
            assert "Traceback" not in proc.stderr, proc.stderr
