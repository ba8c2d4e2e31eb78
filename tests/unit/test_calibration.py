"""Calibration maths (outliers, decay, few samples, family fallback), the online
calibrator's un-calibration of predictions, and a small simulator run that learns."""

from __future__ import annotations

import logging
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeswift_slurm.core.calibration import (
    ClassBias,
    Observation,
    OnlineCalibrator,
    bias_map,
    decay_weight,
    family_key,
    family_of,
    fit_bias,
    lookup_bias,
    report_rows,
    trimmed_mean,
    valid_observations,
)
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.sim.engine import JobRecord, SimSettings, Simulation
from pipeswift_slurm.sim.workload import Conversion, build_workload, synthetic_trace

DAY_S = 86400.0


def obs(ratio: float, n: int = 1, job_class: str = "gpt-<2B", end: float = 0.0, predicted: float = 1000.0):
    return [Observation(job_class, predicted, predicted * ratio, end) for _ in range(n)]


# ---------------------------------------------------------------- fit_bias

def test_constant_ratio_is_recovered_with_enough_jobs():
    fit = fit_bias(obs(1.3, 200), now=0.0)
    cb = fit["gpt-<2B"]
    assert cb.raw_log_ratio == pytest.approx(math.log(1.3))
    assert cb.ratio == pytest.approx(1.3, abs=0.01)
    assert cb.n_jobs == 200 and cb.confidence == pytest.approx(200 / 205)
    assert fit_bias(obs(1.3, 200), now=0.0, prior_jobs=0)["gpt-<2B"].ratio == pytest.approx(1.3)


def test_one_wild_outlier_among_30_barely_moves_it():
    clean = fit_bias(obs(1.3, 30), now=0.0)["gpt-<2B"]
    dirty = fit_bias(obs(1.3, 30) + obs(100.0), now=0.0)["gpt-<2B"]
    assert dirty.raw_log_ratio == pytest.approx(math.log(1.3))  # trimmed away entirely
    assert dirty.ratio == pytest.approx(clean.ratio, rel=0.01)
    plain = fit_bias(obs(1.3, 30) + obs(100.0), now=0.0, trim=0.0)["gpt-<2B"]
    assert plain.ratio > 1.4  # what an untrimmed mean would have done


def test_recent_observations_beat_old_ones_of_another_ratio():
    old = obs(2.0, 40, end=0.0)
    recent = obs(1.0, 20, end=10 * DAY_S)
    decayed = fit_bias(old + recent, now=10 * DAY_S, half_life_s=DAY_S)["gpt-<2B"]
    assert decayed.ratio == pytest.approx(1.0, abs=0.02)
    assert decayed.n_eff == pytest.approx(20 + 40 * 2 ** -10)
    undecayed = fit_bias(old + recent, now=10 * DAY_S, half_life_s=math.inf)["gpt-<2B"]
    assert undecayed.ratio > 1.5


def test_one_sample_shrinks_strongly_toward_one():
    cb = fit_bias(obs(2.0), now=0.0, prior_jobs=5)["gpt-<2B"]
    assert cb.confidence == pytest.approx(1 / 6)
    assert cb.ratio == pytest.approx(2.0 ** (1 / 6))
    assert cb.ratio < 1.15
    two = fit_bias(obs(2.0, 2), now=0.0, prior_jobs=5)["gpt-<2B"]
    assert cb.ratio < two.ratio < 1.25


def test_bad_inputs_are_skipped_and_counted(caplog):
    bad = [Observation("gpt-<2B", 0.0, 10.0, 0.0), Observation("gpt-<2B", 10.0, -1.0, 0.0),
           Observation("gpt-<2B", float("nan"), 10.0, 0.0), Observation("gpt-<2B", 10.0, math.inf, 0.0),
           Observation("", 10.0, 10.0, 0.0), Observation("gpt-<2B", 10.0, 10.0, float("nan")),
           Observation("gpt-<2B", None, 10.0, 0.0)]  # type: ignore[arg-type]
    kept, skipped = valid_observations(bad + obs(1.3, 3))
    assert skipped == 7 and len(kept) == 3
    with caplog.at_level(logging.WARNING, logger="pipeswift_slurm.core.calibration"):
        fit = fit_bias(bad + obs(1.3, 3), now=0.0)
    assert "skipped 7 invalid" in caplog.text
    assert fit["gpt-<2B"].n_jobs == 3
    assert fit_bias(bad, now=0.0) == {}


