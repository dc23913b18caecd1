"""Start a study somewhere else: SLURM batch jobs for the COMPSs and Dask engines."""
