"""Slurm as the site runs it (issue 26, item 2): the scheduling settings read from
``scontrol show config`` or a slurm.conf, and the simulated Slurm's priority, backfill and
latency rules on small hand-made cases."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeswift_slurm.cli.main import pipeswift
from pipeswift_slurm.core.model import Decision
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.sim.engine import SimSettings, Simulation
from pipeswift_slurm.sim.replay import replay_fidelity
from pipeswift_slurm.sim.workload import WorkloadJob
from pipeswift_slurm.slurm.backends.sim import SimBackend, SimJob
from pipeswift_slurm.slurm.backends.sched_settings import (IDEAL, SchedulingSettings, SchedulingSettingsError,
                                                  job_size_factor, parse_show_config, parse_slurm_conf,
                                                  read_scheduling_settings)

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
SHOW_CONFIG_22 = DATA / "scontrol-show-config-22.05.txt"
HOUR = 3600


# ------------------------------------------------------------------ settings

def test_scontrol_show_config_of_the_22_05_testbed() -> None:
    """Real output of the test cluster started with PriorityWeightJobSize=1000 and
    bf_interval=5 (no slurmdbd: Slurm ignores the age weight, and so do we)."""
    s = parse_show_config(SHOW_CONFIG_22.read_text())
    assert s.scheduler == "backfill"
    assert (s.weight_job_size, s.weight_partition, s.weight_qos, s.weight_fairshare) == (1000, 1000, 0, 0)
    assert s.weight_age == 0 and s.max_age_s == 86400.0  # PriorityWeightAge=1000 but no slurmdbd
    assert (s.bf_interval_s, s.sched_interval_s) == (5.0, 2.0)
    assert (s.bf_resolution_s, s.bf_max_job_test, s.bf_window_s, s.batch_sched_delay_s) == (60.0, 500, 86400.0, 3.0)
    assert not s.favor_small
    assert read_scheduling_settings(str(SHOW_CONFIG_22)) == s  # detected as show config


def test_slurm_conf_with_accounting_comments_and_a_repeated_key(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("# site\nClusterName=x\nSchedulerType=sched/backfill\nAccountingStorageType=accounting_storage/"
                    "slurmdbd\nPriorityType=priority/multifactor\nPriorityWeightAge=500  # age\nPriorityMaxAge=2-0\n"
                    "PriorityWeightJobSize=100\nPriorityWeightJobSize=300\nPriorityFavorSmall=YES\n"
                    "SchedulerParameters=bf_interval=10,bf_resolution=120,bf_max_job_test=50,bf_window=60,"
                    "batch_sched_delay=1,defer\nNodeName=n[1-4] Gres=gpu:8 CPUs=64\n"
                    "PartitionName=p Nodes=n[1-4] Default=YES PriorityJobFactor=10\n")
    s = read_scheduling_settings(str(conf))
    assert (s.weight_age, s.max_age_s, s.weight_job_size, s.favor_small) == (500, 2 * 86400.0, 300, True)
    assert (s.bf_interval_s, s.bf_resolution_s, s.bf_max_job_test, s.bf_window_s, s.batch_sched_delay_s) == \
        (10.0, 120.0, 50, 3600.0, 1.0)


def test_defaults_are_slurms_own() -> None:
    s = parse_slurm_conf("ClusterName=x\n")
    assert s == SchedulingSettings()
    assert (s.bf_interval_s, s.bf_resolution_s, s.bf_max_job_test, s.bf_window_s) == (30.0, 60.0, 500, 86400.0)
    assert (s.sched_interval_s, s.batch_sched_delay_s, s.max_age_s) == (60.0, 3.0, 7 * 86400.0)
    assert (s.weight_age, s.weight_job_size, s.weight_fairshare, s.weight_qos, s.weight_partition) == (0, 0, 0, 0, 0)
    basic = parse_slurm_conf("PriorityType=priority/basic\nPriorityWeightJobSize=1000\n")
    assert basic.weight_job_size == 0  # priority/basic has no weights
    assert parse_slurm_conf("SchedulerType=sched/builtin\n").scheduler == "builtin"


@pytest.mark.parametrize("text, words", [
    ("PriorityWeightJobSize=lots\n", ["PriorityWeightJobSize", "whole number"]),
    ("PriorityMaxAge=soon\n", ["PriorityMaxAge", "duration"]),
    ("SchedulerType=sched/gang\n", ["sched/gang", "not modelled"]),
    ("just some words\n", ["neither"]),
    ("SchedulerParameters=bf_max_job_test=-1\n", ["bf_max_job_test=-1 is below 1"]),  # tested all jobs but one
    ("SchedulerParameters=bf_resolution=0\n", ["bf_resolution=0 is below 1"]),
    ("PriorityWeightAge=-5\n", ["PriorityWeightAge=-5 is below 0"]),
])
def test_bad_settings_are_one_line_exit_2(tmp_path: Path, text: str, words: list[str]) -> None:
    path = tmp_path / "slurm.conf"
    path.write_text(text)
    with pytest.raises(SchedulingSettingsError):
        read_scheduling_settings(str(path))
    result = CliRunner().invoke(pipeswift, ["simulate", "--jobs", "3", "--slurm-config", str(path)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and all(w in lines[0] for w in words), result.output


# ------------------------------------------------------------------ priority

def job(job_id: int, gpus_per_node: int, limit_s: int, submit_s: float = 0.0, nodes: int = 1) -> SimJob:
    return SimJob(job_id, "j%d" % job_id, "u", submit_s, "", nodes, gpus_per_node, limit_s)


def test_job_size_factor_is_slurms() -> None:
    assert job_size_factor(2, 2, 4, 256, False) == pytest.approx((0.5 + 2 / 256) / 2)
    assert job_size_factor(2, 2, 4, 256, True) == pytest.approx((0.5 + 254 / 256) / 2)


@pytest.mark.parametrize("favor_small, first", [(False, 2), (True, 1)])
def test_job_size_priority_orders_wide_jobs_first(favor_small: bool, first: int) -> None:
    """2 nodes x 8 GPUs, both busy. A (1 node) was submitted before B (2 nodes). With
    PriorityWeightJobSize the wider B goes first when the nodes free up (A waits behind
    it); with PriorityFavorSmall the narrow A does (B waits behind it)."""
    be = SimBackend(2, 8, settings=SchedulingSettings(weight_job_size=1000, favor_small=favor_small))
    be.submit(job(9, 8, HOUR, nodes=2))
    assert [j.job_id for j in be.main_pass(0.0)] == [9]
    be.submit(job(1, 8, HOUR, submit_s=1.0))
    be.submit(job(2, 8, HOUR, submit_s=2.0, nodes=2))
    assert be.priority(be.jobs[2], 10.0) != be.priority(be.jobs[1], 10.0)
    be.finish(9, 100.0)
    assert [j.job_id for j in be.main_pass(100.0)] == [first]
    without = SimBackend(2, 8)  # Slurm's default weights: submit order, A first
    without.submit(job(1, 8, HOUR, submit_s=1.0))
    without.submit(job(2, 8, HOUR, submit_s=2.0, nodes=2))
    assert [j.job_id for j in without.main_pass(100.0)] == [1]


def test_main_pass_stops_at_the_first_job_that_does_not_fit() -> None:
    be = SimBackend(1, 8, settings=IDEAL)
    be.submit(job(1, 6, HOUR))
    be.main_pass(0.0)
    be.submit(job(2, 8, HOUR, submit_s=1.0))
    be.submit(job(3, 1, 60, submit_s=2.0))
    assert be.main_pass(10.0) == []  # 3 would fit, but only backfill may start it
    assert [j.job_id for j in be.backfill_pass(10.0)] == [3]


# ------------------------------------------------------------------ backfill

def _two_blocked(with_second: bool) -> SimBackend:
    """2 nodes x 8 GPUs. R1 holds node 0 until 960, R2 6 GPUs of node 1 until 1920. J1
    (1 x 8, limit 3000) reserves node 0 from 960; J2 (1 x 8, 960) reserves node 1 from
    1920. J3 (2 GPUs, 1 h) fits now on node 1 only, and would run into J2's reservation."""
    be = SimBackend(2, 8, settings=SchedulingSettings())
    be.submit(job(1, 8, 960))
    be.submit(job(2, 6, 1920))
    assert [j.placement for j in be.main_pass(0.0)] == [(0,), (1,)]
    be.submit(job(10, 8, 3000, submit_s=1.0))
    if with_second:
        be.submit(job(11, 8, 960, submit_s=2.0))
    be.submit(job(12, 2, HOUR, submit_s=3.0))
    return be


