"""``pipeswift explain JOBID`` from a history written through Store.tick (the controller's
shape): pending, running, finished, not-opted-in and unknown jobs. Candidate configs and
their predicted run times are checked against the planner and estimator called directly."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from pipeswift_slurm.cli.main import pipeswift
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.fmt import duration
from pipeswift_slurm.reports.explain import UnknownJob, explain_job
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.model import ClusterView, Decision, Job, Node
from pipeswift_slurm.reports.render import explain_text
from pipeswift_slurm.store.history import CalibrationEntry, Store
from pipeswift_slurm.core.token import ProfileRequest, encode_profile

ARGV = (
    "--num-layers",
    "24",
    "--hidden-size",
    "2048",
    "--num-attention-heads",
    "16",
    "--seq-length",
    "2048",
    "--max-position-embeddings",
    "2048",
    "--global-batch-size",
    "512",
    "--bf16",
    "--train-iters",
    "1000",
)
T0 = 1_700_000_000.0
NODES = tuple(Node("n%d" % i, 8) for i in range(4))  # 32 GPUs, 8 per node
BIAS = 1.25
GPU = get_gpu_type("A100-80GB")


def _profile():
    return profile_from_argv(ARGV, world_size=8, gpu_range=(4, 16))  # class derived: gpt-<2B


def _estimator():
    return Estimator(CostModel(GPU), 8, {_profile().job_class: BIAS})


def _comment():
    return encode_profile(ProfileRequest(ARGV, (4, 16), job_class="gpt-1b", world_size=8))


def _job(job_id, state, **kw):
    base = dict(
        gpus=8, user="alice", name="train%d" % job_id, partition="gpu", opted_in=True, comment=_comment()
    )
    base.update(kw)
    return Job(job_id, state, T0, **base)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """Jobs 1 (pending), 2 (running), 3 (finished), 4 (pending, not opted in)."""
    path = tmp_path_factory.mktemp("explain") / "pipeswift.sqlite"
    store = Store.from_url(str(path))
    est = _estimator()
    chosen = est.best(_profile(), 16).config
    ticks = [
        (
            T0 + 60,
            [
                _job(1, "PENDING"),
                _job(2, "PENDING"),
                _job(3, "RUNNING", start_time=T0 + 30),
                _job(4, "PENDING", opted_in=False, comment=""),
            ],
        ),
        (
            T0 + 600,
            [
                _job(1, "PENDING", state_reason="Resources"),
                _job(2, "RUNNING", start_time=T0 + 500),
                _job(3, "COMPLETED", start_time=T0 + 30, end_time=T0 + 550),
                _job(4, "PENDING", opted_in=False, comment=""),
            ],
        ),
    ]
    for i, (now, jobs) in enumerate(ticks):
        with store.tick(now, "pipeswift") as tx:
            tx.save_snapshot(ClusterView(now, NODES, tuple(jobs)))
            for job in jobs:
                if job.opted_in and not tx.profile_texts([job.job_id]):
                    tx.upsert_profile(job.job_id, job.comment, _profile())
            if i == 0:
                tx.set_predicted_runs({3: 400.0})
                tx.record_decisions(
                    [
                        Decision(
                            1,
                            config=chosen,
                            site_factor=5000,
                            reason="wait for 16 GPUs",
                            predicted_start_s=T0 + 3600,
                            predicted_end_s=T0 + 9000,
                        ),
                        Decision(
                            2,
                            config=est.best(_profile(), 8).config,
                            site_factor=6000,
                            reason="start now on 8 GPUs",
                            predicted_start_s=now,
                        ),
                    ],
                    {1: True, 2: True},
                )
            else:
                tx.set_predicted_runs({2: 5000.0})
                tx.record_decisions(
                    [
                        Decision(
                            1,
                            site_factor=7000,
                            reason="queued (rank 1)",
                            predicted_start_s=T0 + 4000,
                            predicted_end_s=T0 + 9400,
                        )
                    ],
                    {1: True},
                )
    store.save_calibration([CalibrationEntry(_profile().job_class, 20, math.log(BIAS), T0)])
    store.engine.dispose()
    return str(path), chosen


def explain(path, job_id, **kw):
    return explain_job(Store.from_url(path), job_id, GPU, **kw)


def test_pending_job(history):
    path, chosen = history
    e = explain(path, 1)
    assert e.state == "PENDING" and e.state_reason == "Resources"
    assert e.summary.startswith("pending (Resources), waiting for")
    assert e.wait_s == pytest.approx(600.0)  # last tick - submit
    assert (e.predicted_start_s, e.predicted_end_s) == (T0 + 4000, T0 + 9400)  # the latest decision's
    assert e.chosen_config == chosen.short() and e.chosen_applied is True
    assert "wait for 16 GPUs" in e.why and "queued (rank 1)" in e.why
    assert e.n_decisions == 2 and e.gpu_range == (4, 16) and e.gpus_per_node == 8


def test_candidates_are_the_planners_best_per_gpu_count(history):
    path, chosen = history
    e = explain(path, 1, top=20)
    profile, est = _profile(), _estimator()
    best, dropped = {}, set()
    for gpus in range(4, 17):
        found = est.option(profile, gpus)  # the counts the policy may choose (do no harm across counts)
        if found is not None:
            best[found[0].short()] = (gpus, found[1])
        elif est.best(profile, gpus) is not None:
            dropped.add(est.best(profile, gpus).config.short())
    listed = {c.config: c for c in e.candidates}
    assert not dropped & set(listed) - {chosen.short(), profile.requested.short()}
    for config, (gpus, run_s) in best.items():
        assert listed[config].gpus == gpus and listed[config].run_s == pytest.approx(run_s, rel=1e-12)
    assert [c.run_s for c in e.candidates] == sorted(c.run_s for c in e.candidates)
    assert e.candidates[0].run_s == pytest.approx(min(r for _, r in best.values()))
    assert [c.config for c in e.candidates if c.chosen] == [chosen.short()]
    assert [c.config for c in e.candidates if c.requested] == [profile.requested.short()]
    free_at_last_tick = 32 - 8  # job 2 runs on 8 GPUs
    assert all(c.fits_free_now == (c.gpus <= free_at_last_tick) for c in e.candidates)
    short = explain(path, 1, top=2).candidates
    assert len(short) >= 2 and any(c.chosen for c in short) and any(c.requested for c in short)


def test_running_job(history):
    path, _ = history
    e = explain(path, 2)
    assert e.state == "RUNNING" and e.start_s == T0 + 500
    assert e.predicted_run_s == pytest.approx(5000.0 * BIAS)
    assert e.predicted_end_s == pytest.approx(T0 + 500 + 5000.0 * BIAS)
    # the last tick is at T0 + 600: 100 s running so far, after 500 s queued
    assert e.summary == "running on 8 GPUs for %s so far, after %s in the queue" % (duration(100.0), duration(500.0))
    assert all(c.fits_free_now is None for c in e.candidates)


def test_finished_job(history):
    path, _ = history
    e = explain(path, 3)
    assert e.state == "COMPLETED" and e.end_s == T0 + 550 and e.run_s == pytest.approx(520.0)
    assert e.predicted_end_s == T0 + 550 and e.predicted_run_s == pytest.approx(400.0 * BIAS)
    assert "ran 8.7m" in e.summary and "JCT 9.2m" in e.summary
    assert "actual / predicted 1.04" in explain_text(e)


def test_job_not_opted_in(history):
    e = explain(history[0], 4)
    assert e.candidates == [] and e.chosen_config is None
    assert e.why.startswith("not opted in")
    assert "no profile recorded" in e.profile_error


def test_unknown_job(history):
    with pytest.raises(UnknownJob):
        explain(history[0], 999)


def test_cli_explain_text_and_json(history):
    path, chosen = history
    runner = CliRunner()
    result = runner.invoke(pipeswift, ["explain", "1", "--db", path])
    assert result.exit_code == 0, result.output
    assert "job 1 (train1, user alice" in result.output and "candidate configs on A100-80GB" in result.output
    assert chosen.short() in result.output
    # the candidates are a table of one line per config (an escape of the whole text once
    # printed it as one line with literal \n)
    lines = result.output.splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("candidate configs on"))
    assert lines[heading - 1] == "" and lines[heading + 1].split()[:3] == ["gpus", "config", "iter_s"]
    assert "\\n" not in result.output and sum(1 for line in lines if chosen.short() in line) >= 1
    result = runner.invoke(pipeswift, ["explain", "2", "--db", path, "--json", "--top", "3"])
    data = json.loads(result.output)
    assert data["state"] == "RUNNING" and data["predicted_end_s"] == pytest.approx(T0 + 500 + 5000.0 * BIAS)
    assert {"gpus", "config", "run_s", "chosen"} <= set(data["candidates"][0])


def test_cli_unknown_job_is_one_line_exit_2(history):
    result = CliRunner().invoke(pipeswift, ["explain", "424242", "--db", history[0]])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "pipeswift: error: job 424242 is not in the history DB %s (the controller has not seen it yet, "
        "or wrong "
        "--db)" % history[0]
    ]


def test_cli_missing_db_exit_2(tmp_path):
    result = CliRunner().invoke(pipeswift, ["explain", "1", "--db", str(tmp_path / "nope.sqlite")])
    assert result.exit_code == 2 and "no history database" in result.output


def test_cli_explain_predicts_on_the_partitions_gpu_type_from_the_controllers_config(history, tmp_path, monkeypatch):
    path, _ = history
    config = tmp_path / "config.toml"
    config.write_text('[slurm]\ngpu_type = "A100-80GB"\n[slurm.partition_gpu_types]\ngpu = "H100-80GB"\n')
    monkeypatch.setenv("PIPESWIFT_CONFIG", str(config))
    result = CliRunner().invoke(pipeswift, ["explain", "1", "--db", path])
    assert result.exit_code == 0 and "candidate configs on H100-80GB" in result.output, result.output
    result = CliRunner().invoke(pipeswift, ["explain", "1", "--db", path, "--gpu-type", "A100-40GB"])
    assert result.exit_code == 0 and "candidate configs on A100-40GB" in result.output, result.output
    config.write_text('[slurm]\ngpu_type = "A100-80GB"\n')  # a partition the map does not name
    result = CliRunner().invoke(pipeswift, ["explain", "1", "--db", path])
    assert result.exit_code == 0 and "candidate configs on A100-80GB" in result.output, result.output
    config.write_text('[slurm]\ngpus_per_node = "eight"\n')
    result = CliRunner().invoke(pipeswift, ["explain", "1", "--db", path])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "gpus_per_node" in result.output


def test_candidates_follow_the_sites_own_layout_first(history, tmp_path, monkeypatch):
    # [calibration] own_layout_first: the class has no measured run in a user's layout, so
    # the controller keeps the user's layout on every count, and explain lists it so
    from pipeswift_slurm.core.megatron_rules import same_layout

    path, _ = history
    profile = _profile()
    store = Store.from_url(path)
    plain = explain_job(store, 1, GPU, top=20).candidates
    first = explain_job(store, 1, GPU, top=20, own_layout_first=True).candidates
    assert any(c.config != profile.requested.short() for c in plain if not c.chosen)
    kept = Estimator(CostModel(GPU), 8, {profile.job_class: BIAS}, own_layout_first=True)
    options = [kept.option(profile, g) for g in range(4, 17)]
    expected = {found[0].short() for found in options if found}
    assert expected and all(same_layout(found[0], profile.requested) for found in options if found)
    assert {c.config for c in first if not c.chosen and not c.requested} <= expected
    config = tmp_path / "config.toml"
    config.write_text('[calibration]\nmeasure_dir = "%s"\nown_layout_first = true\n' % tmp_path)
    monkeypatch.setenv("PIPESWIFT_CONFIG", str(config))
    result = CliRunner().invoke(pipeswift, ["explain", "1", "--db", path, "--json", "--top", "20"])
    assert result.exit_code == 0, result.output
    assert [c["config"] for c in json.loads(result.output)["candidates"]] == [c.config for c in first]


def test_a_requeued_job_shows_its_whole_wait_and_its_earlier_runs(tmp_path):
    """Live Slurm moves a requeued job's submit time to the requeue; explain still gives
    its whole JCT and its time queued (never its runs), and says it was requeued."""
    store = Store.from_url(str(tmp_path / "requeued.sqlite"))
    views = [(T0 + 100, _job(5, "RUNNING", start_time=T0 + 100)),
             (T0 + 1000, _job(5, "PENDING", restarts=1)),
             (T0 + 1500, _job(5, "RUNNING", start_time=T0 + 1400, restarts=1)),
             (T0 + 3000, _job(5, "COMPLETED", start_time=T0 + 1400, end_time=T0 + 2900, restarts=1))]
    for now, job in views:
        if job.restarts:  # what Slurm says after a requeue
            job = Job(**{**job.__dict__, "submit_time": T0 + 990})
        with store.tick(now, "pipeswift:preempt") as tx:
            tx.save_snapshot(ClusterView(now, NODES, (job,)))
    e = explain(str(tmp_path / "requeued.sqlite"), 5)
    assert e.summary == "COMPLETED: queued 8.3m, ran 25.0m, JCT 48.3m (requeued 1 time(s) after running 15.0m)"


@pytest.mark.parametrize("edit", ["submit_time = 'abc'", "end_time = start_time - 1000, run_s = -1000",
                                  "ran_s = 'abc', restarts = -2"])
def test_a_history_edited_by_hand_is_shown_without_what_cannot_be_true(history, tmp_path, edit):
    """Text in a time column was a TypeError; an end before the start was shown as a run of
    -1000 s. Such values are shown as unknown."""
    import shutil
    import sqlite3

    path, _ = history
    copy = tmp_path / "edited.sqlite"
    shutil.copy(path, copy)
    with sqlite3.connect(copy) as conn:
        conn.execute("UPDATE jobs SET %s WHERE job_id = 3" % edit)
    e = explain(str(copy), 3)
    assert e.run_s is None or e.run_s >= 0
    assert "-1000" not in explain_text(e) and "actual / predicted -" not in explain_text(e)


def test_a_profile_that_claims_another_size_is_shown_refused_as_the_controller_refuses_it(tmp_path):
    """``explain`` re-reads a profile as the controller does (``submitted_profile``): a
    4-GPU job whose Comment records world=8 (user text, edited) is refused, with the reason,
    not planned at the size it claims."""
    store = Store.from_url(str(tmp_path / "p.sqlite"))
    job = _job(9, "PENDING", gpus=4)
    with store.tick(T0 + 60, "pipeswift") as tx:
        tx.save_snapshot(ClusterView(T0 + 60, NODES, (job,)))
        tx.upsert_profile(9, job.comment, _profile())
    e = explain_job(store, 9, GPU)
    assert e.candidates == [] and e.profile_error == "world=8, but the job was submitted with 4 GPUs", e


@pytest.mark.parametrize("edit", ["pp = 9223372036854775807", "micro_batch_size = 0", "tp = 0, dp = 0"])
def test_an_edited_decision_is_shown_never_estimated(history, tmp_path, edit):
    """Found by fuzzing: explain estimated the recorded decision's config as given, so an
    edited history's pp = 2**63 - 1 ran on for minutes and mbs 0 divided by zero."""
    import shutil
    import sqlite3
    import subprocess
    import sys

    path = tmp_path / "edited.sqlite"
    shutil.copy(history[0], path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE decisions SET %s WHERE job_id = 1 AND tp IS NOT NULL" % edit)
    done = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli", "explain", "1", "--db", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "candidate configs on" in done.stdout, done.stderr[-2000:]
