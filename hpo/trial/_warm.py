"""Warm trial processes: a trial that needs a process of its own starts in
milliseconds instead of paying Python's start and its imports again.

A worker keeps, per objective, a *warm process*: a Python that imported
hpo, the objective's module (and with it its framework: PyTorch,
Lightning, TensorFlow, scikit-learn) and the modules named in
``HPO_PRELOAD``, then waits. For each isolated trial it forks; the fork
sets the trial's environment (its GPUs, their memory share, its thread
counts and working directory) before any of the trial's code runs, so
before CUDA is initialised, and runs ``hpo.trial._child`` as a fresh
process would. The warm process itself never runs a trial, so nothing a
trial does (a CUDA error, threads left running, a changed directory,
imported state) reaches the next one: each trial's process is used once.

A warm process is only kept when forking it is safe: one thread, and no
GPU driver initialised (a module that touches the GPU at import). Otherwise,
or with ``HPO_WARM_START=0``, trials start a fresh Python as before.

The protocol is JSON lines on two pipes: the worker sends a trial's files,
environment and directory; the warm process answers the trial's pid, then
its exit status.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from hpo.trial._cpus import pool_controller
from hpo.trial._objective import resolve_objective

__all__ = ["WarmChild", "WarmProcess", "start_warm", "close_warm_processes", "warm_pids",
           "serve_warm"]

#: Idle warm processes a worker keeps at most (each holds its imports' memory).
MAX_IDLE = 4

_idle: dict[tuple, list[WarmProcess]] = {}
_busy: set[WarmProcess] = set()
_refused: set[tuple] = set()  # objectives whose warm process could not serve: not tried again
_lock = threading.Lock()


def warm_enabled() -> bool:
    return os.environ.get("HPO_WARM_START", "1").strip().lower() not in ("0", "no", "false", "off")


def preload_modules() -> list[str]:
    """The modules the user asks every warm process to import (``HPO_PRELOAD``,
    comma-separated), beside the objective's own module."""
    return [m.strip() for m in os.environ.get("HPO_PRELOAD", "").split(",") if m.strip()]


def start_warm(objective: Any, env: dict[str, str], task_file: str, result_file: str) -> WarmChild | None:
    """Fork the trial's process from a warm process for ``objective`` (one
    started now if none is idle), with ``env`` and this directory; None when
    warm processes are off or cannot be used here (the caller starts a fresh
    Python)."""
    if not warm_enabled() or not hasattr(os, "pidfd_open"):
        return None
    key = _key(objective, env)
    if key in _refused:
        return None
    warm = _take(key) or WarmProcess.start(key, _objective_name(objective), env)
    if warm is None:
        return None
    with _lock:
        _busy.add(warm)
    child = warm.fork(task_file, result_file, env)
    if child is None:  # it died meanwhile: not kept
        with _lock:
            _busy.discard(warm)
        warm.close()
        return None
    child.on_exit = lambda: _give_back(key, warm)
    return child


def warm_pids() -> list[int]:
    """This process's warm processes (its trials' reaping spares them)."""
    with _lock:
        return [w.pid for w in (*_busy, *(w for ws in _idle.values() for w in ws))]


def close_warm_processes() -> None:
    """End this process's idle warm processes (the inline engine's master, at
    its study's end); busy ones end once their trial is over."""
    with _lock:
        idle = [w for ws in _idle.values() for w in ws]
        _idle.clear()
    for warm in idle:
        warm.close()


def _refuse(key: tuple, why: str) -> None:
    """Start the objective's trials in a fresh Python from now on, and say why."""
    if key not in _refused:
        _refused.add(key)
        print(f"hpo: trials of {key[0] or 'this objective'} start a fresh Python on this worker: {why}",
              file=sys.stderr, flush=True)


def _key(objective: Any, env: dict[str, str]) -> tuple:
    # What the warm process fixed at its start: its imports' search path and
    # the thread counts its libraries read as they loaded.
    threads = tuple(sorted((k, v) for k, v in env.items() if k.endswith("_NUM_THREADS")))
    return (_objective_name(objective), env.get("PYTHONPATH"), threads, tuple(preload_modules()))


def _objective_name(objective: Any) -> str | None:
    if isinstance(objective, str):
        return objective
    module = getattr(objective, "__module__", None)
    return None if module in (None, "__main__") else module


def _take(key: tuple) -> WarmProcess | None:
    with _lock:
        waiting = _idle.get(key, [])
        while waiting:
            warm = waiting.pop()
            if warm.alive():
                return warm
            warm.close()
    return None


def _give_back(key: tuple, warm: WarmProcess) -> None:
    with _lock:
        _busy.discard(warm)
        if warm.alive() and sum(len(ws) for ws in _idle.values()) < MAX_IDLE:
            _idle.setdefault(key, []).append(warm)
            return
    warm.close()


