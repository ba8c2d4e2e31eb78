"""Learning from the site's runs (issue 25 item 5): the layout terms of the calibration
(``core/layout_fit.py``): shrinkage, the per-user bound, and the goal on a synthetic set."""

from __future__ import annotations

import itertools
import dataclasses
import math
import random
import statistics

import pytest

from pipeswift_slurm.core.calibration import Observation, fit_bias, lookup_bias
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.layout_fit import (DEFAULT_FEATURE_PRIOR_JOBS, USER_CAP_RUNS, fit_feature_terms,
                                             is_feature_key, layout_features, user_capped)
from pipeswift_slurm.core.model import ExecConfig

CLS = "gpt-<2B"
LEVELS = {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "mbs": [1, 2], "vp": [1, 2]}


def cfg(tp: int, pp: int, mbs: int = 1, vp: int = 1) -> ExecConfig:
    return ExecConfig(tp=tp, pp=pp, dp=1, micro_batch_size=mbs, num_micro_batches=8, vp=vp)


def obs(ratio: float, config: ExecConfig, user: str = "u", job_class: str = CLS) -> Observation:
    return Observation(job_class, 100.0, 100.0 * ratio, 0.0, user, layout_features(config))


def test_one_term_is_the_mean_shrunk_by_n_over_n_plus_k() -> None:
    rows = [(CLS, "u%d" % i, (("tp", 8),), math.log(1.5), 1.0) for i in range(4)]
    terms = fit_feature_terms(rows, {CLS: 0.0})
    assert terms["gpt-<2B tp=8"][0] == pytest.approx(math.log(1.5) * 4 / (4 + DEFAULT_FEATURE_PRIOR_JOBS))
    assert terms["gpt-<2B tp=8"][1] == 4


def test_layout_terms_separate_layouts_a_class_factor_cannot() -> None:
    """tp8 runs 1.5x slow, tp1 as predicted: one class factor would split the difference."""
    data = [obs(1.5, cfg(8, 1), "u%d" % (i % 5)) for i in range(20)] + \
        [obs(1.0, cfg(1, 8), "u%d" % (i % 5)) for i in range(20)]
    bias = {k: c.ratio for k, c in fit_bias(data, now=0.0, trim=0.0).items()}
    assert lookup_bias(bias, CLS, cfg(8, 1)) == pytest.approx(1.5, rel=0.08)
    assert lookup_bias(bias, CLS, cfg(1, 8)) == pytest.approx(1.0, rel=0.08)
    est = Estimator(None, 8, bias)  # type: ignore[arg-type]
    assert est.bias(CLS, cfg(8, 1)) / est.bias(CLS, cfg(1, 8)) > 1.35
    assert est.bias(CLS) == bias[CLS]  # without a layout: the class term alone


def test_own_layout_separates_users_recipes_from_pipeswifts_choices() -> None:
    """Half the jobs ask for mbs 1, half for mbs 2; each runs either its own layout (0.8x the
    prediction: a tuned recipe) or the other one (as predicted). Layout values alone see
    both layouts at 0.9x; only ``own`` tells a user's layout from pipeswift's choice."""
    a, b = cfg(2, 4), cfg(2, 4, mbs=2)
    grown = dataclasses.replace(a, dp=2 * a.dp)
    assert layout_features(grown, a)[-1] == ("own", 1) and layout_features(b, a)[-1] == ("own", 0)
    assert len(layout_features(b)) == 4  # no request known: no own feature
    data = [Observation(CLS, 100.0, 100.0 * (0.8 if ran is asked else 1.0), 0.0, "u%d" % (i % 5),
                        layout_features(ran, asked))
            for i in range(10) for asked in (a, b) for ran in (a, b)]
    bias = {k: c.ratio for k, c in fit_bias(data, now=0.0, trim=0.0).items()}
    assert lookup_bias(bias, CLS, b, a) / lookup_bias(bias, CLS, a, a) == pytest.approx(1.25, rel=0.08)
    assert lookup_bias(bias, CLS, b) / lookup_bias(bias, CLS, a) == pytest.approx(1.0, abs=0.01)


def test_observations_without_a_layout_fit_no_layout_term() -> None:
    fit = fit_bias([Observation(CLS, 100.0, 130.0, 0.0) for _ in range(10)], now=0.0)
    assert not [k for k in fit if is_feature_key(k)]


def test_user_cap_bounds_each_users_weight() -> None:
    assert user_capped(["a"] * 10 + ["b", ""], [1.0] * 12, cap=5.0) == [0.5] * 10 + [1.0, 1.0]


def test_one_user_cannot_move_a_class_beyond_their_share() -> None:
    """Three honest users run 5 jobs each as predicted; one user floods the class with
    100 runs claiming 3x: their weight is capped at USER_CAP_RUNS, so the class term moves
    at most their share of the evidence (and without the cap it would follow them)."""
    honest = [obs(1.0, cfg(2, 2), "h%d" % (i % 3)) for i in range(15)]
    flood = [obs(3.0, cfg(2, 2), "liar") for _ in range(100)]
    fit = fit_bias(honest + flood, now=0.0, trim=0.0)
    share = USER_CAP_RUNS / (15 + USER_CAP_RUNS + 5.0)  # capped weight / (n_eff + prior_jobs)
    assert fit[CLS].log_ratio <= share * math.log(3.0) + 1e-9
    uncapped = fit_bias(honest + [obs(3.0, cfg(2, 2), "liar%d" % i) for i in range(100)], now=0.0, trim=0.0)
    assert uncapped[CLS].log_ratio > 2 * fit[CLS].log_ratio
    term = lookup_bias({k: c.ratio for k, c in fit.items()}, CLS, cfg(2, 2))
    assert math.log(term) <= 2 * share * math.log(3.0)


