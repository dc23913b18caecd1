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

import ast
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


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``mkdocs build --strict`` once: its process and the site's folder."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed: pip install -e '.[docs]'")
    site = tmp_path_factory.mktemp("docs") / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(ROOT / "mkdocs.yml"), "-d", str(site)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    return proc, site


def test_the_site_builds_with_links_and_anchors_checked(built):
    proc, site = built
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert (site / "api" / "index.html").read_text().count('id="hpo.run"') == 1
    assert (site / "screenshots" / "leaderboard.png").is_file()


def _html_pages(site: Path) -> list[Path]:
    assert (site / "index.html").is_file(), "the site was not built"
    return sorted(site.rglob("*.html"))


def test_the_site_needs_nothing_from_the_internet(built):
    # A login node is often offline: a script or stylesheet from a CDN fails
    # there (no highlighting, a script error on every page).
    _, site = built
    outside = re.compile(r"^(https?:)?//")
    for page in _html_pages(site):
        html = page.read_text()
        loaded = re.findall(r"<script[^>]*\ssrc=\"([^\"]+)\"", html)
        loaded += [href for tag in re.findall(r"<link[^>]*>", html) if "stylesheet" in tag
                   for href in re.findall(r"\shref=\"([^\"]+)\"", tag)]
        assert not [url for url in loaded if outside.match(url)], page
    for css in site.rglob("*.css"):
        assert not re.search(r"(@import|url\()\s*['\"]?(https?:)?//", css.read_text()), css
    # Code is coloured when the site is built: Pygments' spans, its stylesheet.
    tutorial = (site / "tutorial" / "index.html").read_text()
    assert '<span class="k">def</span>' in tutorial and "css/pygments.css" in tutorial
    assert ".codehilite .k" in (site / "css" / "pygments.css").read_text()


def test_every_heading_id_works_in_the_table_of_contents(built):
    # The theme's table of contents finds a heading with querySelector("#id"),
    # which throws for an id starting with a digit ("1-the-objective"): the
    # page's contents then never highlight where the reader is.
    _, site = built
    for page in _html_pages(site):
        if page.name == "404.html":
            continue  # no table of contents
        bad = [i for i in re.findall(r'href="#([^"]+)"', page.read_text())
               if not re.match(r"-?[A-Za-z_]", i)]
        assert not bad, f"{page.relative_to(site)}: ids a CSS selector cannot name: {bad}"


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


def test_lightning_trainers_in_the_docs_print_nothing_of_their_own():
    # hpo records the curves: Lightning's logger, progress bar and model
    # summary would flood the terminal and leave lightning_logs/ behind.
    quiet = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    trainers = []
    for page in [ROOT / "README.md", *PAGES]:
        for _, lang, body in _blocks(page):
            if lang != "python" or "Trainer(" not in body:
                continue
            for node in ast.walk(ast.parse(body)):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Trainer":
                    given = {k.arg: k.value for k in node.keywords}
                    trainers.append(page.name)
                    assert {k: ast.literal_eval(given[k]) if k in given else None for k in quiet} == quiet, \
                        f"{page.name}: a Trainer that prints: add {quiet}"
                    assert ast.unparse(given.get("default_root_dir", ast.Constant(None))) == \
                        "trial.checkpoint_dir", f"{page.name}: a Trainer that writes in the current folder"
    assert trainers, "no Lightning Trainer found in the docs"
