"""The dashboard and the report in a real headless chromium (Playwright).

``hpo dashboard`` runs as a user starts it, in a subprocess on 127.0.0.1 and a
free port, over a study made by a real run; it is ended by its PID. Each
view's screenshot goes to ``test-artifacts/dashboard/`` (the README's
screenshots are taken from a real study by ``dashboards/screenshots/take.py``).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

import hpo
from hpo.dashboards import leaderboard
from hpo.dashboards import views as views_module
from hpo.dashboards.synthetic import write_study
from hpo.dashboards.views import VIEWS
from conftest import ROOT
from hpo.dashboards.data import load_snapshot
from test_dashboard import HPO, XSS, rich_space

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
    """The training-like study of test_dashboard: a log learning rate, a numeric
    categorical batch size, a categorical with HTML in it; pruned, failed (with
    tracebacks) and diverged trials; two metrics per step."""
    return rich_space("browse", max_trials)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    hpo.run(browse_space(TRIALS), engine="inline", runs_dir=runs, progress=False)
    return runs / "browse"


def column_of(page, name: str) -> str:
    """The column id of the header named ``name`` (parameters are param_<i>)."""
    return page.evaluate(f"Array.from(document.querySelectorAll('th.dash-header'))"
                         f".find(th => th.innerText.trim() === {name!r}).dataset.dashColumn")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(study: Path | list[Path], log_dir: Path):
    """``hpo dashboard`` on ``study`` (or several) as a user starts it; yields
    its URL and ends it by its PID."""
    port = free_port()
    log = log_dir / "dashboard.log"
    paths = [str(p) for p in (study if isinstance(study, list) else [study])]
    with open(log, "w") as out:
        proc = subprocess.Popen([*HPO, "dashboard", *paths, "--port", str(port),
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
def server(study, tmp_path_factory):
    with serving(study, tmp_path_factory.mktemp("log")) as url:
        yield url


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
    values = numbers([c for c in column(page, "value") if c])
    keep = sum(v >= 0.5 for v in values)
    filter_box = page.locator('th.dash-filter[data-dash-column="value"] input[type="text"]')
    filter_box.fill(">= 0.5")
    filter_box.press("Enter")
    page.wait_for_function(f"document.querySelectorAll('td[data-dash-column=\"trial\"]').length "
                           f"=== {keep}", timeout=WAIT_MS)
    assert 0 < keep < TRIALS and all(v >= 0.5 for v in numbers(column(page, "value")))


def test_injected_html_in_a_parameter_is_shown_as_text(page):
    tags = column(page, column_of(page, "opt"))
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
    drawn = f"{history}._fullData.reduce((n, t) => n + (t.name === 'best so far' ? 0 : t.x.length), 0)"
    assert page.evaluate(drawn) == TRIALS  # every trial: completed, pruned and failed
    # A second batch of the same study, run while the app watches the store.
    hpo.run(browse_space(MORE), engine="inline", runs_dir=study.parent, progress=False)
    page.wait_for_function(f"{drawn} === {MORE}", timeout=WAIT_MS)
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


# ------------------------------------------------------------------ issue 16

def test_clicking_a_failed_trial_opens_its_page_with_the_traceback_and_log(page, study):
    snap = load_snapshot(study)
    failed = next(t for t in snap.trials if t.state is hpo.TrialStatus.FAILED)
    page.locator('th.dash-filter[data-dash-column="state"] input[type="text"]').fill("FAILED")
    page.locator('th.dash-filter[data-dash-column="state"] input[type="text"]').press("Enter")
    page.wait_for_function("Array.from(document.querySelectorAll('td[data-dash-column=\"state\"]'))"
                           ".every(td => td.innerText === 'FAILED')", timeout=WAIT_MS)
    assert column(page, "rank") == [""] * len(column(page, "rank"))  # no rank without a value
    page.locator(f'td[data-dash-column="trial"]', has_text=str(failed.number)).first.click()
    page.wait_for_selector("#trial-title", timeout=WAIT_MS)
    assert f"Trial {failed.number}" in page.locator("#trial-title").inner_text()
    traceback = page.locator("pre.traceback").first.inner_text()
    assert "Traceback (most recent call last)" in traceback and "FloatingPointError" in traceback
    assert "step 0: loss" in page.locator("pre.trial-log").first.inner_text()
    assert str(RunDirOf(study, failed.number)) in page.locator("#trial-checkpoint").inner_text()
    page.screenshot(path=str(ARTIFACTS / "trial-failed.png"))
    # A pruned trial, typed in: its curves and the reason it was pruned.
    pruned = next(t for t in snap.trials if t.state is hpo.TrialStatus.PRUNED)
    reason = next(e["reason"] for e in pruned.events if e["kind"] == "pruned")
    box = page.locator("#trial-number")
    box.fill(str(pruned.number))
    box.press("Enter")
    page.wait_for_function(f"document.querySelector('#trial-title') && document.querySelector("
                           f"'#trial-title').innerText.startsWith('Trial {pruned.number} ')",
                           timeout=WAIT_MS)
    assert reason in page.locator("#trial-events").inner_text()
    wait_for_plot(page, "#trial-curves")
    assert page.evaluate("document.querySelector('#trial-curves .js-plotly-plot')._fullData.length") == 2
    box.fill("999")
    box.press("Enter")
    page.wait_for_selector("#trial-missing", timeout=WAIT_MS)
    assert page.errors == []


def test_a_live_refresh_keeps_the_open_trial_readable(browser, tmp_path):
    """While a study runs, every change re-draws the open trial page. A refresh
    that answers slowly (a loaded server, made so here by holding its answer
    back) shows a spinner over the page; the page stays readable beneath it."""
    runs = tmp_path / "runs"
    hpo.run(browse_space(4), engine="inline", runs_dir=runs, progress=False)
    with serving(runs / "browse", tmp_path) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(url)
        page.wait_for_selector('td[data-dash-column="trial"]', timeout=WAIT_MS)
        open_tab(page, "Trial")
        page.locator("#trial-number").fill("1")
        page.locator("#trial-number").press("Enter")
        page.wait_for_function("document.querySelector('#trial-title') && document.querySelector("
                               "'#trial-title').innerText.startsWith('Trial 1 ')", timeout=WAIT_MS)
        # Sampled in the page itself: the Python side sleeps in the route below.
        page.evaluate("window.__blank = 0; window.__spun = 0; setInterval(() => {"
                      " const title = document.querySelector('#trial-title');"
                      " if (!title || !title.innerText.trim()) window.__blank++;"
                      " if (document.querySelector('.dash-spinner')) window.__spun++; }, 20)")

        def slow_refresh(route):
            body = json.loads(route.request.post_data or "{}")
            if "view.children" in body.get("output", "") and "version.data" in body.get("changedPropIds", []):
                time.sleep(1.5)
            route.continue_()

        page.route("**/_dash-update-component?*", slow_refresh)
        hpo.run(browse_space(6), engine="inline", runs_dir=runs, progress=False)  # the study changes
        page.wait_for_function("window.__spun > 0", timeout=WAIT_MS)  # the refresh was slow
        page.wait_for_function("!document.querySelector('.dash-spinner')", timeout=WAIT_MS)
        assert page.evaluate("window.__blank") == 0
        page.close()


def RunDirOf(study: Path, number: int) -> Path:
    from hpo.store import RunDir
    return RunDir(study).checkpoint_dir(number)


def test_parallel_coordinates_show_log_ticks_and_batch_sizes_as_categories(page):
    open_tab(page, "Parallel coordinates")
    wait_for_plot(page, "#graph-parallel")
    ticks = page.evaluate("Array.from(document.querySelectorAll('#graph-parallel .y-axis'))"
                          ".map(a => Array.from(a.querySelectorAll('.tick text')).map(t => t.textContent))")
    labels = page.evaluate("Array.from(document.querySelectorAll('#graph-parallel .axis-title'))"
                           ".map(t => t.textContent)")
    axes = dict(zip(labels, ticks))
    assert axes["batch"] == ["16", "32", "64", "128"]
    assert set(axes["lr"]) & {"0.001", "0.01", "0.1"} and not any("−" in t for t in axes["lr"])
    # Dragging along the accuracy axis keeps only the trials in that range.
    fig = "document.querySelector('#graph-parallel .js-plotly-plot')"
    page.evaluate(f"Plotly.restyle({fig}, {{'dimensions[3].constraintrange': [[0.5, 1]]}}, [0])")
    page.wait_for_timeout(300)
    assert page.evaluate(f"{fig}._fullData[0].dimensions[3].constraintrange") == [0.5, 1]
    assert page.errors == []


def test_an_invalid_filter_says_why_and_keeps_the_rows(page):
    box = page.locator('th.dash-filter[data-dash-column="value"] input[type="text"]')
    box.fill("abc >")
    box.press("Enter")
    page.wait_for_function("document.querySelector('#filter-message').innerText.length > 0",
                           timeout=WAIT_MS)
    assert "accuracy: 'abc >' is not a number" in page.locator("#filter-message").inner_text()
    every = int(page.locator("#summary").inner_text().split(" trials")[0].split()[-1])
    assert len(column(page, "trial")) == every >= TRIALS  # unfiltered, not emptied


def test_sort_arrows_sit_after_their_own_column_name(page):
    for col in ("value", "state"):
        name = page.locator(f'th.dash-header[data-dash-column="{col}"] .column-header-name').bounding_box()
        arrow = page.locator(f'th.dash-header[data-dash-column="{col}"] .column-header--sort').bounding_box()
        cell = page.locator(f'th.dash-header[data-dash-column="{col}"]').bounding_box()
        assert name["x"] < arrow["x"] < cell["x"] + cell["width"]


def test_learning_curves_switch_to_another_metric(page):
    open_tab(page, "Learning curves")
    wait_for_plot(page, "#graph-curves")
    page.locator("#graph-curves .updatemenu-header-group").click()
    page.locator("#graph-curves .updatemenu-item-text", has_text="loss").first.click()
    fig = "document.querySelector('#graph-curves .js-plotly-plot')"
    page.wait_for_function(f"{fig}.layout.yaxis.title.text === 'loss'", timeout=WAIT_MS)
    top = page.evaluate(f"{fig}._fullLayout.yaxis.range[1]")
    assert top < 10  # the diverged trials (up to 2e6) do not set the scale
    assert page.errors == []


# ------------------------------------------------------------------ issue 28, part 3

def pick(page, dropdown: str, option: str) -> None:
    """Choose ``option`` in the dcc.Dropdown with id ``dropdown``."""
    page.locator(f"#{dropdown}").click()
    page.get_by_role("option", name=option, exact=True).click()


def figure_js(key: str) -> str:
    return f"document.querySelector('#graph-{key} .js-plotly-plot')"


def rows_shown(page, count: int) -> None:
    page.wait_for_function("document.querySelectorAll('td[data-dash-column=\"trial\"]').length "
                           f"=== {count}", timeout=WAIT_MS)


def test_tabs_sit_in_labelled_rows_that_neither_wrap_nor_cut_a_label(browser, server, study):
    """At 1,280 px every tab is in its group's row, on one line, its label whole."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(server)
    page.wait_for_selector('td[data-dash-column="trial"]', timeout=WAIT_MS)
    expected = views_module.tab_rows(load_snapshot(study))
    labels = "Array.from(document.querySelectorAll('.tab')).map(t => t.innerText.trim()).join('|')"
    # The frame's tabs come from the settings; wait for those of the study as read.
    page.wait_for_function(f"{labels} === {'|'.join(l for _, tabs in expected for _, l in tabs)!r}",
                           timeout=WAIT_MS)
    rows = page.evaluate("""Array.from(document.querySelectorAll('.tab-container')).map(c => {
        const row = c.closest('.tab-row');
        return {group: row ? row.querySelector('.tab-group').textContent : null,
                tabs: Array.from(c.querySelectorAll('.tab')).map(t => {
                    const text = document.createRange();
                    text.selectNodeContents(t);
                    const box = t.getBoundingClientRect();
                    return {label: t.innerText.trim(), top: Math.round(box.top), right: box.right,
                            lines: new Set(Array.from(text.getClientRects()).map(r => Math.round(r.top))).size,
                            cut: t.scrollWidth > t.clientWidth}; })}; })""")
    assert [(r["group"], [t["label"] for t in r["tabs"]]) for r in rows] == \
        [(group, [label for _, label in tabs]) for group, tabs in expected]
    for row in rows:
        assert len({t["top"] for t in row["tabs"]}) == 1, row  # one line of tabs
        assert all(t["lines"] == 1 and not t["cut"] and t["right"] <= 1280 for t in row["tabs"]), row
    page.screenshot(path=str(ARTIFACTS / "tabs-1280.png"))
    context.close()