def test_every_blocked_job_reserves_and_a_later_job_may_not_delay_it() -> None:
    """EASY (only the first blocked job reserves) would start J3 on node 1 and delay J2
    past 1920; Slurm's backfill reserves for J2 too, so J3 waits."""
    assert [j.job_id for j in _two_blocked(with_second=False).backfill_pass(60.0)] == [12]
    be = _two_blocked(with_second=True)
    assert be.backfill_pass(60.0) == []
    assert be._earliest(be.jobs[11], 60.0, [(960.0, 3960.0, frozenset({0}))]) == (1920.0, (1,))


def test_bf_max_job_test_limits_the_jobs_a_pass_looks_at() -> None:
    be = _two_blocked(with_second=False)
    be.settings = replace(be.settings, bf_max_job_test=1)
    assert be.backfill_pass(60.0) == []  # J3 is the second job: never tested


def _mid_before_big(resolution_s: float) -> list[int]:
    """2 nodes x 8 GPUs at t=1000. Node 0: 4 GPUs busy until 1050; node 1: full until
    1200 (limits). BIG (2 x 8, 1 h) reserves both nodes from 1200. MID (1 x 8, limit
    170) fits on node 0 at 1050 and would end at 1220; SMALL (1 GPU, 2 min) could start
    on node 0 now. The jobs the backfill pass at 1000 starts."""
    be = SimBackend(2, 8, settings=SchedulingSettings(bf_resolution_s=resolution_s))
    be.submit(job(1, 4, 1050))
    be.submit(job(2, 8, 1200))
    assert [j.placement for j in be.main_pass(0.0)] == [(0,), (1,)]
    be.submit(job(10, 8, HOUR, submit_s=10.0, nodes=2))
    be.submit(job(11, 8, 170, submit_s=20.0))
    be.submit(job(12, 1, 120, submit_s=30.0))
    return [j.job_id for j in be.backfill_pass(1000.0)]


