"""Retake the README's dashboard screenshots from a real study.

    python dashboards/screenshots/take.py [RUN_DIR]

Without RUN_DIR it first runs ``study.json`` (an MLP on scikit-learn's digits,
60 trials, median pruning; about 30 s on two cores) into a temporary runs
directory. It then serves the study with ``hpo dashboard`` on 127.0.0.1 and
a free port, opens every view in headless Chromium (Playwright, with the
system's ``/usr/lib/chromium/chromium``: never ``playwright install``) at
1200x700, and writes one PNG per view beside this file, plus the page of a
failed trial and of a pruned one. The server is ended by its PID.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import ViewportSize

HERE = Path(__file__).resolve().parent
SIZE: ViewportSize = {"width": 1200, "height": 700}
CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium", "/usr/bin/chromium") if os.path.exists(p)),
                "chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
# The installed script: `python -m hpo run` with Dask workers is refused (the
# workers would import __main__ again).
_SCRIPT = Path(sys.executable).parent / "hpo"
HPO = [str(_SCRIPT)] if _SCRIPT.exists() else ["hpo"]


def run_study(runs_dir: Path) -> Path:
    subprocess.run([*HPO, "run", str(HERE / "study.json"), "--runs-dir", str(runs_dir)], check=True)
    return runs_dir / "digits-mlp"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(run_dir: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([*HPO, "dashboard", str(run_dir), "--port", str(port)])
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"hpo dashboard did not start (exit {proc.poll()})") from None
            time.sleep(0.3)


def shoot(url: str, run_dir: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    from hpo.dashboards.data import load_snapshot
    from hpo.dashboards.views import VIEWS

    snap = load_snapshot(run_dir)
    pages = {"failed": next((t.number for t in snap.trials if t.state.value == "FAILED"), None),
             "pruned": next((t.number for t in snap.trials if t.state.value == "PRUNED"), None)}
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(viewport=SIZE)
        page.goto(url)
        page.wait_for_selector('td[data-dash-column="trial"]', timeout=30_000)
        written.append(_save(page, "leaderboard"))
        for view in VIEWS:
            page.locator(".tab", has_text=view.label).first.click()
            page.wait_for_selector(f"#graph-{view.key} .main-svg", timeout=30_000)
            page.wait_for_timeout(800)  # WebGL traces paint after the SVG
            written.append(_save(page, view.key, below="#tabs", above=f"#graph-{view.key}"))
        page.locator(".tab", has_text="Trial").first.click()
        for kind, number in pages.items():
            if number is None:
                continue
            page.locator("#trial-number").fill(str(number))
            page.locator("#trial-number").press("Enter")
            page.wait_for_function(f"(document.querySelector('#trial-title') || {{}}).innerText"
                                   f"?.startsWith('Trial {number} ')", timeout=30_000)
            page.wait_for_timeout(800)
            written.append(_save(page, f"trial-{kind}", below="#trial-picker"))
        browser.close()
    return written


def _save(page, name: str, below: str | None = None, above: str | None = None) -> Path:
    """The viewport, or the page from the top of ``below`` to the bottom of
    ``above`` (at most about 700 px high)."""
    path = HERE / f"{name}.png"
    if below is None:
        page.screenshot(path=str(path))
        return path
    top = page.locator(below).bounding_box()["y"] + page.evaluate("window.scrollY")
    bottom = top + SIZE["height"]
    if above is not None:
        box = page.locator(above).bounding_box()
        bottom = min(box["y"] + box["height"] + page.evaluate("window.scrollY") + 8, top + 760)
    page.screenshot(path=str(path), full_page=True,
                    clip={"x": 0, "y": top, "width": SIZE["width"], "height": bottom - top})
    return path


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(argv[0]) if argv else run_study(Path(tmp))
        port = free_port()
        server = serve(run_dir, port)
        try:
            for path in shoot(f"http://127.0.0.1:{port}/", run_dir):
                print(f"wrote {path} ({path.stat().st_size // 1000} kB)")
        finally:
            os.kill(server.pid, signal.SIGTERM)
            server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
