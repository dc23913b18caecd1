"""``$NAME``, ``${NAME}`` and ``${NAME:-fallback}`` in paths, expanded where
they are used: ``stage_to`` on each node (``$TMPDIR`` is the node's own), a
source where the space file is read."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

__all__ = ["expand_variables", "syntax_problem", "UnsetVariable"]

_REFERENCE = re.compile(
    r"\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<fallback>[^}$]*))?\}"
    r"|\$(?P<plain>[A-Za-z_][A-Za-z0-9_]*)")


class UnsetVariable(KeyError):
    """A referenced variable is unset (or empty) and has no fallback."""


def syntax_problem(text: str) -> str | None:
    """What makes ``text`` unusable as a path of a node, or None.

    >>> syntax_problem("${TMPDIR:-/tmp}/x"), syntax_problem("scratch")[:15]
    (None, 'a relative path')
    """
    if "\0" in text:
        return "a NUL character"
    if "$" in _REFERENCE.sub("", text):
        return "a '$' that starts no variable (write $NAME, ${NAME} or ${NAME:-fallback})"
    if not text.startswith(("/", "~", "$")):
        return "a relative path (each node would resolve it in its own working directory)"
    return None


def expand_variables(text: str, env: Mapping[str, str] | None = None) -> str:
    """``text`` with its variables replaced from ``env`` (this process's
    environment) and a leading ``~`` made the home folder. A variable set
    but empty counts as unset, as ``${NAME:-fallback}`` does in a shell.

    >>> expand_variables("${SCRATCH:-/tmp}/$USER", {"USER": "ada"})
    '/tmp/ada'
    """
    env = os.environ if env is None else env

    def value(match: re.Match[str]) -> str:
        name = match["braced"] or match["plain"]
        if env.get(name):
            return env[name]
        if match["fallback"] is not None:
            return match["fallback"]
        raise UnsetVariable(name)

    expanded = _REFERENCE.sub(value, text)
    return os.path.expanduser(expanded) if expanded.startswith("~") else expanded
