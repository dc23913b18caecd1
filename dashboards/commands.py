"""The ``hpo dashboard`` and ``hpo report`` commands (registered by ``hpo.cli``).

Dash and Plotly are imported inside the handlers: ``hpo run`` and the other
commands stay quick to start.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hpo.errors import UsageError

__all__ = ["add_commands"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register this package's subcommands through ``command(name, help=...)``."""
    dashboard = command("dashboard", help="live web dashboard of a study (read-only)")
    dashboard.add_argument("run_dir", help="the study's run directory, e.g. runs/<name>")
    dashboard.add_argument("--host", default="127.0.0.1",
                           help="address to listen on (default 127.0.0.1: this machine only)")
    dashboard.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    dashboard.add_argument("--refresh-s", type=float, default=5.0,
                           help="how often the page checks the store for news (default 5)")
    dashboard.set_defaults(handler=_dashboard)

    report = command("report", help="every dashboard view in one self-contained HTML file")
    report.add_argument("run_dir", help="the study's run directory, e.g. runs/<name>")
    report.add_argument("-o", "--output", default="report.html",
                        help="HTML file to write (default report.html)")
    report.set_defaults(handler=_report)


def _dashboard(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port}: not a port.\n  fix: pass a number from 1 to 65535")
    if args.refresh_s <= 0:
        raise UsageError(f"--refresh-s {args.refresh_s}: must be positive.\n  fix: e.g. --refresh-s 5")
    from hpo.dashboards.app import make_app, serve
    from hpo.dashboards.data import StoreReader

    started = time.perf_counter()
    reader = StoreReader(args.run_dir)  # errors about the run directory come before the server
    snap = reader.snapshot()
    print(f"hpo dashboard: {snap.name}, {len(snap.trials)} trials read from {args.run_dir} in "
          f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    if args.host not in _LOOPBACK:
        print(f"hpo dashboard: listening on {args.host}: anyone who can reach this port sees the "
              "study (there is no login); prefer an SSH tunnel to 127.0.0.1", file=sys.stderr)
    app = make_app(reader, refresh_s=args.refresh_s)
    print(f"hpo dashboard: open http://{_url_host(args.host)}:{args.port}/ (Ctrl-C to stop)",
          file=sys.stderr, flush=True)
    serve(app, args.host, args.port)
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _report(args: argparse.Namespace) -> int:
    from hpo.dashboards.report import write_report

    output = Path(args.output)
    if output.is_dir():
        raise UsageError(f"-o {output}: is a directory.\n  fix: name a file, e.g. -o {output / 'report.html'}")
    written = write_report(args.run_dir, output)
    print(f"hpo report: wrote {written} ({written.stat().st_size / 1e6:.1f} MB); open it in any "
          "browser, no network needed", file=sys.stderr)
    return 0