def test_family_fallback_for_classes_with_few_jobs():
    data = obs(1.3, 100, job_class="gpt-<2B") + obs(1.0, 1, job_class="gpt-<8B") + obs(1.0, 1, job_class="llama-<80B")
    fit = fit_bias(data, now=0.0)
    assert family_of("gpt-swiglu-gqa-<80B") == "gpt-swiglu-gqa" and family_of("gpt->200B") == "gpt"
    assert family_of("my-team-class") == "my-team-class"
    # one job at 1.0 in a family that runs at 1.3: stays near the family, not at 1.0
    assert fit["gpt-<8B"].prior_log_ratio == pytest.approx(fit["gpt-<2B"].raw_log_ratio * 100 / 105)
    assert fit["gpt-<8B"].ratio > 1.2
    # the well-observed class is not pulled by its sparse sibling's family estimate
    assert fit["gpt-<2B"].ratio == pytest.approx(1.3, abs=0.02)
    # a class alone in its family shrinks toward 1
    assert fit["llama-<80B"].prior_log_ratio == 0.0 and fit["llama-<80B"].ratio == pytest.approx(1.0)
    bias = bias_map(fit)
    assert family_key("gpt") in bias
    assert lookup_bias(bias, "gpt-<80B") == pytest.approx(fit[family_key("gpt")].ratio)  # unseen class
    assert lookup_bias(bias, "gpt-<2B") == bias["gpt-<2B"]
    assert lookup_bias(bias, "bert-<2B") == 1.0
    rows = report_rows(fit)
    assert [r["job_class"] for r in rows][-2:] == ["gpt-*", "llama-*"]
    assert rows[0]["bias_pct"] == pytest.approx(100 * (fit["gpt-<2B"].ratio - 1))


def test_trimmed_mean_limits_and_knob_checks():
    assert trimmed_mean([1.0, 2.0, 6.0], [1.0, 1.0, 2.0], 0.0) == pytest.approx(15 / 4)
    assert trimmed_mean([1.0, 2.0, 9.0], [1.0, 1.0, 1.0], 0.499) == pytest.approx(2.0)
    assert decay_weight(-5.0, 10.0) == 1.0 and decay_weight(10.0, 10.0) == 0.5
    with pytest.raises(ValueError):
        trimmed_mean([1.0], [1.0], 0.5)
    with pytest.raises(ValueError):
        fit_bias([], now=0.0, half_life_s=0.0)
    with pytest.raises(ValueError):
        fit_bias([], now=0.0, prior_jobs=-1)


@settings(max_examples=200, deadline=None)
@given(ratios=st.lists(st.floats(0.05, 20.0), min_size=1, max_size=40),
       ages=st.lists(st.floats(0.0, 30 * DAY_S), min_size=40, max_size=40),
       trim=st.floats(0.0, 0.45), prior=st.floats(0.0, 20.0), half_life=st.floats(3600.0, 30 * DAY_S))
def test_fitted_ratio_lies_between_observed_ratios_and_one(ratios, ages, trim, prior, half_life):
    now = 30 * DAY_S
    data = [Observation("gpt-<2B", 100.0, 100.0 * r, now - a) for r, a in zip(ratios, ages)]
    cb = fit_bias(data, now=now, half_life_s=half_life, trim=trim, prior_jobs=prior)["gpt-<2B"]
    lo, hi = min(1.0, min(ratios)), max(1.0, max(ratios))
    assert lo * (1 - 1e-9) <= cb.ratio <= hi * (1 + 1e-9)
    assert 0.0 <= cb.confidence <= 1.0


# ---------------------------------------------------------------- OnlineCalibrator

def _record(job_id: int, start: float, end, predicted: float, job_class: str = "gpt-<2B", restarts: int = 0):
    rec = JobRecord(job_id, "j%d" % job_id, "u", "gpt-1.3b", job_class, "", 0.0, 8)
    rec.run_started_s, rec.end_s, rec.predicted_run_s, rec.restarts = start, end, predicted, restarts
    return rec


def test_online_calibrator_divides_by_the_bias_in_force_at_start(cost):
    base = Estimator(cost, 8)
    cal = OnlineCalibrator(base, refit_every=1, prior_jobs=0.0, half_life_s=math.inf)
    assert cal.update([_record(1, 0.0, 130.0, 100.0)], now=130.0)  # predicted by the base estimator
    assert cal.estimator().bias("gpt-<2B") == pytest.approx(1.3)
    # started after the install: predicted 100 x 1.3 = 130, really took 130 -> still 1.3, not 1.0
    assert cal.update([_record(2, 200.0, 330.0, 130.0)], now=330.0)
    assert cal.observations[-1].predicted_run_s == pytest.approx(100.0)
    assert cal.fit["gpt-<2B"].ratio == pytest.approx(1.3)
    # started in the very tick of the install (the refit applies from the next tick): the old bias
    assert cal.bias_in_force("gpt-<2B", 130.0) == 1.0
    assert cal.bias_in_force("gpt-<2B", 130.5) == pytest.approx(1.3)


