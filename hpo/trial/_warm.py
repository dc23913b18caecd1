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
One warm process forks the trials of every slot of its worker, side by
side (packed GPU trials included): they share its imports' memory, and
only the worker's first such trial pays a fresh start.

A warm process is only kept when forking it is safe: one thread, and no
GPU driver initialised (a module that touches the GPU at import). Otherwise,
or with ``HPO_WARM_START=0``, trials start a fresh Python as before.

The protocol is JSON: the worker sends a trial's files, environment and
directory on a socket, with the write end of a pipe of the trial's own;
the warm process answers on that pipe the trial's pid, and later its exit
status.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import select
import signal
import socket
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

_warm: dict[tuple, WarmProcess] = {}  # per objective (and what its imports fixed), the one serving it
_open: set[WarmProcess] = set()  # every one not closed yet, serving or closing
_refused: set[tuple] = set()  # objectives whose warm process could not serve: not tried again
_lock = threading.Lock()
_starting = threading.Lock()  # held while a warm process starts, so that one starts per objective


def warm_enabled() -> bool:
    return os.environ.get("HPO_WARM_START", "1").strip().lower() not in ("0", "no", "false", "off")


def preload_modules() -> list[str]:
    """The modules the user asks every warm process to import (``HPO_PRELOAD``,
    comma-separated), beside the objective's own module."""
    return [m.strip() for m in os.environ.get("HPO_PRELOAD", "").split(",") if m.strip()]


def start_warm(objective: Any, env: dict[str, str], task_file: str, result_file: str) -> WarmChild | None:
    """Fork the trial's process from this worker's warm process for
    ``objective`` (started now if none serves it yet; it may be forking the
    worker's other trials meanwhile), with ``env`` and this directory; None when
    warm processes are off or cannot be used here (the caller starts a fresh
    Python)."""
    if not warm_enabled() or not hasattr(os, "pidfd_open"):
        return None
    key = _key(objective, env)
    if key in _refused:
        return None
    with _starting:  # two slots' first trials at once start one warm process
        warm = _serving(key)
        if warm is None:
            warm = WarmProcess.start(key, _objective_name(objective), env)
            if warm is None:
                return None
            with _lock:
                _warm[key] = warm
                extra = _extra_idle()
            for process in extra:
                process.close_when_idle()
    child = warm.fork(task_file, result_file, env)
    if child is None:  # it died meanwhile, or could not take the request: given no more trials
        with _lock:
            if _warm.get(key) is warm:
                del _warm[key]
        warm.close_when_idle()  # the worker's other trials may still run from it
        return None
    return child


def warm_pids() -> list[int]:
    """This process's warm processes, those closing included (its trials'
    reaping spares them)."""
    with _lock:
        return [w.pid for w in _open]


def close_warm_processes() -> None:
    """End this process's idle warm processes (the inline engine's master, at
    its study's end); busy ones end once their last trial is over."""
    with _lock:
        warm = list(_warm.values())
        _warm.clear()
    for process in warm:
        process.close_when_idle()


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


def _serving(key: tuple) -> WarmProcess | None:
    """The live warm process for ``key``; a dead one is let go."""
    with _lock:
        warm = _warm.get(key)
        if warm is None or warm.alive():
            return warm
        del _warm[key]
    warm.close()
    return None


def _extra_idle() -> list[WarmProcess]:
    """Those beyond MAX_IDLE idle warm processes (other objectives'), the
    oldest, let go for the caller to close (called holding ``_lock``)."""
    idle = [k for k, w in _warm.items() if not w.children]
    return [_warm.pop(key) for key in idle[:max(0, len(idle) - MAX_IDLE)]]


