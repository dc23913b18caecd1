"""The dashboard and the report in a real headless chromium (Playwright).

``hpo dashboard`` runs as a user starts it, in a subprocess on 127.0.0.1 and a
free port, over a study made by a real run; it is ended by its PID. Each
view's screenshot goes to ``test-artifacts/dashboard/``; with
``HPO_UPDATE_SCREENSHOT=1`` the leaderboard's also replaces the README's
``dashboards/screenshot.png``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

import hpo
from hpo.dashboards.views import VIEWS
from conftest import ROOT, toy_space
from test_dashboard import HPO, XSS, real_study

CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium", "/usr/bin/chromium") if os.path.exists(p)),
                None)
if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install chromium); the browser tests need it",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install playwright; never `playwright install`)")

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
TRIALS, MORE = 24, 30
WAIT_MS = 30_000


def browse_space(max_trials: int) -> dict:
    return toy_space("browse", space={"x": [0, 1, 2, 3, 4, 5], "y": [-1, 0, 1], "tag": ["plain", XSS]},
                     fixed={"steps": 6}, search={"algorithm": "random", "max_trials": max_trials,
                                                 "seed": 5})


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    hpo.run(browse_space(TRIALS), engine="inline", runs_dir=runs, progress=False)
    return runs / "browse"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(study, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("log") / "dashboard.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*HPO, "dashboard", str(study), "--port", str(port),
                                 "--refresh-s", "0.5"], cwd=ROOT, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"hpo dashboard exited with {proc.returncode}:\n{log.read_text()}")
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"hpo dashboard did not answer in 60 s:\n{log.read_text()}")
                time.sleep(0.2)
        yield url
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def browser():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.goto(server)
    page.wait_for_selector('td[data-dash-column="trial"]', timeout=WAIT_MS)
    yield page
    context.close()


def open_tab(page, label: str) -> None:
    page.locator(".tab", has_text=label).first.click()


def wait_for_plot(page, where: str) -> None:
    """Wait until the Plotly figure in ``where`` is drawn with at least one trace
    (an empty graph shows its axes before the figure arrives)."""
    page.wait_for_function(
        f"(() => {{ const g = document.querySelector('{where} .js-plotly-plot');"
        f" return g && g.querySelector('.main-svg') && g._fullData && g._fullData.length > 0; }})()",
        timeout=WAIT_MS)


def numbers(cells: list[str]) -> list[float]:
    return [float(c.replace("\u2212", "-")) for c in cells]  # d3-format writes a real minus


def column(page, column_id: str) -> list[str]:
    return page.locator(f'td[data-dash-column="{column_id}"]').all_inner_texts()


def test_every_view_renders_its_plot(page):
    page.screenshot(path=str(ARTIFACTS / "leaderboard.png"))
    if os.environ.get("HPO_UPDATE_SCREENSHOT") == "1":
        shutil.copy(ARTIFACTS / "leaderboard.png", ROOT / "dashboards" / "screenshot.png")
    for view in VIEWS:
        open_tab(page, view.label)
        wait_for_plot(page, f"#graph-{view.key}")  # a drawing, not a "nothing yet" message
        if view.key == "timeline":  # one bar per trial, on the worker that ran it
            bars = page.evaluate("document.querySelector('#graph-timeline .js-plotly-plot')"
                                 "._fullData.reduce((n, t) => n + t.y.length, 0)")
            assert bars == TRIALS
        page.wait_for_timeout(300)  # let WebGL traces paint before the screenshot
        page.screenshot(path=str(ARTIFACTS / f"{view.key}.png"))
    assert page.errors == []


def test_sorting_and_filtering_the_leaderboard(page):
    ranked = column(page, "trial")
    assert len(ranked) == TRIALS and ranked != sorted(ranked, key=int)  # best first
    sort = page.locator('th[data-dash-column="trial"] .column-header--sort')
    sort.click()
    ascending = [str(n) for n in sorted(map(int, ranked))]
    page.wait_for_function(f"document.querySelector('td[data-dash-column=\"trial\"]')"
                           f".innerText === '{ascending[0]}'", timeout=WAIT_MS)
    assert column(page, "trial") == ascending
    sort.click()
    page.wait_for_function(f"document.querySelector('td[data-dash-column=\"trial\"]')"
                           f".innerText === '{ascending[-1]}'", timeout=WAIT_MS)
    assert column(page, "trial") == ascending[::-1]
    values = numbers(column(page, "value"))
    keep = sum(v >= -1 for v in values)
    filter_box = page.locator('th.dash-filter[data-dash-column="value"] input[type="text"]')
    filter_box.fill(">= -1")
    filter_box.press("Enter")
    page.wait_for_function(f"document.querySelectorAll('td[data-dash-column=\"trial\"]').length "
                           f"=== {keep}", timeout=WAIT_MS)
    assert all(v >= -1 for v in numbers(column(page, "value")))


def test_injected_html_in_a_parameter_is_shown_as_text(page):
    tags = column(page, "param_0")  # "tag", first in the normalised space
    assert XSS in tags  # the characters, as typed
    open_tab(page, "Parallel coordinates")
    wait_for_plot(page, "#graph-parallel")
    ticks = page.evaluate("Array.from(document.querySelectorAll('#graph-parallel .tick text'))"
                          ".map(t => t.textContent)")
    assert any(t.startswith("<script>") for t in ticks)
    assert page.evaluate("window.__xss") is None  # neither the script nor onerror ran
    assert page.locator('img[src="x"]').count() == 0 and page.errors == []


def test_new_trials_appear_while_the_app_runs(page, study):
    assert f"{TRIALS} trials" in page.locator("#summary").inner_text()
    open_tab(page, "History")
    history = "document.querySelector('#graph-history .js-plotly-plot')"
    wait_for_plot(page, "#graph-history")
    assert page.evaluate(f"{history}._fullData[0].x.length") == TRIALS
    # A second batch of the same study, run while the app watches the store.
    hpo.run(browse_space(MORE), engine="inline", runs_dir=study.parent, progress=False)
    page.wait_for_function(f"{history}._fullData[0].x.length === {MORE}", timeout=WAIT_MS)
    assert f"{MORE} trials" in page.locator("#summary").inner_text()
    open_tab(page, "Leaderboard")
    page.wait_for_function(f"document.querySelectorAll('td[data-dash-column=\"trial\"]').length "
                           f"=== {MORE}", timeout=WAIT_MS)


def test_report_opens_offline_with_every_view(browser, study, tmp_path):
    report = tmp_path / "report.html"
    proc = subprocess.run([*HPO, "report", str(study), "-o", str(report)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 900})
    fetched: list[str] = []

    def only_the_file(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            fetched.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_file)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(report.as_uri())
    for view in VIEWS:
        wait_for_plot(page, f"#{view.key}")
    assert page.locator("table.leaderboard tbody tr").count() >= TRIALS
    assert XSS in page.locator("table.leaderboard").inner_text()
    assert page.evaluate("window.__xss") is None and errors == [] and fetched == []
    page.screenshot(path=str(ARTIFACTS / "report.png"))
    context.close()