def test_rank_and_edf_views_draw_every_completed_trial(page, study):
    done = len([t for t in load_snapshot(study).trials if t.state is hpo.TrialStatus.COMPLETE])
    open_tab(page, "EDF")
    wait_for_plot(page, "#graph-edf")
    line = f"{figure_js('edf')}._fullData[0]"
    page.wait_for_function(f"{line}.y.length === {done}", timeout=WAIT_MS)
    assert page.evaluate(f"{line}.y[{line}.y.length - 1]") == 1
    open_tab(page, "Rank")
    wait_for_plot(page, "#graph-rank")
    dots = f"{figure_js('rank')}._fullData[0]"
    page.wait_for_function(f"{dots}.x.length === {done}", timeout=WAIT_MS)
    colours = page.evaluate(f"Array.from({dots}.marker.color)")
    assert min(colours) == 0 and max(colours) == 1 and page.errors == []


def test_the_axis_pickers_choose_the_contour_and_rank_pair(page, study):
    first, second, third = load_snapshot(study).param_names[:3]
    open_tab(page, "Contour")
    wait_for_plot(page, "#graph-contour")
    layout = f"{figure_js('contour')}.layout"
    page.wait_for_function(f"{layout}.xaxis.title.text === {first!r} && "
                           f"{layout}.yaxis.title.text === {second!r}", timeout=WAIT_MS)
    pick(page, "axis-y", third)
    page.wait_for_function(f"{layout}.yaxis.title.text === {third!r}", timeout=WAIT_MS)
    pick(page, "axis-x", second)
    page.wait_for_function(f"{layout}.xaxis.title.text === {second!r}", timeout=WAIT_MS)
    open_tab(page, "Rank")  # the pickers offer the same parameters there
    wait_for_plot(page, "#graph-rank")
    pick(page, "axis-x", third)
    page.wait_for_function(f"{figure_js('rank')}.layout.xaxis.title.text === {third!r}",
                           timeout=WAIT_MS)
    assert page.errors == []