class WarmProcess:
    """One warm process, from the worker's side: requests go over a socket,
    each with the write end of a pipe on which that trial's answers come
    (its pid, then its exit status), so each trial's thread waits on its own."""

    def __init__(self, proc: subprocess.Popen, channel: socket.socket) -> None:
        self.proc, self.pid = proc, proc.pid
        self._channel = channel
        self._lock = threading.Lock()  # its sends, and the count and closing below
        self.children = 0  # its trials' processes not yet waited for
        self._closing = False

    @classmethod
    def start(cls, key: tuple, objective: str | None, env: dict[str, str]) -> WarmProcess | None:
        """A new warm process, once it imported what it preloads; None if it
        cannot serve (forking it would be unsafe, or it did not start)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-m", "hpo.trial._child", "--warm", str(theirs.fileno())]
        spec = {"objective": objective, "preload": preload_modules()}
        try:
            # A session of its own: a Ctrl-C at the terminal is for the trials, not
            # for it; it leaves when the worker closes its end of the socket.
            proc = subprocess.Popen(command, env=env, pass_fds=(theirs.fileno(),), start_new_session=True)
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        warm = cls(proc, ours)
        with _lock:
            _open.add(warm)
        answer = None
        try:
            ours.sendall(json.dumps(spec).encode())
            answer = json.loads(ours.recv(65536) or b"null")
        except OSError:
            pass
        if not (answer or {}).get("ready"):
            warm.close()
            _refuse(key, (answer or {}).get("why") or "the warm process did not start")
            return None
        return warm

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, task_file: str, result_file: str, env: dict[str, str]) -> WarmChild | None:
        request = {"task": task_file, "result": result_file, "env": env, "cwd": os.getcwd()}
        answers, theirs = os.pipe()
        with self._lock:
            self.children += 1  # counted from now: not closed while it forks
            try:
                socket.send_fds(self._channel, [json.dumps(request).encode()], [theirs])
                sent = True
            except OSError:
                sent = False
            finally:
                os.close(theirs)
        child = WarmChild(self, answers)
        answer = child.answer(None) if sent else None
        if not answer or "pid" not in answer:
            child.close()
            return None
        child.pid = int(answer["pid"])
        return child

    def ended(self) -> None:
        """One of its trials' processes was waited for."""
        with self._lock:
            self.children -= 1
            last = self._closing and not self.children
        if last:
            self.close()

    def close_when_idle(self) -> None:
        """End it now if no trial of its runs, else once its last one ends."""
        with self._lock:
            self._closing = True
            busy = self.children > 0
        if not busy:
            self.close()

    def close(self) -> None:
        """End it: its end of the socket closes, and it leaves."""
        with _lock:
            _open.discard(self)
        self._channel.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class WarmChild:
    """A trial's process forked by a warm process, waited for as a
    :class:`subprocess.Popen` is (its exit status comes from its parent, on
    the trial's own pipe: a select, which the runtime's exception in this
    thread interrupts at once)."""

    def __init__(self, warm: WarmProcess, answers: int) -> None:
        self.warm, self.pid = warm, -1
        self.returncode: int | None = None
        self._answers = answers
        self._buffer = b""

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

    def answer(self, timeout: float | None) -> dict[str, Any] | None:
        """The next answer about this trial; ``{}`` once its warm process is
        gone without one, None after ``timeout`` s."""
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._answers], [], [], timeout)
            if not ready:
                return None
            try:
                chunk = os.read(self._answers, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                return {}
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        if self._answers >= 0:
            os.close(self._answers)
            self._answers = -1
            self.warm.ended()

    def _collect(self, timeout: float | None) -> None:
        answer = self.answer(timeout)
        if answer is None:
            return
        # No status: the warm process died (killed with the trial's), and its
        # child is reaped by whoever adopted it; its exit status is lost.
        self.returncode = int(answer.get("exit", -signal.SIGKILL))
        self.close()


# -- inside the warm process ---------------------------------------------------------


def serve_warm(channel_fd: int, run_child: Callable[[str, str], None]) -> None:
    """The warm process: import, say whether it can serve, then fork a
    trial's process per request, side by side, until the worker closes its
    end; each trial's pid and exit status go on the pipe its request came with."""
    channel = socket.socket(fileno=channel_fd)
    spec = json.loads(channel.recv(65536) or b"{}")
    why = _preload(spec.get("objective"), spec.get("preload") or [])
    channel.sendall(json.dumps({"ready": why is None, "why": why}).encode())
    if why is not None:
        return
    children: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, its answers' pipe)
    while True:
        ready, _, _ = select.select([channel_fd, *children], [], [])
        for pidfd in [fd for fd in ready if fd in children]:
            pid, answers = children.pop(pidfd)
            os.close(pidfd)
            _, status = os.waitpid(pid, 0)
            _answer(answers, {"exit": os.waitstatus_to_exitcode(status)})
            os.close(answers)
        if channel_fd not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(channel, 1 << 20, 1)
        if not message or not fds:
            return  # the worker went (its trials find themselves orphaned and suspend), or closed it
        request, answers = json.loads(message), fds[0]
        held = [channel_fd, *children, *(a for _, a in children.values())]
        pid = os.fork()
        if pid == 0:
            _become_trial(request, (*held, answers), run_child)
        children[os.pidfd_open(pid)] = (pid, answers)
        _answer(answers, {"pid": pid})


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


def _become_trial(request: dict[str, Any], inherited: tuple[int, ...],
                  run_child: Callable[[str, str], None]) -> None:
    """In the fork: the trial's process. Never returns."""
    code = 1
    try:
        for fd in inherited:  # the warm process's socket and its other trials' fds
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


def _answer(answers: int, message: dict[str, Any]) -> None:
    os.write(answers, json.dumps(message).encode() + b"\n")
