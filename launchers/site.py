"""A site profile: what every batch job on one cluster needs before Python starts.

Clusters differ in what a job must do first (``module load ...``, activating
an environment, a node-local scratch disk) and in the accounting options
every job carries. A profile is a TOML file holding them once, so each
``hpo submit`` need not repeat them::

    setup = ["module load python/3.11", "source /gpfs/projects/bsc99/env/bin/activate"]
    scratch = "$TMPDIR"          # Dask's working files on node-local disk
    compss_scratch = "local_disk"  # COMPSs workers' --worker_working_dir
    partition = "acc"
    qos = "acc_bsccs"
    account = "bsc99"
    sbatch = ["--constraint=highmem"]   # extra #SBATCH lines (dask engine)
    sc_cfg = "mn5.cfg"           # COMPSs site profile (compss engine)

Which profile: ``--site FILE``, else ``$HPO_SITE``, else
``$XDG_CONFIG_HOME/hpo/site.toml`` (``~/.config/hpo/site.toml``) if it
exists; ``--site none`` uses none. Options given on the command line win over
the profile's; ``--setup`` lines run after the profile's. Unknown keys and
wrong types are refused (exit 2) with the key and the closest valid one.

A set-up line that sources a file missing on the submitting host is
refused at submission (:func:`check_setup`): in the job it would fail and
the job go on without it. A site whose files exist on its compute nodes
only turns that off with ``check_setup = false``.
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpo.errors import UsageError, closest

__all__ = ["Site", "load_site", "site_path", "check_scratch", "check_setup"]

_TEXT = ("partition", "qos", "account", "scratch", "compss_scratch", "sc_cfg")
_LINES = ("setup", "sbatch")
_FLAGS = ("check_setup",)
KEYS = (*_LINES, *_TEXT, *_FLAGS)

# A scratch path goes into the batch script inside double quotes, so that the
# node's own variables ($TMPDIR, $SLURM_JOB_ID) expand there: only plain path
# characters and $NAME / ${NAME} references, nothing the shell would execute.
_SCRATCH = re.compile(r"^(?:[\w./+,:@%=-]|\$[A-Za-z_]\w*|\$\{[A-Za-z_]\w*\})+$")


@dataclass(frozen=True)
class Site:
    """The settings of one site profile (all empty: no profile).

    Parameters
    ----------
    setup:
        Shell lines run in the job before any Python (``module load ...``).
    scratch:
        Node-local directory for Dask's working files (expanded on the node).
    compss_scratch:
        The COMPSs workers' ``--worker_working_dir`` (``local_disk``, or a path).
    partition, qos, account:
        Defaults for ``--partition``, ``--qos``, ``--account``.
    sbatch:
        Extra ``#SBATCH`` options of the Dask batch script.
    sc_cfg:
        Default ``--sc-cfg`` (the COMPSs profile of the site).
    check_setup:
        Whether a set-up line's sourced file must exist on the submitting
        host (False where it exists on the compute nodes only).
    source:
        The profile file, or None.
    """

    setup: tuple[str, ...] = ()
    scratch: str | None = None
    compss_scratch: str | None = None
    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    sbatch: tuple[str, ...] = ()
    sc_cfg: str | None = None
    check_setup: bool = True
    source: Path | None = None


def site_path(given: str | None, env: Mapping[str, str] | None = None) -> Path | None:
    """The profile to read: ``given``, ``$HPO_SITE``, or the user's default file if present."""
    env = os.environ if env is None else env
    chosen = given if given is not None else env.get("HPO_SITE")
    if chosen is not None:
        return None if chosen.lower() in ("", "none") else Path(chosen).expanduser()
    config = Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME", "~")) / ".config")
    default = config.expanduser() / "hpo" / "site.toml"
    return default if default.is_file() else None


def load_site(given: str | None = None, env: dict[str, str] | None = None) -> Site:
    """The site profile in effect (see the module's docstring); UsageError when it is bad."""
    path = site_path(given, env)
    if path is None:
        return Site()
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the site profile: {exc.strerror or exc}.\n"
                         "  fix: pass --site with an existing TOML file (launchers/sites/ has "
                         "examples), or --site none") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}.\n"
                         "  fix: see launchers/sites/generic.toml for the form") from exc
    return Site(**_checked(data, path), source=path.resolve())


def _checked(data: dict[str, Any], path: Path) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in KEYS:
            hint = closest(key, KEYS)
            raise UsageError(f"{path}: unknown key {key!r}" + (f" (did you mean {hint!r}?)" if hint else "")
                             + f".\n  fix: use one of {', '.join(KEYS)}")
        if key in _LINES:
            values[key] = _lines(value, key, path)
        elif key in _FLAGS:
            if not isinstance(value, bool):
                raise UsageError(f"{path}: {key} = {value!r}: expected true or false.\n"
                                 f"  fix: e.g. {key} = false")
            values[key] = value
        elif not isinstance(value, str) or not value.strip():
            raise UsageError(f"{path}: {key} = {value!r}: expected a non-empty string.\n"
                             f"  fix: e.g. {key} = \"NAME\"")
        else:
            values[key] = value
    for option in values.get("sbatch", ()):
        if not option.startswith("-"):
            raise UsageError(f"{path}: sbatch: {option!r} is not an option.\n"
                             "  fix: write it with its dashes, e.g. sbatch = [\"--constraint=highmem\"]")
    if "scratch" in values:
        check_scratch(values["scratch"], f"{path}: scratch")
    return values


def _lines(value: Any, key: str, path: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{path}: {key} = {value!r}: expected a list of strings.\n"
                         f"  fix: e.g. {key} = [\"...\", \"...\"]")
    for line in value:
        if "\n" in line or not line.strip():
            raise UsageError(f"{path}: {key}: {line!r}: expected one non-empty line per string.\n"
                             "  fix: split it into several strings of the list")
    return tuple(value)


def check_scratch(value: str, where: str = "--scratch") -> None:
    """Refuse a scratch path the batch script could not hold safely."""
    if not _SCRATCH.match(value):
        raise UsageError(f"{where} {value!r}: a scratch path may hold path characters and "
                         "$NAME or ${NAME} references to the node's variables only.\n"
                         "  fix: e.g. --scratch '$TMPDIR' or --scratch /local/scratch")


def check_setup(site: Site, extra: Sequence[str] = ()) -> None:
    """Refuse a set-up line (the profile's, then ``--setup``'s) that sources a
    file missing on this host: the job would print an error and go on
    without it. A path holding a variable this host lacks is not checked
    (the node's own, or set by an earlier line); nor anything where the
    profile says ``check_setup = false``."""
    if not site.check_setup:
        return
    lines = [(line, f"{site.source}: setup") for line in site.setup]
    lines += [(line, "--setup") for line in extra]
    for line, origin in lines:
        missing = _sourced_missing(line)
        if missing is None:
            continue
        profile = (f"add check_setup = false to {site.source}" if site.source else
                   "add check_setup = false to a site profile (--site FILE)")
        raise UsageError(
            f"{origin}: {line!r}: {missing}: no such file on this host; in the job the line "
            "would fail and the job go on without it.\n"
            "  fix: correct the path (the shipped profiles' paths are examples to adapt); if "
            f"the file exists on the compute nodes only, {profile}")


def _sourced_missing(line: str) -> str | None:
    """The file a ``source FILE`` (or ``. FILE``) line names, if this host lacks it."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None  # not for this check to parse: the job's shell says
    if len(words) < 2 or words[0] not in ("source", "."):
        return None
    path = os.path.expanduser(os.path.expandvars(words[1]))
    if "$" in path or Path(path).is_file():
        return None
    return path