def test_brushing_the_parallel_coordinates_filters_the_leaderboard_and_the_history(page, study):
    open_tab(page, "Parallel coordinates")
    wait_for_plot(page, "#graph-parallel")
    page.wait_for_selector("#graph-parallel .axis-brush", timeout=WAIT_MS)
    x, y, w, h = page.evaluate("(() => { const b = Array.from(document.querySelectorAll("
                               "'#graph-parallel .axis-brush .background')).pop().getBoundingClientRect();"
                               " return [b.x, b.y, b.width, b.height]; })()")
    # A real drag along the metric's axis (the last): its upper half, the better trials.
    page.mouse.move(x + w / 2, y + h * 0.02)
    page.mouse.down()
    page.mouse.move(x + w / 2, y + h * 0.5, steps=10)
    page.mouse.up()
    metric = f"{figure_js('parallel')}._fullData[0].dimensions.slice(-1)[0]"
    page.wait_for_function(f"{metric}.constraintrange !== undefined", timeout=WAIT_MS)
    low, high = page.evaluate(f"{metric}.constraintrange")
    snap = load_snapshot(study)
    inside = {t.number for t in snap.trials if t.value is not None and low <= t.value <= high
              and t.state in (hpo.TrialStatus.COMPLETE, hpo.TrialStatus.PRUNED, hpo.TrialStatus.STOPPED)}
    assert 0 < len(inside) < len(snap.trials)
    open_tab(page, "Leaderboard")
    rows_shown(page, len(inside))
    assert {int(n) for n in column(page, "trial")} == inside
    assert f"the {len(inside)} trials selected" in page.locator("#brush-note").inner_text()
    open_tab(page, "History")
    wait_for_plot(page, "#graph-history")
    drawn = (f"{figure_js('history')}._fullData.filter(t => t.name !== 'best so far')"
             ".reduce((n, t) => n + t.x.length, 0)")
    page.wait_for_function(f"{drawn} === {len(inside)}", timeout=WAIT_MS)
    open_tab(page, "Leaderboard")
    page.locator("#brush-clear").click()
    rows_shown(page, len(snap.trials))
    assert page.errors == []