def unseen_layout_errors(seed: int, runs: int = 20, sigma: float = 0.15) -> list[float]:
    """|corrected / true - 1| on the layouts of a class that none of its ``runs``
    finished runs used, under a layout-dependent truth: log error = class offset + one
    term per feature value (each N(0, sigma / 2)), plus 3 % run noise."""
    rng = random.Random(seed)
    terms = {(f, v): rng.gauss(0.0, sigma / 2) for f, vs in LEVELS.items() for v in vs}
    offset = rng.gauss(0.0, 0.2)
    layouts = list(itertools.product(*LEVELS.values()))

    def truth(layout: tuple[int, ...]) -> float:
        return offset + sum(terms[(f, v)] for f, v in zip(LEVELS, layout))

    seen = [rng.choice(layouts) for _ in range(runs)]
    data = [obs(math.exp(truth(l) + rng.gauss(0.0, 0.03)), cfg(*l), "u%d" % (i % 4)) for i, l in enumerate(seen)]
    bias = {k: c.ratio for k, c in fit_bias(data, now=0.0).items()}
    return [abs(lookup_bias(bias, CLS, cfg(*l)) / math.exp(truth(l)) - 1.0) for l in layouts if l not in seen]


def test_goal_unseen_layouts_within_10_percent_after_20_runs() -> None:
    """Issue 25's goal on a small synthetic set: after 20 finished runs of a class, its
    unseen layouts are predicted within 10 % (median over 10 seeds of the per-seed 90th
    percentile), where the class factor alone is off by more."""
    p90 = []
    for seed in range(1, 11):
        errs = sorted(unseen_layout_errors(seed))
        p90.append(errs[int(0.9 * (len(errs) - 1))])
    assert statistics.median(p90) <= 0.10



def test_simulate_learn_reports_and_improves_layouts_it_has_seen() -> None:
    """``simulate --learn`` under a truth that differs per layout shape (sigma 0.15): once a
    class has 20 finished runs, predictions of layouts it ran are closer to the truth than
    the cost model's; the figure for unseen layouts is reported beside it."""
    from pipeswift_slurm.sim.runner import RunSpec, run_comparison

    spec = RunSpec(synthetic_jobs=300, policies=("pipeswift",), shape_sigma=0.15, learn=True, seed=3)
    metrics = run_comparison(spec).metrics[0]
    seen = metrics["seen_layouts"]
    assert seen["jobs"] >= 50
    assert seen["median_learned"] < 0.5 * seen["median_model"]
    assert "unseen_layouts" in metrics
    off = run_comparison(RunSpec(synthetic_jobs=300, policies=("pipeswift",), shape_sigma=0.15, seed=3)).metrics[0]
    assert "seen_layouts" not in off


def test_a_window_can_start_from_what_the_site_measured_on_the_days_before(tmp_path) -> None:
    # learn_history_days: the same policy runs, learning, on the trace's days before the
    # window; the window's calibration starts fitted on those runs (their last end moved to
    # the window's start), so its first decisions already use what was measured.
    from pipeswift_slurm.sim.runner import RunSpec, run_comparison, site_history

    rng = random.Random(4)
    lines = ["job_id,submit_time_s,duration_s,num_gpus,user,cluster"]
    for i in range(120):
        lines.append("j%d,%d,%d,%d,u%d,vc" % (i, i * 10080, rng.randint(1800, 14400), rng.choice((1, 2, 4, 8)), i % 5))
    path = tmp_path / "two-weeks.csv"
    path.write_text("\n".join(lines) + "\n")
    spec = RunSpec(gpus=16, workload=str(path), start_day=7, window_days=7, policies=("pipeswift",), learn=True)
    assert site_history(spec, "pipeswift") == []
    warm = dataclasses.replace(spec, learn_history_days=7)
    history = site_history(warm, "pipeswift")
    assert len(history) > 20 and all(o.features for o in history)
    assert site_history(dataclasses.replace(warm, learn=False), "pipeswift") == []
    comp = run_comparison(warm)
    cal = comp.calibrators["pipeswift"]
    start_s = min(j.submit_s for j in comp.jobs)
    assert cal.observations[:len(history)] == [dataclasses.replace(o, end_time=o.end_time - max(
        h.end_time for h in history) + start_s) for o in history]
    first_fit_s = cal._installed[1][0]
    assert first_fit_s == start_s - 1.0
    cold = run_comparison(spec).calibrators["pipeswift"]
    assert cold._installed[1][0] > start_s  # a new install fits only once window jobs finished


def test_with_learn_report_s_the_simulation_learns_while_jobs_run() -> None:
    # learn_report_s: each job reaches the calibration that long after it started (the
    # launcher's report), not when it ends: the first fit comes sooner
    from pipeswift_slurm.sim.runner import RunSpec, run_comparison

    spec = RunSpec(gpus=16, synthetic_jobs=40, policies=("pipeswift",), learn=True)
    at_end = run_comparison(spec).calibrators["pipeswift"]
    reported = run_comparison(dataclasses.replace(spec, learn_report_s=600.0)).calibrators["pipeswift"]
    assert reported._installed[1][0] < at_end._installed[1][0]
