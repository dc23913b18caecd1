"""The space file's ``data`` section: what each node stages for its trials.

Sources are checked where the file is read (they live on the shared file
system every node mounts); ``stage_to`` only for its form, since each node
expands it in its own environment.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from hpo.data import DEFAULT_STAGE_TO, DataSection, UnsetVariable, expand_variables, syntax_problem
from hpo.space._params import Loc, as_bool, as_object

__all__ = ["parse_data"]

_KEYS = ("stage_to", "items", "keep")
# It names a folder on every node; a leading dot is hpo's (locks, markers).
_ITEM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
_EXAMPLE = '"data": {"stage_to": "$TMPDIR", "items": {"fmnist": "/shared/datasets/fashion-mnist"}}'


def parse_data(value: object, at: Loc) -> DataSection:
    """The validated section; a SpaceError naming the JSON path otherwise."""
    if not isinstance(value, dict):
        at.expected("an object", value, f"e.g. {_EXAMPLE}")
    given = {k: v for k, v in as_object(value, at, _KEYS).items() if v is not None}
    if "items" not in given:
        (at / "items").fail("missing required key 'items': nothing to stage",
                            f'name each file or folder to stage, e.g. {_EXAMPLE}')
    return DataSection(
        items=_items(given["items"], at / "items"),
        stage_to=_stage_to(given["stage_to"], at / "stage_to") if "stage_to" in given else DEFAULT_STAGE_TO,
        keep=as_bool(given["keep"], at / "keep") if "keep" in given else False,
    )


def _stage_to(value: object, at: Loc) -> str:
    example = 'e.g. "stage_to": "$TMPDIR", "/dev/shm" or "/local/scratch/$USER"'
    if not isinstance(value, str) or not value:
        at.expected("a node-local folder", value, example)
    problem = syntax_problem(value)
    if problem:
        at.fail(f"{value!r} is not a node-local folder: {problem}", example)
    return value


def _items(value: object, at: Loc) -> dict[str, str]:
    example = '"items": {"fmnist": "/shared/datasets/fashion-mnist"}'
    if not isinstance(value, dict) or not value:
        at.expected("a non-empty object of names and paths", value, f"e.g. {example}")
    items = {}
    for name, source in value.items():
        if not _ITEM_NAME.fullmatch(name):
            (at / name).fail(f"item name {name!r} cannot name a folder on every node",
                             "use letters, digits, '.', '_' and '-', not starting with '.', e.g. "
                             f'"{re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-") or "dataset"}"')
        items[name] = _source(source, at / name)
    return items


def _source(value: object, at: Loc) -> str:
    """An existing, readable file or folder, as an absolute path (workers run
    in other directories); ``~`` and ``$NAME`` are expanded here."""
    if not isinstance(value, str) or not value:
        at.expected("a path on the shared file system", value,
                    'e.g. "/shared/datasets/fashion-mnist"')
    try:
        path = Path(os.path.abspath(expand_variables(value)))
    except UnsetVariable as unset:
        at.fail(f"{value!r}: ${unset.args[0]} is not set where the study starts",
                "set it, or write the path out in full")
    fix = (f"give a file or folder that every node can read (on the shared file system); a "
           f"relative path is read from the folder hpo runs in ({os.getcwd()})")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        at.fail(f"no such file or directory: {path}", fix)
    except OSError as exc:
        at.fail(f"cannot read {path}: {exc.strerror or exc}", fix)
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        at.fail(f"{path} is neither a file nor a folder (a device, pipe or socket)", fix)
    if not os.access(path, os.R_OK | (os.X_OK if stat.S_ISDIR(mode) else 0)):
        at.fail(f"{path} is not readable by this user", f"chmod it, or {fix}")
    if not path.name:
        at.fail(f"{json.dumps(value)} is the root folder", "name the data's own folder")
    return str(path)
