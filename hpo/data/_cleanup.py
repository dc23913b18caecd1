"""Removing a study's copies from the nodes when the study ends.

The master asks every worker the engine can reach (Dask: ``client.run``);
each removes its node's ``<stage_to>/hpo-<study>`` (several workers of a
node race harmlessly: the folder is renamed away first, by one of them).
An engine that cannot run anything on a chosen node (COMPSs) has the
master remove its own node's copies, and the nodes trials ran on that it
could not reach are named in a notice, with where the copies are.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from hpo.data._errors import StagingError
from hpo.data._section import DataSection, study_folder_name
from hpo.data._stage import node_folder

__all__ = ["Removal", "remove_node_copies", "remove_copies"]


class Removal(NamedTuple):
    """What one node did: its host, the folder, whether it removed it (False:
    there was none), and why it could not, if it could not."""

    host: str
    folder: str | None
    removed: bool
    problem: str | None = None


def remove_node_copies(section: DataSection, study: str) -> Removal:
    """On a node: remove the study's copies here (run by the engine on each worker)."""
    host = socket.gethostname()
    try:
        folder = node_folder(section.stage_to, study)
    except StagingError as exc:
        return Removal(host, None, False, exc.problem)
    doomed = folder.with_name(f".{folder.name}.removing-{os.getpid()}")
    try:
        os.rename(folder, doomed)  # atomic: one worker of the node removes it
    except FileNotFoundError:
        return Removal(host, str(folder), False)
    except OSError as exc:
        return Removal(host, str(folder), False, f"{folder}: {exc.strerror or exc}")
    shutil.rmtree(doomed, ignore_errors=True)
    return Removal(host, str(folder), True)


def remove_copies(section: DataSection, study: str, hosts: Iterable[str],
                  on_every_worker: Callable[..., dict[str, Any]] | None,
                  verbose: bool = True) -> list[Removal]:
    """At the study's end, from the master: remove the copies on every node
    reachable (saying so when ``verbose``); tell about the nodes (of
    ``hosts``, where trials ran) where they may remain."""
    problem = None
    if on_every_worker is None:
        removals = [remove_node_copies(section, study)]  # this node: the only one within reach
    else:
        try:
            removals = list(on_every_worker(remove_node_copies, section, study).values())
        except Exception as exc:  # a worker lost on the way: tell, never fail a finished study
            removals, problem = [], f"{type(exc).__name__}: {exc}"
    removed = sorted({r.host for r in removals if r.removed})
    if removed and verbose:
        print(f"hpo: staged data removed on {len(removed)} node(s): {', '.join(removed)}",
              file=sys.stderr, flush=True)
    reasons = {r.host: r.problem for r in removals if r.problem}
    reached = {r.host for r in removals}
    reasons.update({host: problem or "not reachable from the master"
                    for host in sorted(set(hosts) - reached)})
    if reasons:
        print(f"hpo: the staged data of study {study!r} may remain under {section.stage_to}/"
              f"{study_folder_name(study)} on {len(reasons)} node(s): "
              + "; ".join(f"{host}: {why}" for host, why in sorted(reasons.items()))
              + '.\n  fix: remove it there, or set "data.keep": true to keep it on purpose',
              file=sys.stderr, flush=True)
    return removals
