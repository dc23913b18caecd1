"""Start a study somewhere else: SLURM batch jobs for the COMPSs and Dask engines.

Where compute comes from (:class:`SlurmProvider`: sbatch, squeue, scontrol,
scancel) is kept apart from how processes start in an allocation
(:class:`SrunLauncher`) and from what runs there (:class:`DaskJob`'s batch
script, :class:`CompssJob`'s enqueue_compss command).
"""

from hpo.launchers.compss import CompssJob
from hpo.launchers.dask_job import DaskJob
from hpo.launchers.request import BatchRequest
from hpo.launchers.slurm import JobStatus, SlurmProvider, SubmitError
from hpo.launchers.srun import SrunLauncher
from hpo.launchers.states import JobState

__all__ = ["BatchRequest", "CompssJob", "DaskJob", "JobState", "JobStatus", "SlurmProvider",
           "SrunLauncher", "SubmitError"]
