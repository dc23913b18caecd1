"""The PyCOMPSs test double is as strict as the runtime: one test per rule of
tests/compss_double/README.md. A double that accepts what COMPSs rejects
would hide bugs from every compss engine test."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import wait_for


@pytest.fixture
def api(compss):
    from pycompss.api import api, constraint, task

    return api, constraint.constraint, task.task


def declare(constraint, task, function, constraints=None, **task_options):
    """``function`` declared as a task, as a module-level function would be."""
    function.__qualname__ = function.__name__
    task_options.setdefault("returns", 1)
    declared = task(**task_options)(function)
    if constraints is not None:
        declared = constraint(**constraints)(declared)
    globals()[function.__name__] = declared  # a worker finds it by module and name
    return declared


def test_constraint_values_come_from_the_environment_of_the_runtime_start(compss, monkeypatch):
    monkeypatch.setenv("AT_START", "3")
    compss.start()
    monkeypatch.setenv("LATER", "4")  # set by the application: the runtime never sees it
    assert compss.describe({"computing_units": "$AT_START"})["cpus"] == 3
    assert compss.describe({"computing_units": "$LATER"}) == {"cpus": 1, "gpus": 0, "memory_gb": None}


def test_a_top_level_computing_units_and_a_cpu_processor_add_up(compss):
    asked = {"computing_units": 4, "processors": [{"processorType": "CPU", "computingUnits": 4},
                                                  {"processorType": "GPU", "computingUnits": 1}]}
    assert compss.describe(asked) == {"cpus": 8, "gpus": 1, "memory_gb": None}


@pytest.mark.parametrize("constraints", [
    {"cpus": 2},                                                      # unknown key
    {"processors": [{"processorType": "GPU", "units": 1}]},           # unknown key in a processor
    {"memory_size": 2.5},                                             # a float
    {"processors": [{"processorType": "CPU", "computingUnits": 1.0}]},
])
def test_declarations_the_runtime_refuses(api, constraints):
    _, constraint, _ = api
    with pytest.raises(RuntimeError, match="COMPSs aborts"):
        constraint(**constraints)


@pytest.mark.parametrize("declared, kept, memory_gb", [
    ("1.5", 1, 1.0),     # a string neither digits nor $VAR: int(eval(value)), cut
    ("0.5", 0, None),    # cut to nothing: no memory reserved
    ("2", "2", 2.0),     # digits: kept as declared
    ("$MEM", "$MEM", None),  # a variable: resolved at start (unset here: the default)
])
def test_the_binding_cuts_a_fractional_memory_size(api, compss, declared, kept, memory_gb):
    """PyCOMPSs 3.3, TaskMaster.inspect_constraints: what the runtime gets."""
    compss.start()

    def sized():
        return 1

    wait_on, constraint, task = api[0].compss_wait_on, api[1], api[2]
    assert wait_on(declare(constraint, task, sized, {"memory_size": declared})()) == 1
    [call] = compss.submitted
    assert call["constraints"] == {"memory_size": kept}
    assert call["resources"]["memory_gb"] == memory_gb


def test_the_number_of_resources_counts_nodes_not_slots(api, compss):
    compss.start(nodes=3, cpus_per_node=48)
    assert api[0].compss_get_number_of_resources() == 3


def test_tasks_run_as_many_at_once_as_the_nodes_cores_hold(api, compss):
    compss.start(nodes=2, cpus_per_node=4)
    running, most = [], [0]

    def two_cores(i):
        running.append(i)
        most[0] = max(most[0], len(running))
        time.sleep(0.3)
        running.remove(i)
        return i

    wait_on, constraint, task = api[0].compss_wait_on, api[1], api[2]
    two = declare(constraint, task, two_cores, {"computing_units": 2})
    assert wait_on(*[two(i) for i in range(8)]) == list(range(8))
    assert most[0] == 4  # two per node


def test_a_task_failing_past_its_retries_ends_the_application(api, compss):
    compss.start(nodes=2, cpus_per_node=1)
    tries = []

    def broken():
        tries.append(1)
        raise OSError("disk full")

    wait_on, constraint, task = api[0].compss_wait_on, api[1], api[2]
    future = declare(constraint, task, broken)()
    wait_for(lambda: compss.ended, what="the application to end")
    assert len(tries) == 3  # then the same node again, then another
    with pytest.raises(compss.ApplicationEnded, match="disk full"):
        wait_on(future)


def test_an_ignored_failure_gives_none(api, compss):
    compss.start()

    def broken():
        raise OSError("disk full")

    future = declare(api[1], api[2], broken, on_failure="IGNORE")()
    assert api[0].compss_wait_on(future) is None and compss.ended is None


@pytest.mark.parametrize("how", ["cancel", "time_out"])
def test_cancel_and_time_out_raise_inside_the_running_task(api, compss, how):
    compss.start()
    seen = []
    started = threading.Event()

    def long_one():
        started.set()
        try:
            while True:
                time.sleep(0.05)
        except Exception as exc:  # what the worker's signal handler raises
            seen.append(type(exc).__name__)
            return "interrupted"

    wait_on, task_group = api[0].compss_wait_on, api[0].TaskGroup
    with task_group("g", implicit_barrier=False):
        future = declare(api[1], api[2], long_one, time_out=1 if how == "time_out" else 0)()
    started.wait(10)
    if how == "cancel":
        api[0].compss_cancel_group("g")
    wait_for(lambda: seen, what="the interruption")
    assert seen == ["CancelError" if how == "cancel" else "TimeOutError"]
    if how == "time_out":
        assert wait_on(future) == "interrupted"


def test_a_task_the_worker_cannot_find_by_name_fails(api, compss):
    compss.start(nodes=1, cpus_per_node=1)

    def hidden():
        return 1

    hidden.__qualname__ = "hidden"
    future = api[2](returns=1, on_failure="IGNORE")(hidden)()  # not a module attribute
    assert api[0].compss_wait_on(future) is None  # the job failed: ignored

    def factory():
        def inner():
            return 1
        return inner

    with pytest.raises(RuntimeError, match="method of class"):
        api[2](returns=1)(factory())