def test_online_calibrator_learns_only_from_finished_jobs_once(cost):
    cal = OnlineCalibrator(Estimator(cost, 8), refit_every=2)
    running = _record(1, 0.0, None, 100.0)
    later = _record(2, 0.0, 500.0, 100.0)  # finishes after "now": not known yet
    requeued = _record(3, 0.0, 50.0, 100.0, restarts=1)
    assert not cal.update([running, later, requeued], now=100.0)
    assert cal.observations == [] and cal.skipped == 1
    assert not cal.update([running, later, requeued], now=600.0)  # later counted once, no refit yet
    assert len(cal.observations) == 1 and cal.skipped == 1
    assert cal.estimator() is cal.base


def test_online_calibrator_with_report_s_learns_from_a_running_job_once_its_report_is_due(cost):
    # report_s: the launcher's iteration-time report reaches the calibration report_s after
    # the run started; the simulator knows the run's true time (run_true_s) at its start
    cal = OnlineCalibrator(Estimator(cost, 8), refit_every=1, prior_jobs=0.0, half_life_s=math.inf, report_s=300.0)
    running = _record(1, 1000.0, None, 100.0)
    running.run_true_s = 150.0
    requeued = _record(2, 1000.0, None, 100.0, restarts=1)
    requeued.run_true_s = 50.0
    waiting = _record(3, 0.0, None, 100.0)  # not started: no run time yet
    assert not cal.update([running, requeued, waiting], now=1299.0)
    assert cal.update([running, requeued, waiting], now=1300.0)
    assert [(o.actual_run_s, o.end_time) for o in cal.observations] == [(150.0, 1300.0)]
    assert cal.fit["gpt-<2B"].ratio == pytest.approx(1.5)
    running.end_s = 1160.0
    assert not cal.update([running], now=2000.0) and len(cal.observations) == 1  # once per job
    at_end = OnlineCalibrator(Estimator(cost, 8), refit_every=1)  # report_s None: only at the end
    unfinished = _record(4, 1000.0, None, 100.0)
    unfinished.run_true_s = 150.0
    assert not at_end.update([unfinished], now=10_000.0) and at_end.observations == []


def test_online_calibrator_keeps_base_bias_for_unseen_classes(cost):
    base = Estimator(cost, 8, bias={"gpt-<80B": 0.9})
    cal = OnlineCalibrator(base, refit_every=1)
    cal.observe(_record(1, 0.0, 100.0, 90.0, job_class="gpt-<80B"))  # base predicted 0.9 x 100
    cal.refit(100.0)
    assert cal.observations[0].predicted_run_s == pytest.approx(100.0)
    assert cal.estimator().bias("gpt-<2B") == 1.0
    assert isinstance(cal.fit["gpt-<80B"], ClassBias)


def test_simulation_learns_the_bias_of_a_biased_class(cost):
    gpus, gpn = 16, 8
    rows = synthetic_trace(48, gpus, 0.9, seed=7)
    conv = Conversion(cost, gpus, gpn, seed=7, class_bias=(("gpt-<2B", 1.3),), noise_sigma=0.05)
    jobs = build_workload(rows, conv)
    assert sum(j.profile.job_class == "gpt-<2B" for j in jobs) >= 10
    base = Estimator(cost, gpn)
    cal = OnlineCalibrator(base, refit_every=3)
    sim = Simulation(jobs, get_policy("pipeswift"), base, cost, SimSettings(2, gpn), calibrator=cal)
    peeked = []
    sim.on_tick = lambda now, report: peeked.extend(  # every observation is of a job already finished
        o for o in cal.observations if sim.records[_job_of(sim, o)].end_s is None)
    sim.run()
    assert not peeked and cal.refits >= 3
    learned = sim.controller.estimator.bias("gpt-<2B")
    assert abs(math.log(learned / 1.3)) < 0.5 * math.log(1.3)  # moved more than half way to the truth
    assert sim.controller.estimator.bias("gpt-<0.5B") == pytest.approx(1.0, abs=0.05)


def _job_of(sim: Simulation, o: Observation) -> int:
    return next(r.job_id for r in sim.records.values() if r.end_s == o.end_time and r.job_class == o.job_class)
