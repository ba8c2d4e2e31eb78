"""Issue 23, claims meet reality: finished jobs' real run times feed a per-user correction
(``slurm/calibrate.user_factors``), so a user whose jobs run longer than claimed loses the
advantage: their predictions are multiplied by the factor (never below 1, shrunk toward 1
with few jobs), then kept within each job's own time limit (``within_time_limit``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sqlalchemy import text

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.model import Job
from pipeswift_slurm.slurm.calibrate import (USER_PRIOR_JOBS, USER_TOLERANCE, OnlineCalibration, StoreCalibration,
                                             user_factor_of, user_factors)
from pipeswift_slurm.slurm.limits import within_time_limit
from pipeswift_slurm.store.history import Store

CLS = "gpt-<0.5B"


def runs(user: str, ratios: list[float], predicted_s: float = 1000.0) -> list[tuple[str, str, float, float]]:
    return [(user, CLS, predicted_s, predicted_s * r) for r in ratios]


def test_a_user_whose_jobs_run_as_claimed_keeps_1() -> None:
    assert user_factors(runs("ann", [1.0, 1.2, 0.9, 1.1] * 10), {}) == {}


def test_a_liar_gets_the_ratio_shrunk_by_few_jobs() -> None:
    one = user_factors(runs("eve", [1000.0]), {})["eve"]
    assert one == pytest.approx(math.exp(math.log(1000 / USER_TOLERANCE) / (1 + USER_PRIOR_JOBS)))
    many = user_factors(runs("eve", [1000.0] * 50), {})["eve"]
    assert 1 < one < many < 1000 and many == pytest.approx((1000 / USER_TOLERANCE) ** (50 / 52))


def test_never_below_1_and_early_ends_do_not_dilute_the_record() -> None:
    """Jobs that end at once (claiming 1000 s, ending after 1 s) neither lower the factor
    below 1 nor wash out the lies: they are no evidence."""
    assert user_factors(runs("bob", [0.001] * 20), {}) == {}
    lies = user_factors(runs("eve", [100.0] * 3), {})["eve"]
    assert user_factors(runs("eve", [100.0] * 3 + [0.001] * 100), {})["eve"] == lies


def test_the_class_bias_is_taken_out_first() -> None:
    """Every user's jobs of a class running 2x the cost model is the class's bias, not a lie."""
    assert user_factors(runs("ann", [2.0] * 10), {CLS: 2.0}) == {}
    assert "ann" in user_factors(runs("ann", [2.0] * 10), {})


def _profile():  # type: ignore[no-untyped-def]
    return profile_from_argv(["--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16",
                              "--seq-length", "1024", "--global-batch-size", "64", "--micro-batch-size", "4",
                              "--train-iters", "1000"], world_size=8)


def test_the_factor_composes_with_the_time_limit_cap() -> None:
    est = Estimator(CostModel(get_gpu_type("A100-80GB")), 8)
    profile = _profile()
    base_s = est.run_time_s(profile, profile.requested)
    no_limit = Job(1, "PENDING", 0.0, gpus=8, user="eve")
    assert within_time_limit(profile, no_limit, est, 10.0).run_time_factor == 10.0
    assert within_time_limit(profile, no_limit, est, 0.5).run_time_factor == 1.0  # never a reward
    limited = Job(1, "PENDING", 0.0, gpus=8, user="eve", time_limit_s=int(base_s * 3))
    capped = within_time_limit(profile, limited, est, 10.0)
    assert est.run_time_s(capped, profile.requested) == pytest.approx(limited.time_limit_s)


def test_store_calibration_reads_each_users_finished_jobs(tmp_path: Path) -> None:
    store = Store.from_url(str(tmp_path / "h.sqlite"))
    rows = [(i, "eve", 100.0, 10_000.0, None, "gpu") for i in range(1, 6)]
    rows += [(i, "ann", 100.0, 100.0, None, "gpu") for i in range(6, 11)]
    rows += [(11, "bob", 100.0, 10_000.0, "config unknown", "gpu"), (12, "bob", 100.0, 10_000.0, None, "emul")]
    with store.engine.begin() as conn:
        for job_id, user, predicted, run, skip, partition in rows:
            conn.execute(text('INSERT INTO jobs (job_id, "user", state, job_class, predicted_run_s, run_s, end_time,'
                              ' calibration_skip, partition) VALUES (:j, :u, \'COMPLETED\', :c, :p, :r, :e, :s, :pa)'),
                         dict(j=job_id, u=user, c=CLS, p=predicted, r=run, e=1000.0 + job_id, s=skip, pa=partition))
    calibration = StoreCalibration(store, exclude_partitions=("emul",))
    assert user_factor_of(calibration, "eve") == pytest.approx((100 / USER_TOLERANCE) ** (5 / 7))
    assert user_factor_of(calibration, "ann") == 1.0 and user_factor_of(calibration, "bob") == 1.0
    assert user_factor_of(OnlineCalibration(None, dict), "eve") == 1.0  # type: ignore[arg-type]
    assert user_factor_of(None, "eve") == 1.0


def test_jobs_stopped_at_their_time_limit_count_against_their_user(tmp_path: Path) -> None:
    """A liar's jobs that claim 100 s and run out a 10,000 s limit end in TIMEOUT, not
    COMPLETED: they must still cost the liar (issue 23: claims that lie cost the liar)."""
    store = Store.from_url(str(tmp_path / "h.sqlite"))
    with store.engine.begin() as conn:
        for job_id in range(1, 6):
            conn.execute(text('INSERT INTO jobs (job_id, "user", state, job_class, predicted_run_s, run_s, end_time,'
                              ' partition) VALUES (:j, :u, \'TIMEOUT\', :c, 100.0, 10000.0, :e, \'gpu\')'),
                         dict(j=job_id, u="mallory", c=CLS, e=1000.0 + job_id))
    assert user_factor_of(StoreCalibration(store), "mallory") == pytest.approx((100 / USER_TOLERANCE) ** (5 / 7))


@pytest.mark.parametrize("state", ["FAILED", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL"])
def test_a_liar_cannot_escape_the_correction_by_how_the_job_ends(tmp_path: Path, state: str) -> None:
    """A job that claims 100 s, runs 10,000 s and then fails, is cancelled by its user just
    before its limit or runs out of memory showed its claim was low all the same."""
    store = Store.from_url(str(tmp_path / "h.sqlite"))
    with store.engine.begin() as conn:
        for job_id in range(1, 6):
            conn.execute(text('INSERT INTO jobs (job_id, "user", state, job_class, predicted_run_s, run_s, end_time,'
                              ' partition) VALUES (:j, :u, :st, :c, 100.0, 10000.0, :e, \'gpu\')'),
                         dict(j=job_id, u="mallory", st=state, c=CLS, e=1000.0 + job_id))
    assert user_factor_of(StoreCalibration(store), "mallory") == pytest.approx((100 / USER_TOLERANCE) ** (5 / 7))
