"""Parameter importance: Optuna's fANOVA, per objective, conditional parameters included.

Optuna computes importance only over the parameters every trial has, so a
conditional parameter (``l1_ratio``, set only where ``penalty`` is
``elasticnet``) would be dropped without a word. Here the parameters every
trial has are scored over all the trials, and each conditional parameter over
the trials where it is set (its bar says so, and how many those are): a share
of the metric's variation among those trials, not of the whole study's.

Each score is the mean over bootstrap resamples of the trials, with their
standard deviation as a whisker. A multi-objective study gets a set of bars
per objective (a menu picks it).
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from typing import Literal, NamedTuple

import numpy as np
import plotly.graph_objects as go

from hpo.dashboards.data import Snapshot, TrialView
from hpo.dashboards.sampling import completed, sample
from hpo.dashboards.style import base_layout, menu, message_figure, plain

__all__ = ["importance", "import_importance", "scores", "why_none", "Score", "MIN_IMPORTANCE_TRIALS"]

# Fewer than this and nothing can be said; up to ~30 it is a rough hint, and
# the whiskers say so.
MIN_IMPORTANCE_TRIALS = 4
# fANOVA (16 trees) takes about 0.7 s per 100 trials: a few resamples of a
# sample keep a 100,000-trial study near 2 s; small studies get more resamples,
# where the uncertainty is what matters.
MAX_IMPORTANCE_TRIALS = 120
RESAMPLES = 6
RESAMPLES_MANY = 3  # beyond 60 trials the spread is small
COMMON_COLOUR, CONDITIONAL_COLOUR = "#1f77b4", "#9ecae1"
_ERRORS = (ValueError, RuntimeError, TypeError, ZeroDivisionError)


class Score(NamedTuple):
    """One parameter's importance for one objective."""

    name: str
    mean: float
    spread: float  # standard deviation over the resamples
    trials: int  # the trials it was computed on (all, or those where the parameter is set)
    conditional: bool  # set in only some trials: scored on those


@functools.lru_cache(maxsize=4)
def importance(snap: Snapshot) -> go.Figure:
    """The bars of each objective, most important on top; a menu picks the
    objective of a multi-objective study."""
    title = "Parameter importance (Optuna fANOVA: share of the metric's variance)"
    done = _activity(snap)[0]
    if len(done) < MIN_IMPORTANCE_TRIALS:
        return message_figure(title, f"Parameter importance needs at least {MIN_IMPORTANCE_TRIALS} "
                              f"completed trials; {len(done)} so far.")
    objectives = snap.objectives or ((snap.metric, snap.direction),)
    try:
        found = [scores(snap, k) for k in range(len(objectives))]
    except _ERRORS as exc:
        return message_figure(title, f"Importance cannot be computed for this study: {exc}")
    if not any(found[0]):
        return message_figure(title, why_none(done, objectives[0][0]))
    fig = go.Figure(layout=base_layout(
        f"{title}<br><sup>{_note(snap, found[0], len(done))}</sup>", xaxis_title="importance",
        xaxis_rangemode="tozero", height=max(300, 100 + 40 * max(map(len, found)))))
    for k, bars in enumerate(found):
        fig.add_trace(_bars(bars, objectives[k][0], visible=k == 0))
    if len(objectives) > 1:
        fig.update_layout(updatemenus=[menu([
            {"label": plain(name), "method": "update",
             "args": [{"visible": [j == k for j in range(len(objectives))]},
                      {"title.text": f"{title}<br><sup>{_note(snap, found[k], len(done))}</sup>"}]}
            for k, (name, _) in enumerate(objectives)], direction="down")])
    return fig


