"""A trial that reports fast and logs each report once it was acknowledged:
what a killed master must not lose (tests/test_exactly_once.py)."""

import os


def train(config, trial):
    state = trial.load_checkpoint() or {"step": 0}
    acks = os.path.join(config["acks"], f"{trial.number}.log")
    for step in range(state["step"], config["steps"]):
        trial.report(step, value=trial.number * 1000.0 + step)  # durable when it returns
        with open(acks, "a") as log:
            log.write(f"{step}\n")
        trial.save_checkpoint({"step": step + 1})
        if trial.should_stop():
            break
    return {"value": trial.number * 1000.0 + config["steps"]}
