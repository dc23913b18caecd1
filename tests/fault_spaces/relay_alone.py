"""A study's relay in a process of its own, as a master runs it, for tests
that measure that process or set its limits (tests/test_faults.py).

Prints the writers' URL, then answers each line read: ``trial`` creates a
trial through the relay (the master's own write) and prints ``ok N`` or the
error; ``rss`` prints the process's resident memory in bytes."""

import sys

import optuna
import psutil

from hpo.store import StudyRelay, StudyStore


def main() -> None:
    journal = sys.argv[1]
    with StudyRelay(journal, "s", control=journal + ".control") as relay:
        optuna.create_study(study_name="s", storage=relay.storage, direction="maximize")
        print(relay.writers_url, flush=True)
        for line in sys.stdin:
            if line.strip() == "rss":
                print(psutil.Process().memory_info().rss, flush=True)
            elif line.strip() == "trial":
                try:
                    trial_id, _ = StudyStore(relay.storage, "s").create_trial({}, {})
                    print(f"ok {trial_id}", flush=True)
                except Exception as exc:  # the test reads what went wrong
                    print(f"{type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":  # pytest's doctest collection imports it
    main()
