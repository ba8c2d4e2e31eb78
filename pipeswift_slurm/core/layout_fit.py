"""Layout terms of the calibration: corrections per model class AND layout feature.

One factor per job class cannot correct an error that depends on the layout (the cost
model too slow for tp8 pp1, good from pp6). The calibration (``calibration.fit_bias``)
fits, after the class term, one term per (class, feature, value) from the residuals of
the observations that carry the layout that ran (the launcher's measured iteration time,
``submit/iterlog.py``):

    log(actual / predicted) = class term + tp term + pp term + mbs term + vp term + own term

Each term is a shrunk weighted mean of what the class term and the other terms leave,
refined by a few backfitting sweeps: term = sum(w r) / (sum(w) + k), i.e. the mean
shrunk toward 0 by n / (n + k), with ``k = DEFAULT_FEATURE_PRIOR_JOBS`` (2) pseudo-runs at
0, so a value seen in 2 runs moves half way and one seen in 20 runs 91 %. A layout
whose values were each seen in some runs of the class is predicted even when that
combination never ran (the goal: unseen layouts of a class within 10 %).

Influence of one user: within every term a user's runs weigh at most
``USER_CAP_RUNS`` (5) runs in all (``user_capped``), so one user's runs move a term by
at most their capped share of its evidence, cap / (n_eff + k), whatever they submit.

Keys: a term is stored as ``"<job_class> <feature>=<value>"`` beside the class keys
(``feature_keys``), in the same bias map and table. Pure.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from pipeswift_slurm.core.fmt import digits
from pipeswift_slurm.core.megatron_rules import same_layout

# tensor, pipeline, micro-batch, interleaving (virtual stages), and whether the layout is the
# job's user's own (1) or one pipeswift chose (0): users run tuned recipes the model cannot
# see, so their own layouts may run faster than predicted where its choices do not
FEATURES = ("tp", "pp", "mbs", "vp", "own")
DEFAULT_FEATURE_PRIOR_JOBS = 2.0
USER_CAP_RUNS = 5.0
BACKFIT_SWEEPS = 10


def layout_features(config: Any, requested: Any = None) -> tuple[tuple[str, int], ...]:
    """(feature, value) pairs of a config (anything with tp, pp, micro_batch_size, vp); with
    ``requested`` (the user's own config), ``own``: 1 when ``config`` is that layout at any
    GPU count (``megatron_rules.same_layout``), else 0."""
    out = (("tp", int(config.tp)), ("pp", int(config.pp)), ("mbs", int(config.micro_batch_size)),
           ("vp", int(getattr(config, "vp", 1) or 1)))
    if requested is None:
        return out
    return out + (("own", int(same_layout(config, requested))),)


def feature_key(job_class: str, feature: str, value: int) -> str:
    """Key of one layout term in the bias map, e.g. ``"gpt-<2B tp=4"``."""
    return "%s %s=%d" % (job_class, feature, value)


def feature_keys(job_class: str, features: Sequence[tuple[str, int]]) -> list[str]:
    """Keys of the layout terms that apply to a run of ``job_class`` with ``features``."""
    return [feature_key(job_class, f, v) for f, v in features]


def is_feature_key(key: str) -> bool:
    """Whether a bias-map key is a layout term (not a class or family)."""
    head, _, tail = key.rpartition(" ")
    feature, _, value = tail.partition("=")
    return bool(head) and feature in FEATURES and digits(value)


def layout_factor(bias: Mapping[str, float], job_class: str, config: Any, requested: Any = None) -> float:
    """Product of the layout terms' ratios that apply to ``config`` of a job that asked for
    ``requested`` (1 without any)."""
    if config is None or not bias:
        return 1.0
    out = 1.0
    for key in feature_keys(job_class, layout_features(config, requested)):
        out *= bias.get(key, 1.0)
    return out


def own_layout_measured(bias: Mapping[str, float], job_class: str) -> bool:
    """Whether the site has measured a run of ``job_class`` in its user's own layout (the
    class has an ``own=1`` term)."""
    return feature_key(job_class, "own", 1) in bias


def unmeasured_factor(requested: Any) -> Callable[[Any], float]:
    """The do-no-harm factor of a class whose users' layouts the site has not measured yet,
    where the site asks for that first (``[calibration] own_layout_first``): the user's
    layout (``requested``, at any GPU count) counts as predicted, every other as infinitely
    slower, so ``planner.keep_user_layout`` keeps the user's layout wherever it is valid
    (resizes in it stay open) until a run in it was measured. Without that run the learned
    terms cannot tell how the user's layout really runs beside the model's choice."""
    return lambda config: 1.0 if same_layout(config, requested) else math.inf


def layout_measured(bias: Mapping[str, float], job_class: str, config: Any, requested: Any) -> bool:
    """Whether the site measured what ``config`` of a ``job_class`` job that asked for
    ``requested`` is made of: it is the user's layout, or the class has a learned term for
    each of its layout features, ``own=0`` included (a run in a layout pipeswift chose)."""
    return bool(same_layout(config, requested)) or all(
        key in bias for key in feature_keys(job_class, layout_features(config, requested)))


def measured_factor(bias: Mapping[str, float], job_class: str, requested: Any) -> Callable[[Any], float]:
    """The do-no-harm factor of a job that may not explore (``exploration_holds``): the
    learned ``layout_factor`` of a measured layout (``layout_measured``), and infinitely
    slower for any other, so ``planner.keep_user_layout`` keeps the user's layout rather
    than bet on a layout the site has not measured yet."""
    return lambda config: layout_factor(bias, job_class, config, requested) \
        if layout_measured(bias, job_class, config, requested) else math.inf


def exploration_holds(jobs: Sequence[tuple[int, str, bool, bool]]) -> frozenset[int]:
    """The pending jobs that may run only measured layouts (``measured_factor``) while their
    class explores one the site has not measured (``[calibration] own_layout_first``): until
    a run in such a layout was measured, the learned terms cannot tell how it runs beside
    the users' layouts, so at most one job of a class bets on one at a time. A class with
    such a run in flight holds every pending job; otherwise its first pending job may
    explore and the others are held.

    Args:
        jobs: (job id, job class, running, exploring: runs a layout not measured, by
            ``layout_measured``) of the jobs the controller manages, pending ones in queue
            order (first submitted first).
    """
    taken = {job_class for _, job_class, running, exploring in jobs if running and exploring}
    held = set()
    for job_id, job_class, running, _ in jobs:
        if not running:
            if job_class in taken:
                held.add(job_id)
            taken.add(job_class)  # the class's first pending job explores; the rest wait
    return frozenset(held)


def user_capped(users: Sequence[str], weights: Sequence[float], cap: float = USER_CAP_RUNS) -> list[float]:
    """Weights scaled so that each user's total is at most ``cap`` ('' = unknown user,
    left as it is)."""
    total: dict[str, float] = {}
    for user, w in zip(users, weights):
        total[user] = total.get(user, 0.0) + w
    return [w * (min(1.0, cap / total[u]) if u and total[u] > 0 else 1.0) for u, w in zip(users, weights)]


def fit_feature_terms(rows: Sequence[tuple[str, str, tuple[tuple[str, int], ...], float, float]],
                      class_log: Mapping[str, float], *, prior_jobs: float = DEFAULT_FEATURE_PRIOR_JOBS,
                      user_cap: float = USER_CAP_RUNS, sweeps: int = BACKFIT_SWEEPS
                      ) -> dict[str, tuple[float, int, float]]:
    """The layout terms of every class, by backfitting shrunk means (module docstring).

    Args:
        rows: (job_class, user, features, log(actual / predicted), decay weight) of the
            runs that carry their layout.
        class_log: the fitted class term per job class (log ratio; 0 when absent).
        prior_jobs: k, pseudo-runs at 0 in every term.
        user_cap: most weight one user has in one term.
        sweeps: backfitting sweeps.

    Returns:
        key -> (log ratio, runs, effective weight) of every term with data.
    """
    if prior_jobs < 0:
        raise ValueError("prior_jobs must be >= 0, got %r" % prior_jobs)
    terms: dict[str, float] = {}
    members: dict[str, list[int]] = {}
    for i, (job_class, _user, features, _x, _w) in enumerate(rows):
        for key in feature_keys(job_class, features):
            members.setdefault(key, []).append(i)
    weights: dict[str, list[float]] = {
        key: user_capped([rows[i][1] for i in idx], [rows[i][4] for i in idx], user_cap)
        for key, idx in members.items()}
    keys_of = [feature_keys(r[0], r[2]) for r in rows]
    for _ in range(max(1, sweeps)):
        for key in sorted(members):
            num = den = 0.0
            for i, w in zip(members[key], weights[key]):
                others = sum(terms.get(k, 0.0) for k in keys_of[i] if k != key)
                num += w * (rows[i][3] - class_log.get(rows[i][0], 0.0) - others)
                den += w
            terms[key] = num / (den + prior_jobs) if den + prior_jobs > 0 else 0.0
    return {key: (terms[key], len(members[key]), sum(weights[key])) for key in members
            if math.isfinite(terms[key])}