def test_a_planned_start_is_tested_rounded_and_may_end_where_another_begins() -> None:
    """Slurm tests a planned reservation with its start and end rounded down to
    bf_resolution, and lets it end where an earlier one begins: MID's 1050-1220 becomes
    1020-1200, which fits before BIG's 1200, so MID reserves node 0 and SMALL (1000-1120)
    waits. Unrounded, MID would overlap BIG, reserve nothing before it, and SMALL would
    start (as it did before this rule, on the real cluster's history: the replay then
    missed the runs where Slurm held a node for a medium job)."""
    assert _mid_before_big(60.0) == []
    assert _mid_before_big(0.0) == [12]


def test_reservations_are_rounded_down_to_bf_resolution() -> None:
    """R ends at 1000; BIG reserves from 1000 rounded down: 960 (bf_resolution 60) or 900
    (300). SMALL (limit 900) ends at 50 + 900 = 950: before 960, after 900."""
    for resolution, starts in ((60.0, [3]), (300.0, [])):
        be = SimBackend(1, 8, settings=SchedulingSettings(bf_resolution_s=resolution))
        be.submit(job(1, 6, 1000))
        be.main_pass(0.0)
        be.submit(job(2, 8, HOUR, submit_s=1.0))
        be.submit(job(3, 2, 900, submit_s=2.0))
        assert [j.job_id for j in be.backfill_pass(50.0)] == starts, resolution


# ------------------------------------------------------------------ latencies (engine)

def as_ran(job_id: int, submit_s: float, gpus: int, run_s: float, limit_s: int = HOUR) -> WorkloadJob:
    return WorkloadJob(job_id=job_id, name="j%d" % job_id, user="u", submit_s=submit_s, argv=(), profile=None,
                       recorded_duration_s=run_s, time_limit_s=limit_s, model="(as it ran)", category="",
                       as_ran_nodes=1, as_ran_gpus_per_node=gpus, as_ran_jct_s=run_s + 10.0)


def starts(jobs: list[WorkloadJob], settings: SchedulingSettings) -> dict[str, float]:
    gpu = get_gpu_type("A100-80GB")
    result = Simulation(jobs, get_policy("slurm"), Estimator(CostModel(gpu), 8), CostModel(gpu),
                        SimSettings(1, 8, slurm=settings)).run()
    return {r.name: r.first_start_s for r in result.records}


def test_scheduler_passes_run_when_slurm_runs_them() -> None:
    """One node x 8 GPUs. j1 and j2 (submitted at 0.5 and 1.5) start together in the main
    pass that j1's submission asked for, batch_sched_delay (3 s) later; j3 (8 GPUs) is
    blocked, and j4 (2 GPUs, ends long before j3's reservation) is backfilled at the next
    backfill pass on the bf_interval clock (5 s: at 15), not by the main pass at 14
    (strict order: j3 first). The idealised Slurm starts each at once."""
    settings = SchedulingSettings(bf_interval_s=5.0)
    jobs = [as_ran(1, 0.5, 4, 100.0), as_ran(2, 1.5, 2, 100.0), as_ran(3, 11.0, 8, 100.0),
            as_ran(4, 12.0, 2, 10.0, limit_s=60)]
    got = starts(jobs, settings)
    assert got["j1"] == 3.5 and got["j2"] == 3.5
    assert got["j4"] == 15.0
    ideal = starts(jobs, IDEAL)
    assert ideal["j1"] == 0.5 and ideal["j2"] == 1.5 and ideal["j4"] == 12.0


