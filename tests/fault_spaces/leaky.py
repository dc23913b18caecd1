"""An objective that starts processes and never waits for them: a child, a
child that left the process group (``setsid``), and an orphan (its parent
exited); each one's PID is written under ``pid_dir`` (tests/test_faults.py)."""

import subprocess
from pathlib import Path


def train(config, trial):
    pid_dir = Path(config["pid_dir"])
    child = subprocess.Popen(["sleep", "600"], start_new_session=bool(config.get("setsid")))
    (pid_dir / f"{trial.number}-child").write_text(str(child.pid))
    if config.get("orphan"):
        subprocess.run(["sh", "-c", f"sleep 600 & echo $! > {pid_dir}/{trial.number}-orphan"], check=True)
    trial.report(0, value=1.0)
    return {"value": float(config["x"])}
