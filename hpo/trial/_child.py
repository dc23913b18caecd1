"""Entry point of an isolated trial: ``python -m hpo.trial._child TASK RESULT``."""

import pickle
import sys
from pathlib import Path

from hpo.trial._task import _run_here


def main(task_file: str, result_file: str) -> None:
    task = pickle.loads(Path(task_file).read_bytes())
    result = _run_here(task)
    try:
        payload = pickle.dumps(result)
    except Exception:  # an unpicklable return value: keep its text, classified as bad
        result.returned = repr(result.returned)
        payload = pickle.dumps(result)
    Path(result_file).write_bytes(payload)


if __name__ == "__main__":
    main(*sys.argv[1:3])
