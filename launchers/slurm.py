"""Where compute comes from: SLURM's sbatch, squeue, scontrol and scancel.

The provider only submits scripts, asks about job ids and cancels them; how
processes start inside an allocation is the launcher's business
(``hpo.launchers.srun``). Every command goes through one runner callable, so
the text handling is tested without SLURM and the real thing against a real
controller.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from hpo.errors import UsageError
from hpo.launchers.states import JobState, from_slurm

__all__ = ["SlurmProvider", "JobStatus", "SubmitError", "directives", "parse_job_id",
           "run_command", "require"]

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]

# sbatch --parsable prints "ID" or "ID;CLUSTER"; plain sbatch (and
# enqueue_compss, which calls it) prints "Submitted batch job ID".
_JOB_ID = re.compile(r"(?:^|Submitted batch job )(\d+)(?:;\S+)?\s*$", re.MULTILINE)
# scontrol -o: "Key=Value Key=Value ..."; a value may contain spaces.
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w/:]*)=(.*?)(?=\s+[A-Za-z][\w/:]*=|\s*$)")


class SubmitError(UsageError):
    """sbatch (or enqueue_compss) refused the job; keeps what it said.

    Almost always the request: a partition, QOS, account or size the site
    does not accept, so it is reported like other bad input (exit status 2).
    When the controller was never reached, the fix says so instead.
    """

    def __init__(self, command: Sequence[str], returncode: int, stdout: str, stderr: str,
                 note: str = "") -> None:
        self.command, self.returncode, self.stdout, self.stderr = list(command), returncode, stdout, stderr
        self.note = note
        said = (stderr.strip() or stdout.strip() or "no output")
        what = "printed no job id" if returncode == 0 else f"failed (exit {returncode})"
        fix = _unreachable_fix() if self.unreachable else _REQUEST_FIX
        super().__init__(f"{command[0]} {what}: {said}\n  fix: {fix}" + (f"\n  {note}" if note else ""))

    @property
    def unreachable(self) -> bool:
        """Whether the controller was never reached: no option sent is at fault."""
        return "unable to contact slurm controller" in (self.stderr + self.stdout).lower()

    def with_note(self, note: str) -> SubmitError:
        """The same refusal, with ``note`` (where the values sent came from) added."""
        if self.unreachable:  # the values were never looked at
            return self
        return SubmitError(self.command, self.returncode, self.stdout, self.stderr, note)


_REQUEST_FIX = ("check --partition, --qos, --account, --nodes and --time against the site's "
                "limits (sinfo, scontrol show partition); --dry-run shows what was sent")


def _unreachable_fix() -> str:
    conf = os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf (SLURM_CONF unset)"
    return ("the SLURM controller cannot be reached from this host: check that slurmctld is "
            f"up (scontrol ping), that the configuration used here is the cluster's ({conf}), "
            "and that you submit from a login node of the cluster")


@dataclass(frozen=True)
class JobStatus:
    """One job as SLURM sees it, with where its output goes."""

    job_id: str
    state: JobState
    slurm_state: str
    reason: str | None = None
    exit_code: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    nodes: str | None = None
    run_time: str | None = None
    time_limit: str | None = None
    restarts: str | None = None  #: how often SLURM requeued the job ("0" for none)

    def to_dict(self) -> dict[str, str | None]:
        return {**asdict(self), "state": self.state.value}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobStatus:
        """The inverse of :meth:`to_dict` (other keys are ignored)."""
        found: dict[str, Any] = {f.name: data.get(f.name) for f in fields(cls)}
        return cls(**{**found, "state": JobState.__members__.get(str(found["state"]), JobState.UNKNOWN)})


def run_command(argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a SLURM command and capture its output (the default runner)."""
    require(argv[0])
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)


def require(program: str) -> str:
    """The path of ``program``, or a UsageError saying it is not on PATH."""
    found = shutil.which(program)
    if found is None:
        raise UsageError(
            f"{program}: not found on PATH.\n  fix: run this on a login node of the cluster "
            "(or load its module), or add --dry-run to print what would be submitted")
    return found