def why_none(done: list[TrialView], metric: str) -> str:
    """Why the completed trials ``done`` give no importance, and what will."""
    values = {_value(t, 0) for t in done}
    if len(values) == 1:
        return (f"No importance yet: all {len(done)} completed trials gave the same {metric} "
                f"({next(iter(values)):.6g}), so no parameter explains a difference. It appears "
                "once completed trials give different values.")
    if len({repr(sorted(t.params.items())) for t in done}) == 1:
        return (f"No importance yet: all {len(done)} completed trials ran the same parameters. "
                "It appears once trials with other parameters complete.")
    return (f"No importance yet: fANOVA found no parameter along which the {len(done)} completed "
            f"trials' {metric} varies (a parameter set in only some trials needs "
            f"{MIN_IMPORTANCE_TRIALS} of them). It appears as more trials complete.")


def _usable(snap: Snapshot) -> list[TrialView]:
    """Completed trials with parameters and a finite value for every objective, best first."""
    return [t for t in completed(snap) if t.params
            and all(v is not None and math.isfinite(v) for v in (t.values if t.values else [t.value]))]


@functools.lru_cache(maxsize=4)
def _activity(snap: Snapshot) -> tuple[list[TrialView], set[str], dict[tuple[str, ...], list[TrialView]]]:
    """The usable trials, the parameters every one of them has, and the
    others grouped by the trials that set them (see :func:`_conditional_groups`)."""
    done = _usable(snap)
    everywhere = set.intersection(*(set(t.params) for t in done)) if done else set()
    return done, everywhere, _conditional_groups(done, everywhere)


@functools.lru_cache(maxsize=16)
def scores(snap: Snapshot, objective: int = 0) -> tuple[Score, ...]:
    """The importance of each parameter for objective number ``objective``,
    least important first: those every trial has over all the (sampled)
    trials, each conditional one over the trials where it is set."""
    done, everywhere, groups = _activity(snap)
    direction = (snap.objectives[objective][1] if snap.objectives else snap.direction)
    found = _scored(sample(done, MAX_IMPORTANCE_TRIALS), sorted(everywhere), objective, direction,
                    conditional=False)
    for names, where in groups.items():
        if len(where) >= MIN_IMPORTANCE_TRIALS:
            # Scored with what else every one of those trials has, so its share is fair there.
            with_them = sorted(set.intersection(*(set(t.params) for t in where)))
            found += [s for s in _scored(sample(where, MAX_IMPORTANCE_TRIALS), with_them,
                                         objective, direction, conditional=True) if s.name in names]
    return tuple(sorted(found, key=lambda s: s.mean))


def _conditional_groups(done: list[TrialView], everywhere: set[str]) -> dict[tuple[str, ...], list[TrialView]]:
    """The parameters set in only some trials, grouped by the trials that set
    them (parameters set together are scored together): names -> trials."""
    where: dict[str, list[TrialView]] = {}
    for trial in done:
        for name in trial.params:
            if name not in everywhere:
                where.setdefault(name, []).append(trial)
    groups: dict[frozenset[int], list[str]] = {}
    for name, trials in where.items():
        groups.setdefault(frozenset(t.number for t in trials), []).append(name)
    return {tuple(names): where[names[0]] for names in groups.values()}


def _scored(trials: list[TrialView], names: list[str], objective: int,
            direction: Literal["maximize", "minimize"], conditional: bool) -> list[Score]:
    """fANOVA over ``trials`` and parameters ``names``: the mean and spread of
    each parameter's score over bootstrap resamples."""
    if len(trials) < MIN_IMPORTANCE_TRIALS or not names:
        return []
    resamples = RESAMPLES if len(trials) <= 60 else RESAMPLES_MANY
    runs = [run for seed in range(resamples)
            if (run := _fanova(trials, names, objective, direction, seed)) is not None]
    scored = sorted({n for run in runs for n in run})
    return [Score(n, float(np.mean([r.get(n, 0.0) for r in runs])),
                  float(np.std([r.get(n, 0.0) for r in runs])), len(trials), conditional)
            for n in scored]


