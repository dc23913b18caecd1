"""Runs trials one after another in the master process (for debugging)."""

from __future__ import annotations

from concurrent.futures import Future

from hpo.engines._base import Engine
from hpo.trial import TrialTask, run_trial


class InlineEngine(Engine):
    """Each submit runs the trial to the end before returning; one slot."""

    name = "inline"

    def __init__(self, retries: int = 0) -> None:
        self.retries = retries

    @property
    def slots(self) -> int:
        return 1

    def submit(self, task: TrialTask, priority: bool = False) -> Future:
        future: Future = Future()
        for attempt in range(self.retries + 1):
            try:
                future.set_result(run_trial(task))
                break
            except Exception as exc:  # an infrastructure fault (store unreachable...)
                if attempt == self.retries:
                    future.set_exception(exc)
        return future

    def wait(self, handles, timeout):
        return [h for h in handles if h.done()]

    def settle(self, handle: Future) -> None:
        handle.result()

    def cancel(self, handle: Future) -> None:
        handle.cancel()
