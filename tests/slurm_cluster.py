"""A real single-node SLURM cluster for the tests, private to one temp dir.

munged, slurmctld and slurmd are started in the background with their
sockets, pid files, spool, state and logs under ``root`` and free TCP ports,
so nothing leaks between runs or clashes with a system SLURM; stop() ends them
by PID. Commands reach this cluster through ``SLURM_CONF`` (see ``env``).
Needs root (slurmd runs jobs as their owner) and the slurm-wlm and munge
Debian packages.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["SlurmCluster", "unavailable_reason"]

_DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
_MUNGE_KEY = Path("/etc/munge/munge.key")


def unavailable_reason() -> str | None:
    """Why SLURM cannot run on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "SLURM daemons need root (slurmd starts jobs as their owner)"
    missing = [p for p in (*_DAEMONS, "/usr/bin/sbatch") if not Path(p).exists()]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install slurm-wlm munge)"
    if not _MUNGE_KEY.exists():
        return f"{_MUNGE_KEY} missing (the munge package creates it)"
    return None


class SlurmCluster:
    """slurmctld + slurmd on 127.0.0.1 with ``gpus`` fake GPU devices."""

    def __init__(self, root: Path, gpus: int = 0) -> None:
        self.root, self.gpus = Path(root), gpus
        self.host = socket.gethostname().split(".")[0]
        self.cpus = os.cpu_count() or 1
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self._pids: dict[str, Path] = {}

    @property
    def env(self) -> dict[str, str]:
        """The environment for SLURM commands aimed at this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- start -----------------------------------------------------------

    def start(self) -> None:
        for sub in ("etc", "state", "spool", "log", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # munged runs as the munge user and must reach its dir
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-c", "-f", str(self.conf)])
        self._spawn("slurmd", ["/usr/sbin/slurmd", "-f", str(self.conf)])
        self._wait_idle(timeout=30)

    def _start_munge(self) -> None:
        run_dir = self.munge_socket.parent
        run_dir.mkdir(exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        pid = run_dir / "munged.pid"
        subprocess.run(
            ["runuser", "-u", "munge", "--", "/usr/sbin/munged",
             f"--socket={self.munge_socket}", f"--pid-file={pid}", f"--key-file={_MUNGE_KEY}",
             f"--log-file={run_dir / 'munged.log'}", f"--seed-file={run_dir / 'munged.seed'}"],
            check=True, capture_output=True, text=True, timeout=30,
        )
        self._pids["munged"] = pid

    def _write_conf(self) -> None:
        r = self.root
        gres = ""
        if self.gpus:
            devices = r / "fakegpu"
            devices.mkdir(exist_ok=True)
            for k in range(self.gpus):
                node = devices / f"nvidia{k}"
                if not node.exists():
                    # Same major/minor as /dev/null: a device file SLURM can bind.
                    os.mknod(node, 0o666 | 0o020000, os.makedev(1, 3))
            (r / "etc" / "gres.conf").write_text(
                f"AutoDetect=off\nNodeName={self.host} Name=gpu File={devices}/nvidia[0-{self.gpus - 1}]\n")
            gres = f" Gres=gpu:{self.gpus}"
        ctld, slurmd = _free_port(), _free_port()
        self.conf.write_text(f"""\
ClusterName=hpotest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
SlurmUser=root
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmdSpoolDir={r}/spool
StateSaveLocation={r}/state
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
{"GresTypes=gpu" if self.gpus else ""}
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
# Walltime tests: no grace after the limit. SIGTERM-to-SIGKILL: 20 s, so a
# job's study gets a stop grace of 15 s (5 s are kept for the way out).
OverTimeLimit=0
KillWait=20
MinJobAge=600
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={self.cpus} ThreadsPerCore=1{gres} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self._pids["slurmctld"] = r / "run" / "slurmctld.pid"
        self._pids["slurmd"] = r / "run" / "slurmd.pid"

    def _spawn(self, name: str, argv: list[str]) -> None:
        # Both daemons fork into the background and write their pid files.
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"{name} failed to start: {result.stderr}\n{self.logs()}")
        _wait_for(lambda: self._pid(name) is not None, 15, f"{name} pid file")

    def _wait_idle(self, timeout: float) -> None:
        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env,
                                 capture_output=True, text=True).stdout.split()
            return out == ["idle"]
        try:
            _wait_for(idle, timeout, "node idle")
        except TimeoutError:
            raise RuntimeError(f"SLURM node never became idle\n{self.logs()}") from None

    # -- stop ------------------------------------------------------------

    def stop(self) -> None:
        self.cancel_all()
        subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True, timeout=30)
        for name in ("slurmd", "slurmctld", "munged"):
            self._stop_pid(name)

    def jobs(self) -> list[str]:
        """Ids of the jobs still queued or running."""
        out = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True,
                             text=True, timeout=30).stdout
        return out.split()

    def cancel_all(self, timeout: float = 30) -> None:
        """Cancel every job and wait for them to leave (their processes die with them)."""
        if self._pid("slurmctld") is None:
            return
        ids = self.jobs()
        if ids:
            subprocess.run(["scancel", *ids], env=self.env, capture_output=True, timeout=30)
            try:
                _wait_for(lambda: not self.jobs(), timeout, "jobs to end")
            except TimeoutError:
                pass

    def _stop_pid(self, name: str) -> None:
        pid = self._pid(name)
        if pid is None:
            return
        deadline = time.monotonic() + 15
        sent = False
        while _alive(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                break
            if not sent and (name == "munged" or time.monotonic() > deadline - 10):
                os.kill(pid, signal.SIGTERM)  # scontrol shutdown did not reach it
                sent = True
            time.sleep(0.1)
        self._pids[name].unlink(missing_ok=True)

    def _pid(self, name: str) -> int | None:
        try:
            return int(self._pids[name].read_text().split()[0])
        except (KeyError, OSError, ValueError, IndexError):
            return None

    def logs(self) -> str:
        """The daemons' logs (tails), for failure messages."""
        parts = []
        for log in sorted((self.root / "log").glob("*.log")):
            parts.append(f"--- {log}\n" + "\n".join(log.read_text().splitlines()[-30:]))
        return "\n".join(parts)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)