class WarmProcess:
    """One warm process, from the worker's side."""

    def __init__(self, proc: subprocess.Popen, requests: int, answers: int) -> None:
        self.proc, self.pid = proc, proc.pid
        self._requests, self._answers = requests, answers
        self._buffer = b""

    @classmethod
    def start(cls, key: tuple, objective: str | None, env: dict[str, str]) -> WarmProcess | None:
        """A new warm process, once it imported what it preloads; None if it
        cannot serve (forking it would be unsafe, or it did not start)."""
        to_warm, requests = os.pipe()
        answers, from_warm = os.pipe()
        command = [sys.executable, "-m", "hpo.trial._child", "--warm", str(to_warm), str(from_warm)]
        spec = {"objective": objective, "preload": preload_modules()}
        try:
            # A session of its own: a Ctrl-C at the terminal is for the trials, not
            # for it; it leaves when the worker closes its end of the requests.
            proc = subprocess.Popen(command, env=env, pass_fds=(to_warm, from_warm),
                                    start_new_session=True)
        except OSError:
            os.close(requests)
            os.close(answers)
            return None
        finally:
            os.close(to_warm)
            os.close(from_warm)
        warm = cls(proc, requests, answers)
        answer = warm._receive() if warm._send(spec) else None
        if not (answer or {}).get("ready"):
            warm.close()
            _refuse(key, (answer or {}).get("why") or "the warm process did not start")
            return None
        return warm

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, task_file: str, result_file: str, env: dict[str, str]) -> WarmChild | None:
        request = {"task": task_file, "result": result_file, "env": env, "cwd": os.getcwd()}
        if not self._send(request):
            return None
        answer = self._receive()
        if not answer or "pid" not in answer:
            return None
        return WarmChild(self, int(answer["pid"]))

    def close(self) -> None:
        """End it: its end of the requests closes, and it leaves."""
        for fd in (self._requests, self._answers):
            try:
                os.close(fd)
            except OSError:
                pass
        self._requests = self._answers = -1
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _send(self, message: dict[str, Any]) -> bool:
        try:
            os.write(self._requests, json.dumps(message).encode() + b"\n")
            return True
        except OSError:
            return False

    def _receive(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next answer; None at end of file, or after ``timeout`` s."""
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._answers], [], [], timeout)
            if not ready:
                return None
            try:
                chunk = os.read(self._answers, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


class WarmChild:
    """A trial's process forked by a warm process, waited for as a
    :class:`subprocess.Popen` is (its exit status comes from its parent)."""

    def __init__(self, warm: WarmProcess, pid: int) -> None:
        self.warm, self.pid = warm, pid
        self.returncode: int | None = None
        self.on_exit: Callable[[], None] = lambda: None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._collect(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"trial process {self.pid}", timeout or 0)
        return self.returncode

    def _collect(self, timeout: float | None) -> None:
        answer = self.warm._receive(timeout)
        if answer is None and not self.warm.alive():
            # The warm process died (killed with the trial's): its child is
            # reaped by whoever adopted it; its exit status is lost.
            answer = {"exit": -signal.SIGKILL}
        if answer is not None and "exit" in answer:
            self.returncode = int(answer["exit"])
            self.on_exit()


# -- inside the warm process ---------------------------------------------------------


def serve_warm(requests: int, answers: int, run_child: Callable[[str, str], None]) -> None:
    """The warm process: import, say whether it can serve, then fork a
    trial's process per request until the worker closes its end."""
    spec = json.loads(_read_line(requests) or b"{}")
    why = _preload(spec.get("objective"), spec.get("preload") or [])
    _answer(answers, {"ready": why is None, "why": why})
    if why is not None:
        return
    while True:
        line = _read_line(requests)
        if not line:
            return  # the worker is gone, or it closed this warm process
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become_trial(request, (requests, answers), run_child)
        _answer(answers, {"pid": pid})
        code = _wait_child(pid, requests)
        if code is None:
            return  # the worker went first: its trial finds itself orphaned and suspends
        _answer(answers, {"exit": code})


def _preload(objective: str | None, modules: list[str]) -> str | None:
    """Import what trials will need; why forking this process would be
    unsafe, or None. An import that fails is left to the trial, which
    reports it as it would in a fresh process."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    if objective and ":" in objective:
        try:
            resolve_objective(objective, path=[])
        except Exception:
            pass
    try:  # Linux 5.3 on; an older kernel (RHEL 8's 4.18) has none
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return "this kernel cannot wait for a forked trial (no pidfd_open: Linux 5.3 or newer)"
    pool_controller()  # the scan of its thread pools, done once for every trial it forks
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        return f"{threads} threads after its imports (forking would copy one)"
    if _gpu_opened():
        return "an import initialised CUDA (a fork cannot use it)"
    return None


def _gpu_opened() -> bool:
    """Whether this process initialised a GPU driver: CUDA opens its device
    files as it initialises (a library merely loaded opens none)."""
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized():
        return True
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/nvidia"):
                return True
        except OSError:
            continue
    return False


def _become_trial(request: dict[str, Any], pipes: tuple[int, int],
                  run_child: Callable[[str, str], None]) -> None:
    """In the fork: the trial's process. Never returns."""
    code = 1
    try:
        for fd in pipes:
            os.close(fd)
        os.setsid()  # its own process group, as a fresh trial process has
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])  # before CUDA: read at its initialisation
        sys.argv = [sys.argv[0], request["task"], request["result"]]  # as a launcher re-runs it
        _reseed()
        run_child(request["task"], request["result"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _reseed() -> None:
    """Fresh random states: a fork shares its parent's, which a fresh process
    would have drawn anew (weights initialised alike in every trial)."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "seed"):
        torch.seed()


def _wait_child(pid: int, requests: int) -> int | None:
    """The child's exit status (as Popen's returncode), or None when the
    worker closed its end first."""
    pidfd = os.pidfd_open(pid)
    try:
        while True:
            ready, _, _ = select.select([pidfd, requests], [], [])
            if pidfd in ready:
                _, status = os.waitpid(pid, 0)
                return os.waitstatus_to_exitcode(status)
            if not os.read(requests, 1):  # nothing else is sent while a trial runs
                return None
    finally:
        os.close(pidfd)


def _read_line(fd: int) -> bytes:
    """One request (the worker sends the next only after this one's answers)."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            return b""
        line += chunk
    return line


def _answer(answers: int, message: dict[str, Any]) -> None:
    os.write(answers, json.dumps(message).encode() + b"\n")
