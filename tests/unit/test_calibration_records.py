"""Calibration learns only from what really ran (issue 28 item 7): the history holds the
config a running job runs with (from the controller's decision token, when the launcher
would accept it), a job that ran the launcher's own choice is recorded as unknown and
kept out of calibration, and jobs of the site's emulation partitions never feed it."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import text

from pipeswift_slurm.core.calibration import Observation, fit_bias
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.model import ClusterView, ExecConfig, Job, JobProfile, ModelShape, Node, TrainingPlan
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.slurm.calibrate import StoreCalibration
from pipeswift_slurm.slurm.config import load_config
from pipeswift_slurm.slurm.controller import TickReport
from pipeswift_slurm.slurm.recording import NO_DECISION, ran_config, record_tick
from pipeswift_slurm.store.history import Store
from pipeswift_slurm.store.queries import RunRecord

NODES = (Node("n1", 8, 0), Node("n2", 8, 0))
USER = ExecConfig(tp=1, pp=4, dp=2, micro_batch_size=1, num_micro_batches=16, num_nodes=1, gpus_per_node=8)
DECIDED = ExecConfig(tp=1, pp=4, dp=4, micro_batch_size=1, num_micro_batches=64, num_nodes=2, gpus_per_node=8)


def profile(job_class: str = "gpt-1b") -> JobProfile:
    shape = ModelShape(num_layers=24, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                       ffn_hidden_size=4096, kv_channels=64, num_query_groups=16)
    return JobProfile(shape=shape, plan=TrainingPlan(global_batch_size=256, train_iters=1000),
                      requested=USER, min_gpus=8, max_gpus=16, job_class=job_class)


def running16(job_id: int = 1, config=None, partition: str = "gpu") -> Job:
    """A job grown to 2 x 8 GPUs, running since t=100."""
    return Job(job_id, "RUNNING", 50.0, gpus=16, num_nodes=2, start_time=100.0, partition=partition,
               opted_in=True, config=config)


@pytest.fixture
def estimator() -> Estimator:
    return Estimator(CostModel(get_gpu_type("A100-80GB")), 8)


def record(store: Store, now: float, estimator: Estimator, *jobs: Job) -> None:
    prof = profile()
    report = TickReport(view=ClusterView(now=now, nodes=NODES, jobs=jobs))
    record_tick(store, report, {j.job_id: prof for j in jobs}, {j.job_id: ("pswift1;", prof, "") for j in jobs},
                get_policy("fifo"), estimator, dry_run=False)


def job_row(store: Store, job_id: int = 1) -> tuple:
    with store.engine.connect() as conn:
        return tuple(conn.execute(text("SELECT predicted_run_s, run_config, calibration_skip FROM jobs"
                                       " WHERE job_id = :j"), {"j": job_id}).one())


def test_a_job_started_without_a_decision_records_no_prediction_and_never_calibrates(estimator):
    """The launcher ran its own best config on 16 GPUs: the user's config's prediction
    (what the old record held) would teach a false bias."""
    store = Store.in_memory()
    record(store, 200.0, estimator, running16())
    assert job_row(store) == (None, None, NO_DECISION)
    record(store, 1300.0, estimator, dataclasses.replace(running16(), state="COMPLETED", end_time=1300.0))
    StoreCalibration(store).refit(1300.0, estimator)
    assert store.calibration() == {}


def test_a_valid_decision_records_the_prediction_for_the_decided_config(estimator):
    store = Store.in_memory()
    record(store, 200.0, estimator, running16(config=DECIDED))
    predicted, config, skip = job_row(store)
    assert (config, skip) == (DECIDED.short(), None)
    assert predicted == pytest.approx(estimator.cost.job_time_s(profile(), DECIDED))
    assert predicted != pytest.approx(estimator.cost.job_time_s(profile(), USER))


def test_a_decision_without_node_shape_takes_the_allocation(estimator):
    bare = dataclasses.replace(DECIDED, num_nodes=1, gpus_per_node=0)
    cfg, why = ran_config(running16(config=bare), profile())
    assert (cfg, why) == (DECIDED, "")


@pytest.mark.parametrize("config, needle", [
    (USER, "stale: 1x8 GPUs decided, 2x8 allocated"),  # a stale 8-GPU decision on a 16-GPU allocation
    (dataclasses.replace(DECIDED, num_micro_batches=63), "launcher refuses"),  # 63 x 4 != 256
])
def test_a_decision_the_launcher_would_refuse_is_not_what_ran(estimator, config, needle):
    store = Store.in_memory()
    record(store, 200.0, estimator, running16(config=config))
    predicted, run_config, skip = job_row(store)
    assert (predicted, run_config) == (None, None) and needle in skip


def test_the_record_follows_the_run_and_is_written_once(estimator):
    store = Store.in_memory()
    record(store, 200.0, estimator, running16())
    record(store, 260.0, estimator, running16(config=DECIDED))  # e.g. requeued and restarted as decided
    assert job_row(store)[1:] == (DECIDED.short(), None)


def _finished(store: Store, job_id: int, partition: str, predicted_s: float, run_s: float, end: float,
              user: str = "") -> None:
    job = Job(job_id, "COMPLETED", 0.0, gpus=8, start_time=end - run_s, end_time=end, partition=partition, user=user)
    with store.tick(end, "pipeswift") as tx:
        tx.save_snapshot(ClusterView(now=end, nodes=NODES, jobs=(job,)))
        tx.upsert_profile(job_id, "pswift1;", profile(), None)
        tx.set_runs({job_id: RunRecord(predicted_s, USER.short())})


def test_jobs_of_excluded_partitions_never_feed_calibration(estimator):
    """An emulated job sleeps prediction x 0.001: one of them moved a class to 0.569."""
    store = Store.in_memory()
    _finished(store, 1, "gpu", 1000.0, 1200.0, 2000.0)
    _finished(store, 2, "debug", 1000.0, 400.0, 2100.0)  # emulated at 0.4 x the prediction
    StoreCalibration(store, exclude_partitions=["debug"]).refit(2100.0, estimator)
    expected = fit_bias([Observation("gpt-1b", 1000.0, 1200.0, 2000.0)], now=2100.0)["gpt-1b"].ratio
    assert store.calibration()["gpt-1b"] == (pytest.approx(expected), 1)
    StoreCalibration(store).refit(2100.0, estimator)
    assert store.calibration()["gpt-1b"][1] == 2  # without the exclusion it would have learned from it


def _class_fit(mallory_jobs: int, mallory_run_s: float, estimator) -> tuple[float, int]:
    store = Store.in_memory()
    for i in range(15):  # three honest users, their runs as predicted
        _finished(store, i + 1, "gpu", 1000.0, 1000.0, 2000.0 + i, user="user%d" % (i % 3))
    for i in range(mallory_jobs):
        _finished(store, 100 + i, "gpu", 1000.0, mallory_run_s, 3000.0 + i, user="mallory")
    StoreCalibration(store).refit(5000.0, estimator)
    return store.calibration()["gpt-1b"]


def test_runs_timed_by_slurm_weigh_at_most_the_user_cap(estimator):
    """A job without a launcher's report is learned from by Slurm's elapsed time; one user's
    100 such runs (jobs that end early on purpose) weigh no more than their first few, so
    they cannot move the class every user of it is predicted with."""
    few, many = _class_fit(5, 400.0, estimator), _class_fit(100, 400.0, estimator)
    assert many[1] == 115 and many[0] == pytest.approx(few[0], abs=0.02)
    uncapped = fit_bias([Observation("gpt-1b", 1000.0, 1000.0, 2000.0 + i) for i in range(15)]
                        + [Observation("gpt-1b", 1000.0, 400.0, 3000.0 + i) for i in range(100)], now=5000.0)
    assert uncapped["gpt-1b"].ratio < few[0] - 0.1  # what the cap prevents


def test_a_run_far_from_its_prediction_is_not_learned_from(estimator):
    """Beyond ``measured.MEASURE_BOUND`` (3x either way) Slurm's elapsed time says more about
    the run's user (a job that ended at once, or ran far past its claim) than about the model."""
    assert _class_fit(5, 60.0, estimator) == _class_fit(0, 60.0, estimator)
    assert _class_fit(5, 10_000.0, estimator) == _class_fit(0, 60.0, estimator)
    assert _class_fit(5, 2_900.0, estimator)[1] == 20


def test_the_config_names_the_excluded_partitions(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[calibration]\nexclude_partitions = ['debug', 'emulate']\n")
    assert load_config(str(path)).calibration_exclude_partitions == ("debug", "emulate")
    path.write_text("[calibration]\nexclude_partitions = 'debug'\n")
    with pytest.raises(ValueError, match=r"\[calibration\] exclude_partitions must be a list"):
        load_config(str(path))


def test_the_controller_built_from_the_config_excludes_them(tmp_path, monkeypatch):
    from pipeswift_slurm.cli.common import Obj
    from pipeswift_slurm.cli.controller import build_controller
    from pipeswift_slurm.slurm import backends

    monkeypatch.setattr(backends, "get_backend", lambda name, partitions=None: object())
    path = tmp_path / "config.toml"
    path.write_text("[store]\nurl = '%s'\n[calibration]\nexclude_partitions = ['debug']\n" % (tmp_path / "h.sqlite"))
    controller = build_controller(load_config(str(path)), Obj(0, None))
    assert controller.calibration.exclude_partitions == {"debug"}