def _bars(bars: tuple[Score, ...], objective: str, visible: bool) -> go.Bar:
    labels = [plain(s.name) + (f" (where set: {s.trials} trials)" if s.conditional else "")
              for s in bars]
    return go.Bar(
        x=[s.mean for s in bars], y=labels, orientation="h", name=plain(objective), visible=visible,
        marker_color=[CONDITIONAL_COLOUR if s.conditional else COMMON_COLOUR for s in bars],
        error_x={"type": "data", "array": [s.spread for s in bars], "color": "#333"},
        customdata=[s.spread for s in bars],
        hovertemplate="%{y}: %{x:.3f} ± %{customdata:.3f}<extra></extra>")


def _note(snap: Snapshot, bars: tuple[Score, ...], total: int) -> str:
    """The subtitle: trials used, what bars and whiskers are, and which bars
    come from only the trials where their parameter is set."""
    used = min(total, MAX_IMPORTANCE_TRIALS)
    used_text = f"{used} of {total}" if used < total else f"{total}"
    resamples = RESAMPLES if used <= 60 else RESAMPLES_MANY
    caution = "; few trials: read it as a rough hint" if total < 30 else ""
    note = (f"{used_text} completed trials; bars: mean of {resamples} bootstrap resamples, "
            f"whiskers: one standard deviation{caution}")
    partial = [s.name for s in bars if s.conditional]
    skipped = _too_rare(snap)
    if partial:
        note += (f"<br>light bars ({plain(', '.join(partial))}): set in only some trials, "
                 "scored on those trials alone")
    if skipped:
        note += (f"<br>not scored, set in fewer than {MIN_IMPORTANCE_TRIALS} completed trials: "
                 f"{plain(', '.join(skipped))}")
    return note


def _too_rare(snap: Snapshot) -> list[str]:
    return sorted(n for names, where in _activity(snap)[2].items()
                  if len(where) < MIN_IMPORTANCE_TRIALS for n in names)


def import_importance() -> None:
    """Import optuna.importance (it pulls scikit-learn in: a second, so only
    when drawn or warmed up), one thread at a time: a thread that imports a
    module another thread is importing can see it half-initialised."""
    with _IMPORTING:
        import optuna.importance  # noqa: F401


_IMPORTING = threading.Lock()


def _fanova(trials: list[TrialView], names: list[str], objective: int,
            direction: Literal["maximize", "minimize"], seed: int) -> dict[str, float] | None:
    """fANOVA importances of ``names`` on a bootstrap resample (the first run
    uses every trial once); None when its trials' values do not vary with
    the parameters (fANOVA's trees find nothing to split)."""
    import optuna

    import_importance()

    chosen = trials if seed == 0 else _resample(trials, objective, np.random.default_rng(seed))
    if len({_value(t, objective) for t in chosen}) < 2:
        return None
    frozen = [optuna.trial.create_trial(
        params={n: t.params[n] for n in names}, distributions={n: t.distributions[n] for n in names},
        value=_value(t, objective)) for t in chosen]
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created" line
    try:
        study = optuna.create_study(direction=direction)  # in memory: the store stays untouched
    finally:
        optuna.logging.set_verbosity(verbosity)
    study.add_trials(frozen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluator = optuna.importance.FanovaImportanceEvaluator(n_trees=16, seed=seed)
        try:
            found = optuna.importance.get_param_importances(study, evaluator=evaluator, normalize=True)
        except RuntimeError as exc:  # "Encountered zero total variance in all trees"
            if "zero total variance" in str(exc):
                return None
            raise
    return {name: float(score) for name, score in found.items() if math.isfinite(score)}


def _resample(trials: list[TrialView], objective: int, rng: np.random.Generator) -> list[TrialView]:
    """A bootstrap resample of ``trials`` whose values differ (a resample of
    equal values says nothing: among 4 trials it is drawn often); ``trials``
    when none is found."""
    for _ in range(20):
        chosen = [trials[i] for i in rng.integers(0, len(trials), len(trials))]
        if len({_value(t, objective) for t in chosen}) > 1:
            return chosen
    return trials


def _value(trial: TrialView, objective: int) -> float:
    value = (trial.values if trial.values else [trial.value])[objective]
    if value is None:
        raise RuntimeError("hpo internal error: a completed trial has its values")
    return value