def test_replay_fidelity_compares_the_slurm_replay_with_the_history() -> None:
    jobs = [as_ran(1, 0.0, 8, 100.0), as_ran(2, 0.0, 8, 100.0)]  # as ran: JCT 110 each, wait 10
    gpu = get_gpu_type("A100-80GB")
    result = Simulation(jobs, get_policy("slurm"), Estimator(CostModel(gpu), 8), CostModel(gpu),
                        SimSettings(1, 8, slurm=IDEAL)).run()
    fid = replay_fidelity(jobs, result)
    assert fid is not None and fid["jobs"] == 2
    assert fid["as_ran_mean_jct_s"] == 110.0 and fid["replay_mean_jct_s"] == 150.0  # 100 and 200
    assert fid["mean_jct_ratio"] == pytest.approx(150 / 110) and fid["mean_wait_ratio"] == pytest.approx(5.0)


def test_cli_sacct_says_how_close_the_slurm_replay_came(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    result = CliRunner().invoke(pipeswift, ["simulate", "--sacct", str(DATA / "sacct-22.05.json"), "--gpus", "16",
                                            "--policy", "slurm,pipeswift", "--slurm-config", str(SHOW_CONFIG_22),
                                            "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "slurm replay vs as it ran: mean JCT " in result.stdout
    data = json.loads(out.read_text())
    fid = data["what_changed"]["slurm_replay_vs_as_ran"]
    assert fid["jobs"] == 4 and fid["mean_jct_ratio"] > 0
    assert data["spec"]["slurm"]["weight_job_size"] == 1000 and data["spec"]["slurm"]["bf_interval_s"] == 5.0


# ------------------------------------------------------------------ a requeued job's begin time

def test_a_requeued_job_pends_on_its_begin_time_as_slurm_keeps_it() -> None:
    """Slurm gives a requeued job a begin time cred_expire + 1 s later (121 s by default,
    measured on the test cluster): it shows Reason=BeginTime and no pass starts it before
    then, on free GPUs or not; then it is a pending job like any other."""
    be = SimBackend(1, 8, settings=SchedulingSettings())
    be.submit(SimJob(1, "j1", "u", 0.0, "", 1, 4, HOUR))
    be.schedule(0.0)
    be.now = 50.0
    be.apply(Decision(1, requeue=True), be.snapshot().jobs[0])
    told = be.snapshot().jobs[0]
    assert (told.state, told.state_reason, told.restarts, be.free) == ("PENDING", "BeginTime", 1, [8])
    assert be.next_begin_s() == 171.0
    assert be.schedule(170.0) == [] and be.backfill_pass(170.9) == []
    be.now = 171.0
    assert be.snapshot().jobs[0].state_reason == ""
    assert [j.job_id for j in be.schedule(171.0)] == [1] and be.next_begin_s() == float("inf")
    ideal = SimBackend(1, 8, settings=IDEAL)  # the idealised Slurm restarts it at once
    ideal.submit(SimJob(1, "j1", "u", 0.0, "", 1, 4, HOUR))
    ideal.schedule(0.0)
    ideal.apply(Decision(1, requeue=True), ideal.snapshot().jobs[0])
    assert ideal.snapshot().jobs[0].state_reason == "" and [j.job_id for j in ideal.schedule(0.0)] == [1]


@pytest.mark.parametrize("text, delay_s", [
    ("ClusterName=x\n", 121.0),
    ("AuthType=auth/munge\nAuthInfo=socket=/run/munge/munge.socket.2,cred_expire=30\n", 31.0),
    ("AuthInfo=cred_expire=600\n", 601.0),
])
def test_the_requeue_delay_is_auth_infos_cred_expire(text: str, delay_s: float) -> None:
    assert parse_slurm_conf(text).requeue_delay_s == delay_s
    shown = "Configuration data as of 2026-12-06T10:00:00\n" + "".join(
        "%s = %s\n" % tuple(line.split("=", 1)) for line in text.splitlines())
    assert parse_show_config(shown).requeue_delay_s == delay_s
