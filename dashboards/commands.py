"""The ``hpo dashboard`` and ``hpo report`` commands (registered by ``hpo.cli``).

Dash and Plotly are imported inside the handlers: ``hpo run`` and the other
commands stay quick to start.
"""

from __future__ import annotations

import argparse
import errno
import gc
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpo.errors import UsageError

__all__ = ["add_commands"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_PORT = 8050
_PORTS_TRIED = 20
_VIEWS_LATER_S = 15.0


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register this package's subcommands through ``command(name, help=...)``."""
    dashboard = command("dashboard", help="live web dashboard of a study (read-only)")
    dashboard.add_argument("run_dir", nargs="+",
                           help="the study's run directory, e.g. runs/<name>; several, or a "
                                "directory of them (runs/), to switch between and compare them")
    dashboard.add_argument("--host", default="127.0.0.1",
                           help="address to listen on (default 127.0.0.1: this machine only)")
    dashboard.add_argument("--port", type=int, default=None,
                           help=f"port (default {DEFAULT_PORT}, or the next free one when it is taken)")
    dashboard.add_argument("--refresh-s", type=float, default=5.0,
                           help="how often the page checks the store for news (default 5)")
    dashboard.set_defaults(handler=_dashboard)

    report = command("report", help="every dashboard view in one self-contained HTML file")
    report.add_argument("run_dir", help="the study's run directory, e.g. runs/<name>")
    report.add_argument("-o", "--output", default=None,
                        help="HTML file to write (default RUN_DIR/report.html)")
    report.add_argument("--force", action="store_true", help="overwrite an existing output file")
    report.set_defaults(handler=_report)


def _dashboard(args: argparse.Namespace) -> int:
    if args.port is not None and not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port}: not a port.\n  fix: pass a number from 1 to 65535")
    if args.refresh_s <= 0:
        raise UsageError(f"--refresh-s {args.refresh_s}: must be positive.\n  fix: e.g. --refresh-s 5")
    from hpo.dashboards.app import make_app, warm_up_later
    from hpo.dashboards.data import StoreReader
    from hpo.dashboards.studies import run_dirs
    from hpo.store import gc_paused

    started = time.perf_counter()
    # Errors about the run directories come before the server. The stores are
    # read while the server already serves the page, so a browser loads Dash's
    # and Plotly's scripts meanwhile (a second for a big study); the views
    # snapshot is written once the first page is served.
    readers = [StoreReader(path, views_later_s=_VIEWS_LATER_S, read_now=False)
               for path in run_dirs(args.run_dir)]
    if args.host not in _LOOPBACK:
        print(f"hpo dashboard: listening on {args.host}: anyone who can reach this port sees the "
              "study (there is no login); prefer an SSH tunnel to 127.0.0.1", file=sys.stderr)
    port = _port(args.host, args.port)
    app = make_app(readers, refresh_s=args.refresh_s)
    failed: list[BaseException] = []
    server = threading.Thread(target=_serving, args=(app, args.host, port, failed),
                              name="hpo-dashboard", daemon=True)
    server.start()
    print(f"hpo dashboard: open http://{_url_host(args.host)}:{port}/ (Ctrl-C to stop)",
          file=sys.stderr, flush=True)
    # The store read (millions of objects for 100,000 trials) lives as long as
    # the server: frozen before the cyclic collector is back, which would scan
    # them all at once (half a second), and again in the middle of drawing a view.
    with gc_paused():
        # The first study first: it is the one the page shows. A damaged store:
        # the error, exit 2, the server goes with us.
        read = [(reader, reader.snapshot(), time.perf_counter() - started) for reader in readers]
        gc.freeze()
    for reader, snap, seconds in read:
        print(f"hpo dashboard: {snap.name}, {len(snap.trials)} trials read from {reader.run_dir.path} "
              f"in {seconds:.1f} s", file=sys.stderr)
    warm_up_later()
    server.join()
    if failed:
        raise failed[0]
    return 0


def _serving(app: Any, host: str, port: int, failed: list[BaseException]) -> None:
    """Serve in this thread; an error ends the command from the main thread."""
    from hpo.dashboards.app import serve

    try:
        serve(app, host, port)
    except BaseException as exc:  # handed to the main thread
        failed.append(exc)


def _port(host: str, asked: int | None) -> int:
    """The port to serve on, checked free before its URL is printed: the one
    asked for, else the first free one from DEFAULT_PORT on."""
    if asked is not None:
        if not _free(host, asked):
            raise UsageError(f"--port {asked}: already in use on {host} (another dashboard or "
                             "server listens there).\n  fix: pass another --port, or leave --port out "
                             "to take a free one")
        return asked
    for port in range(DEFAULT_PORT, DEFAULT_PORT + _PORTS_TRIED):
        if _free(host, port):
            return port
    raise UsageError(f"ports {DEFAULT_PORT}-{DEFAULT_PORT + _PORTS_TRIED - 1} are all in use on "
                     f"{host}.\n  fix: pass a free --port")


def _free(host: str, port: int) -> bool:
    """Whether ``port`` can be listened on now (the server binds it moments later)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the server does: a port left in TIME_WAIT by a previous run is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise UsageError(f"--host {host}: cannot listen there ({exc.strerror}).\n"
                             "  fix: pass an address of this machine, e.g. --host 127.0.0.1") from None
    return True


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _report(args: argparse.Namespace) -> int:
    from hpo.dashboards.report import write_report

    output = Path(args.output) if args.output else Path(args.run_dir) / "report.html"
    if output.is_dir():
        raise UsageError(f"-o {output}: is a directory.\n  fix: name a file, e.g. -o {output / 'report.html'}")
    if output.exists() and not args.force:
        raise UsageError(f"{output}: already exists; hpo report does not overwrite it.\n"
                         "  fix: pass --force to replace it, or -o another file")
    written = write_report(args.run_dir, output)
    print(f"hpo report: wrote {written} ({written.stat().st_size / 1e6:.1f} MB); open it in any "
          "browser, no network needed", file=sys.stderr)
    return 0