def test_the_state_filter_counts_each_state_and_hides_the_unticked(page, study):
    snap = load_snapshot(study)
    counts = dict(leaderboard.state_counts(snap))
    labels = "Array.from(document.querySelectorAll('#states label')).map(l => l.innerText.trim())"
    page.wait_for_function(f"{labels}.length === {len(counts)}", timeout=WAIT_MS)
    assert page.evaluate(labels) == [f"{state} {n}" for state, n in counts.items()]
    assert counts["FAILED"] and counts["PRUNED"] and counts["COMPLETE"]
    page.locator('#states input[value="FAILED"]').uncheck()
    rows_shown(page, len(snap.trials) - counts["FAILED"])
    assert "FAILED" not in column(page, "state")
    page.locator('#states input[value="PRUNED"]').uncheck()
    rows_shown(page, len(snap.trials) - counts["FAILED"] - counts["PRUNED"])
    page.locator('#states input[value="FAILED"]').check()
    rows_shown(page, len(snap.trials) - counts["PRUNED"])
    assert page.errors == []


def test_csv_downloads_are_the_export_and_the_rows_shown(page, study, tmp_path):
    exported = tmp_path / "export.csv"
    proc = subprocess.run([*HPO, "export", str(study), "-o", str(exported)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with page.expect_download(timeout=WAIT_MS) as download:
        page.locator("#csv-all").click()
    assert Path(download.value.path()).read_bytes() == exported.read_bytes()
    failed = [t.number for t in load_snapshot(study).trials if t.state is hpo.TrialStatus.FAILED]
    box = page.locator('th.dash-filter[data-dash-column="state"] input[type="text"]')
    box.fill("FAILED")
    box.press("Enter")
    rows_shown(page, len(failed))
    with page.expect_download(timeout=WAIT_MS) as download:
        page.locator("#csv-shown").click()
    with open(download.value.path(), newline="") as f:
        shown = list(csv.DictReader(f))
    assert sorted(int(r["trial"]) for r in shown) == sorted(failed)
    assert all(r["state"] == "FAILED" for r in shown) and "accuracy" in shown[0]


def test_one_dashboard_serves_a_runs_directory_with_a_picker_and_a_comparison(browser, tmp_path):
    runs = tmp_path / "runs"
    alpha = write_study(runs / "alpha", 40, workers=3, seed=1, name="alpha")
    beta = write_study(runs / "beta", 30, workers=3, seed=2, name="beta")
    with serving(runs, tmp_path) as url:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(url)
        rows_shown(page, 40)
        assert page.locator("#summary").inner_text().startswith("study alpha")
        pick(page, "study", "beta")
        page.wait_for_function("document.querySelector('#summary').innerText.startsWith('study beta')",
                               timeout=WAIT_MS)
        rows_shown(page, 30)
        open_tab(page, "Compare studies")
        wait_for_plot(page, "#graph-compare")
        lines = page.evaluate(f"{figure_js('compare')}._fullData.filter(t => t.xaxis === 'x')"
                              ".map(t => [t.name, t.y[t.y.length - 1]])")
        assert lines == [["alpha", load_snapshot(alpha).result.best.value],
                         ["beta", load_snapshot(beta).result.best.value]]
        assert errors == []
        page.close()


def console_errors(page) -> list[str]:
    """Collects what the page logs as an error in its console, and what it throws."""
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors


def settled(page) -> None:
    """Wait until every console message the page sent so far has arrived: they
    come in order, so a message logged now arrives after them."""
    with page.expect_console_message(lambda message: message.text == "settled", timeout=WAIT_MS):
        page.evaluate("console.log('settled')")


def test_hovering_the_parallel_coordinates_logs_no_console_error(page):
    """Plotly's hover event over a parcoords line has no "points", which Dash's
    graph reads: a TypeError at each line crossed."""
    errors = console_errors(page)
    open_tab(page, "Parallel coordinates")
    wait_for_plot(page, "#graph-parallel")
    page.wait_for_selector("#graph-parallel .axis-brush", timeout=WAIT_MS)
    axes = page.evaluate("Array.from(document.querySelectorAll('#graph-parallel .axis-brush .background'))"
                         ".map(b => { const r = b.getBoundingClientRect(); return [r.x + r.width / 2, r.y, r.height]; })")
    (first, top, height), (second, _, _) = axes[:2]
    # Down the middle between the first two axes, a pixel at a time: every line is crossed.
    page.mouse.move((first + second) / 2, top)
    page.mouse.move((first + second) / 2, top + height, steps=int(height))
    page.mouse.move((first + second) / 2, top + height / 2, steps=int(height / 2))
    settled(page)
    assert errors == []


def test_the_csv_of_every_trial_says_it_is_being_written(page):
    """At 100,000 trials it takes seconds: meanwhile the button says so and is disabled."""
    from hpo.dashboards.app import CSV_ALL, CSV_ALL_BUSY

    held = []

    def hold_the_csv(route):
        if '"download.data"' in (route.request.post_data or ""):
            held.append(route)  # answered when the test says so
        else:
            route.continue_()

    page.route(lambda url: "/_dash-update-component" in url, hold_the_csv)
    assert page.locator("#csv-all").inner_text() == CSV_ALL
    page.locator("#csv-all").click()
    page.wait_for_function(f"(b => b.disabled && b.innerText === {CSV_ALL_BUSY!r})"
                           "(document.querySelector('#csv-all'))", timeout=WAIT_MS)
    for _ in range(WAIT_MS // 50):  # the request is held as it leaves
        if held:
            break
        page.wait_for_timeout(50)
    assert len(held) == 1
    with page.expect_download(timeout=WAIT_MS) as download:
        held[0].continue_()
    page.wait_for_function(f"(b => !b.disabled && b.innerText === {CSV_ALL!r})"
                           "(document.querySelector('#csv-all'))", timeout=WAIT_MS)
    assert Path(download.value.path()).read_text().startswith("number,state,value")
    assert page.errors == []
