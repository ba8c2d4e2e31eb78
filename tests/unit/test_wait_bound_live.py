"""Issue 24, item 5 in the live controller: pending jobs past the policy's wait bound are
listed in the tick report with one WARNING line per tick (slurm/wait_bound.py), and the
history's Prometheus text counts them (``pipeswift_jobs_pending_over_wait_bound``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.model import ClusterView, Job, Node
from pipeswift_slurm.core.token import ProfileRequest, encode_profile
from pipeswift_slurm.policy import get_policy, wait_bound_of
from pipeswift_slurm.reports import queries as R
from pipeswift_slurm.reports.metrics import prometheus_text
from pipeswift_slurm.slurm.backends.sim import SimBackend, SimJob
from pipeswift_slurm.slurm.controller import Controller, ControllerSettings
from pipeswift_slurm.slurm.wait_bound import over_wait_bound
from pipeswift_slurm.store.history import Store

HOUR = 3600.0
ARGV = ("--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
        "--max-position-embeddings", "1024", "--micro-batch-size", "4", "--global-batch-size", "64",
        "--train-iters", "100000")
T0 = 1_700_000_000.0


def test_wait_bound_of_reads_the_policy_knob() -> None:
    assert wait_bound_of(get_policy("pipeswift", wait_bound_s=2 * HOUR)) == 2 * HOUR
    assert wait_bound_of(get_policy("fifo")) is None and wait_bound_of(get_policy("sjf")) is None


def test_over_wait_bound_lists_pending_jobs_past_the_bound_longest_first(caplog: pytest.LogCaptureFixture) -> None:
    now = T0 + 10 * HOUR
    jobs = (Job(1, "PENDING", T0 + 8 * HOUR), Job(2, "PENDING", T0), Job(3, "RUNNING", T0, start_time=T0 + HOUR),
            Job(4, "PENDING", T0 + 5 * HOUR), Job(5, "PENDING", T0),
            # requeued: ran 6 of its 10 hours since submission, queued 4 h in all
            Job(6, "PENDING", T0, restarts=1, ran_s=6 * HOUR))
    view = ClusterView(now, (Node("n1", 8),), jobs)
    with caplog.at_level(logging.WARNING):
        assert over_wait_bound(view, {1, 2, 3, 4, 6}, 3 * HOUR) == [2, 4, 6]  # 5 is not runnable
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "3 pending job(s) waited past the wait bound of 3.0 h" in warnings[0].message
    assert "(the longest 10.0 h)" in warnings[0].message
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert over_wait_bound(view, {1, 2, 4}, None) == []
        assert over_wait_bound(view, {1, 2, 4}, 11 * HOUR) == []
        assert over_wait_bound(view, {1, 2, 4}, 3 * HOUR, warn=False) == [2, 4]
    assert not caplog.records


def sim_cluster() -> SimBackend:
    """One node of 8 GPUs; three opted-in 8-GPU jobs submitted at T0, the first running."""
    backend = SimBackend(1, 8)
    comment = encode_profile(ProfileRequest(ARGV, None, world_size=8))
    for job_id in (1, 2, 3):
        backend.submit(SimJob(job_id, "j%d" % job_id, "alice", T0, comment, 1, 8, 48 * 3600))
    backend.now = T0
    assert [j.job_id for j in backend.schedule(T0)] == [1]
    return backend


@pytest.mark.parametrize("policy,over", [("pipeswift", [2, 3]), ("fifo", [])])
def test_tick_reports_and_warns_about_jobs_past_the_bound(policy: str, over: list[int],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    backend = sim_cluster()
    knobs = {"wait_bound_s": 2 * HOUR} if policy == "pipeswift" else {}
    controller = Controller(backend, get_policy(policy, **knobs), Estimator(CostModel(get_gpu_type("A100-80GB")), 8))
    backend.now = T0 + HOUR
    assert controller.tick().over_wait_bound == []
    backend.now = T0 + 3 * HOUR
    with caplog.at_level(logging.WARNING, logger="pipeswift_slurm.slurm.controller"):
        assert controller.tick().over_wait_bound == over
        assert controller.tick().over_wait_bound == over
    warnings = [r.message for r in caplog.records if "wait bound" in r.message]
    assert warnings == (["2 pending job(s) waited past the wait bound of 2.0 h (the longest 3.0 h): the load is"
                         " beyond what the bound allows (pipeswift report waits names them)"] * 2 if over else [])
    quiet = Controller(backend, get_policy(policy, **knobs), Estimator(CostModel(get_gpu_type("A100-80GB")), 8),
                       settings=ControllerSettings(warn_wait_bound=False))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeswift_slurm.slurm.controller"):
        assert quiet.tick().over_wait_bound == over
    assert not [r for r in caplog.records if "wait bound" in r.message]


def test_prometheus_counts_pending_jobs_past_the_bound(tmp_path: Path) -> None:
    backend = sim_cluster()
    store = Store.from_url(str(tmp_path / "h.sqlite"))
    controller = Controller(backend, get_policy("pipeswift", wait_bound_s=2 * HOUR),
                            Estimator(CostModel(get_gpu_type("A100-80GB")), 8), store)
    backend.now = T0 + 3 * HOUR
    controller.tick()
    text = prometheus_text(R.full_report(store, wait_bound_s=2 * HOUR))
    assert "pipeswift_jobs_pending_over_wait_bound 2\n" in text
    assert "# TYPE pipeswift_jobs_pending_over_wait_bound gauge" in text
    text = prometheus_text(R.full_report(store, wait_bound_s=4 * HOUR))
    assert "pipeswift_jobs_pending_over_wait_bound 0\n" in text
    backend.finish(1, T0 + 4 * HOUR)
    backend.schedule(T0 + 4 * HOUR)
    backend.now = T0 + 4 * HOUR
    controller.tick()
    rep = R.waits(store, wait_bound_s=2 * HOUR)
    assert rep.overall is not None and (rep.overall.n_over_bound, rep.overall.n_pending_over_bound) == (2, 1)
    store.engine.dispose()
