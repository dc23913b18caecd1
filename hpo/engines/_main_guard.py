"""The ``if __name__ == "__main__":`` check before an embedded cluster starts.

Dask starts its worker processes with ``spawn``: each new process imports the
main script again. A script that calls ``hpo.run`` at its top level would then
start the study again in every worker, and the first process would see only
"Nanny failed to start" and hundreds of lines of tracebacks. This check finds
the call before anything starts and says what to add.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import FrameType
from typing import TypeGuard

from hpo.errors import UsageError

__all__ = ["refuse_unguarded_main"]


def refuse_unguarded_main() -> None:
    """Raise UsageError when the main script reached this call from a
    top-level statement that is not under ``if __name__ == "__main__":``."""
    import dask

    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") == "fork":
        return  # forked workers do not import the script again
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and (spec.name == "__main__" or spec.name.endswith(".__main__")):
        return  # `python -m package`: a package's __main__ is not imported again
    path = getattr(main, "__file__", None)
    line = _top_level_line(main)
    if not path or line is None or not str(path).endswith(".py"):
        return  # an interactive session, a notebook, python -c: nothing is re-imported
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return
    # ast.parse sets every end_lineno (typeshed allows None, for nodes built by hand).
    if not any(_is_main_guard(node)
               and node.body[0].lineno <= line <= node.body[-1].end_lineno  # type: ignore[operator]
               for node in tree.body):
        raise UsageError(
            f"{path}, line {line}: the study is started at the script's top level; Dask's worker "
            "processes import the script again and would each start it too.\n"
            "  fix: put the call under `if __name__ == \"__main__\":` (see the README's Python "
            "example), or pass engine=\"inline\"")


def _top_level_line(main: object) -> int | None:
    """The line of the main script's top-level statement being executed."""
    namespace = getattr(main, "__dict__", None)
    frame: FrameType | None = sys._getframe(1)
    line: int | None = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is namespace:
            line = frame.f_lineno
        frame = frame.f_back
    return line


def _is_main_guard(node: ast.stmt) -> TypeGuard[ast.If]:
    """``if __name__ == "__main__":`` (either way round)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = {_name(test.left), _name(test.comparators[0])}
    return sides == {"__name__", "'__main__'"}


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and node.value == "__main__":
        return "'__main__'"
    return None