def directives(options: Mapping[str, object], extra: Iterable[str] = ()) -> str:
    """``#SBATCH`` lines for the options that are set (None and False are left out).

    >>> print(directives({"nodes": 2, "qos": None, "exclusive": True}, ["--reservation=x"]))
    #SBATCH --nodes=2
    #SBATCH --exclusive
    #SBATCH --reservation=x
    """
    lines = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        text = str(value)
        if any(c.isspace() for c in text):  # sbatch reads double-quoted directive values
            text = f'"{text}"'
        lines.append(f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={text}")
    lines += [f"#SBATCH {option}" for option in extra]
    return "\n".join(lines)


def parse_job_id(output: str) -> str | None:
    """The job id in sbatch's or enqueue_compss's output, or None.

    >>> parse_job_id("123;cluster"), parse_job_id("...\\nSubmitted batch job 77\\n")
    ('123', '77')
    """
    found = _JOB_ID.findall(output)
    return found[-1] if found else None


class SlurmProvider:
    """Submit, query and cancel SLURM batch jobs.

    Parameters
    ----------
    runner:
        Runs one command (argv) and returns the completed process; replace it
        to test without SLURM.
    """

    def __init__(self, runner: Runner = run_command) -> None:
        self.runner = runner

    def __repr__(self) -> str:
        return f"SlurmProvider(runner={getattr(self.runner, '__name__', self.runner)!r})"

    def submit(self, script: Path, dependency: str | None = None) -> str:
        """Submit a batch script; returns the job id."""
        argv = ["sbatch", "--parsable"]
        if dependency:
            argv.append(f"--dependency={dependency}")
        return self.submit_command([*argv, str(script)])

    def submit_command(self, argv: Sequence[str]) -> str:
        """Run a submitting command (sbatch, enqueue_compss) and parse its job id."""
        done = self.runner(argv)
        job_id = parse_job_id(done.stdout) if done.returncode == 0 else None
        if job_id is None:
            raise SubmitError(argv, done.returncode, done.stdout, done.stderr)
        return job_id

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """The status of each job: squeue for the live state (one call for
        all), then ``scontrol show job`` for details and for jobs that left the
        queue. A job neither knows is MISSING."""
        live = self.queued(job_ids)
        return {job_id: self._scontrol(job_id, live.get(job_id)) for job_id in job_ids}

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self.runner(["scancel", *job_ids])

    def queued(self, job_ids: Sequence[str]) -> dict[str, str]:
        """SLURM's state name of each job still in its queue (pending, held,
        running, completing: also one requeued after it ended), in one call;
        jobs that ended are left out."""
        if not job_ids:
            return {}
        done = self.runner(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T"])
        # squeue fails outright when every id has been purged: nothing is live.
        lines = done.stdout.splitlines() if done.returncode == 0 else []
        return dict(line.split("|", 1) for line in lines if "|" in line)

    def _scontrol(self, job_id: str, live_state: str | None) -> JobStatus:
        done = self.runner(["scontrol", "-o", "show", "job", job_id])
        fields = dict(_FIELD.findall(done.stdout)) if done.returncode == 0 else {}
        raw = live_state or fields.get("JobState")
        if raw is None:
            said = (done.stderr or done.stdout).strip()
            if "invalid job id" in said.lower():
                return JobStatus(job_id, JobState.MISSING, "MISSING",
                                 reason="no longer known to SLURM (purged after MinJobAge)")
            # SLURM did not answer: say so rather than guess that the job is gone.
            return JobStatus(job_id, JobState.UNKNOWN, "UNKNOWN",
                             reason=said.splitlines()[-1] if said else "scontrol gave no answer")
        state = from_slurm(raw)
        return JobStatus(
            job_id, state, raw, reason=_unset(fields.get("Reason")),
            exit_code=fields.get("ExitCode"), stdout=fields.get("StdOut"),
            stderr=fields.get("StdErr"), nodes=_unset(fields.get("NodeList")),
            run_time=fields.get("RunTime"), time_limit=fields.get("TimeLimit"),
            restarts=fields.get("Restarts"),
        )


def _unset(value: str | None) -> str | None:
    return None if value in (None, "", "None", "(null)") else value
