"""Do no harm (issue 25, item 4): the policies and the launcher replace a user's layout on a
GPU count only when the predicted gain exceeds the error band (``planner.keep_user_layout``,
reached through ``Planner.choose`` by both)."""

import math
from dataclasses import replace

from pipeswift_slurm.core.costmodel import CostModel, Estimate
from pipeswift_slurm.core.error_band import ErrorBand
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.layout_fit import feature_key, layout_features
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.megatron_rules import node_shape, user_layout_at
from pipeswift_slurm.core.model import ExecConfig, JobProfile
from pipeswift_slurm.core.planner import Planner, keep_user_layout
from pipeswift_slurm.core.token import ProfileRequest
from pipeswift_slurm.policy.common import job_options
from pipeswift_slurm.submit import launcher

A100 = get_gpu_type("A100-80GB")


def _argv(tp: int, pp: int, mbs: int = 1) -> list[str]:
    # GPT 1.3B-like: on 8 A100s the fastest is tp1 pp1 dp8 mbs8 (ampere pp = 1 band 21 %)
    return ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--tensor-model-parallel-size", str(tp),
            "--pipeline-model-parallel-size", str(pp), "--micro-batch-size", str(mbs), "--global-batch-size", "64",
            "--train-iters", "100", "--bf16"]


def _profile(tp: int, pp: int, gpus: int = 8, mbs: int = 1) -> JobProfile:
    return profile_from_argv(_argv(tp, pp, mbs), world_size=gpus, gpus_per_node=8)


def _estimator(do_no_harm: bool = True) -> Estimator:
    """The estimator as the controller, the simulator and the launcher build it (do no harm
    is on by default), or one with the rule off."""
    cost = CostModel(A100)
    return Estimator(cost, 8) if do_no_harm else Estimator(cost, 8, planner=Planner(cost, 8, do_no_harm=False))


def test_user_layout_within_the_band_is_kept() -> None:
    # tp2 pp1 mbs4 is predicted 14 % slower than tp1 pp1 mbs8 on 8 GPUs: less than the band (21 %)
    profile = _profile(2, 1, mbs=4)
    est = _estimator()
    fastest, chosen = est.fastest(profile, 8), est.best(profile, 8)
    gain = 1 - fastest.iter_time_s / chosen.iter_time_s
    assert fastest.config != profile.requested and 0.10 < gain < max(fastest.band.rel, chosen.band.rel)
    assert chosen.config == profile.requested
    assert _estimator(do_no_harm=False).best(profile, 8).config == fastest.config  # the switch


def test_user_layout_clearly_worse_is_replaced() -> None:
    # tp4 pp1 is predicted 62 % slower than tp1 pp1: beyond any band
    profile = _profile(4, 1)
    est = _estimator()
    assert est.best(profile, 8).config == est.fastest(profile, 8).config != profile.requested


def test_user_layout_is_scaled_to_each_gpu_count_and_kept_there_too() -> None:
    profile = _profile(2, 1, mbs=4).with_range(4, 16)
    at16 = user_layout_at(profile, 16, 8)
    assert at16 == replace(profile.requested, dp=8, num_micro_batches=2, num_nodes=2, gpus_per_node=8)
    assert user_layout_at(profile, 6, 8) is None  # 6 GPUs: dp 3 x mbs 4 does not divide the batch of 64
    assert _estimator().best(profile, 16).config == at16


def _est(iter_s: float, band: float, fits: bool = True, tp: int = 1) -> Estimate:
    cfg = ExecConfig(tp=tp, pp=1, dp=8 // tp, micro_batch_size=1, num_micro_batches=8, num_nodes=1, gpus_per_node=8)
    return Estimate(cfg, iter_s, iter_s, 0.0, 0.0, 0.0, 10.0, 100.0, fits, ErrorBand(band, "test"))


def test_gain_must_exceed_the_larger_band() -> None:
    user = _est(1.0, 0.10, tp=2)
    assert keep_user_layout(user, _est(0.85, 0.10)) is not user  # 15 % > 10 %
    assert keep_user_layout(user, _est(0.85, 0.20)) is user  # 15 % < the proposal's 20 %
    wide = replace(user, band=ErrorBand(0.2, "test"))
    assert keep_user_layout(wide, _est(0.85, 0.10)) is wide  # 15 % < the user's 20 %
    assert keep_user_layout(user, _est(0.90, 0.10)) is user  # exactly the band: kept
    assert keep_user_layout(replace(user, fits=False), _est(2.0, 0.10)).config.tp == 1  # out of memory: replaced
    assert keep_user_layout(None, _est(1.0, 0.1)) is not None and keep_user_layout(user, None) is None


def test_launcher_and_policy_choose_the_same_config_on_every_count() -> None:
    est = _estimator()
    for tp, pp in ((2, 2), (4, 1), (1, 2), (8, 1)):
        flexible = _profile(tp, pp).with_range(4, 32)
        by_policy = {o.gpus: o.config for o in job_options(flexible, est, 64, 8)}
        assert by_policy
        for gpus, config in by_policy.items():
            if gpus % 8:
                continue  # whole nodes: where the launcher can read every user layout of this test
            alloc = launcher.Allocation(*node_shape(gpus, 8))
            pinned = launcher.job_profile(_argv(tp, pp), ProfileRequest(()), alloc)
            assert launcher.best_config(pinned, alloc, est) == config == est.best(flexible, gpus).config, (tp, pp, gpus)


def test_simulator_counts_jobs_run_in_another_layout_and_the_rule_lowers_it() -> None:
    from pipeswift_slurm.sim.runner import RunSpec, run_comparison

    spec = RunSpec(gpus=16, synthetic_jobs=40, policies=("pipeswift", "pipeswift:order"))
    on, off = ({m["policy"]: m for m in run_comparison(replace(spec, do_no_harm=flag)).metrics} for flag in (True, False))
    assert on["pipeswift:order"]["relayout_jobs"] == off["pipeswift:order"]["relayout_jobs"] == 0  # users' configs
    assert on["pipeswift"]["relayout_jobs"] < off["pipeswift"]["relayout_jobs"]


def test_a_count_without_the_users_layout_must_beat_it_on_fewer_gpus() -> None:
    # The hole a GPU-count change hid (bench/do_no_harm.py, expert layouts): tp1 pp2 does not
    # run on 9 or 11 GPUs, so every config there is another layout, which the rule on one
    # count cannot weigh. On 9 GPUs tp1 pp9 is predicted 6 % faster than the user's tp1 pp2
    # on 8 (inside the 7 % band), on 11 tp1 pp11 slower still: neither count is offered to
    # the policies (8 GPUs serve the job with fewer GPUs and no bet); 12 GPUs (tp1 pp3,
    # 28 % faster than the user's on 8) are. The launcher, given 9 GPUs, still runs the best.
    profile = _profile(1, 2).with_range(2, 16)
    est = _estimator()
    assert user_layout_at(profile, 9, 8) is None and user_layout_at(profile, 11, 8) is None
    on8 = est.cost.estimate(profile, user_layout_at(profile, 8, 8))
    for gpus in (9, 11):
        chosen = est.best(profile, gpus)
        assert chosen is not None and 1 - chosen.iter_time_s / on8.iter_time_s < on8.band.rel
        assert est.planner.offer(profile, gpus) is None and est.option(profile, gpus) is None
    on12 = est.best(profile, 12)
    assert 1 - on12.iter_time_s / on8.iter_time_s > on8.band.rel and est.planner.offer(profile, 12) is on12
    counts = {o.gpus for o in job_options(profile, est, 64, 16)}
    assert 8 in counts and 12 in counts and not counts & {9, 11}
    assert {o.gpus for o in job_options(profile, _estimator(do_no_harm=False), 64, 16)} >= {9, 11}  # rule off
    alloc = launcher.Allocation(*node_shape(9, 8))
    assert launcher.best_config(profile, alloc, est) == est.best(profile, 9).config  # the launcher's count is given


def test_learned_factors_only_ever_favour_the_users_layout() -> None:
    user, best = _est(1.0, 0.10, tp=2), _est(0.85, 0.10)
    assert keep_user_layout(user, best) is best  # the model alone: 15 % > 10 %
    assert keep_user_layout(user, best, lambda c: {2: 0.9, 1: 1.0}[c.tp]) is user  # measured: 0.85 / 0.9, 5.6 %
    # measured against the user's layout: never a bet the model alone would not make
    assert keep_user_layout(user, _est(0.95, 0.10), lambda c: {2: 1.2, 1: 1.0}[c.tp]) is user
    assert keep_user_layout(user, best, lambda c: {2: 1.2, 1: 1.0}[c.tp]) is best


def test_a_layout_the_site_measured_faster_is_kept_by_policies_and_launcher() -> None:
    # The site's runs of this class at tp2 took 0.8 of the predicted time (a learned layout
    # term, core/layout_fit.py): the user's tp2 pp1 mbs2, which the model alone replaces
    # (predicted 32 % slower than tp1 pp1 mbs8: a 24 % gain, beyond the 21 % band), is kept
    # on every count (corrected, the gain is 5 %); a class without the term is not.
    profile = replace(_profile(2, 1, mbs=2), job_class="gpt-1.3b").with_range(8, 16)
    est = _estimator()
    assert est.best(profile, 8).config != profile.requested
    learned = est.with_bias({feature_key("gpt-1.3b", "tp", 2): 0.8})
    assert learned.best(profile, 8).config == profile.requested
    options = learned.option_run_times_s(profile, 8, 16)
    assert options and all(cfg.tp == 2 and cfg.pp == 1 for _, cfg, _ in options)
    assert learned.option_run_times_s(profile, 8, 16) == options  # nothing left in a cache changes it
    _, run_s = learned.best_run_time_s(profile, 8)
    assert math.isclose(run_s, 0.8 * est.run_time_s(profile, profile.requested))
    assert learned.best(replace(profile, job_class="other"), 8).config != profile.requested
    assert est.best(profile, 8).config != profile.requested  # the shared planner kept no learned choice
    alloc = launcher.Allocation(*node_shape(8, 8))
    assert launcher.best_config(profile, alloc, learned) == profile.requested


def test_own_layout_first_keeps_a_class_unmeasured_in_its_users_layouts_until_one_is_measured() -> None:
    # tp4 pp1 is predicted 62 % slower than the fastest: the model alone replaces it on every
    # count. A site with own_layout_first keeps it (and still resizes it in that layout) until
    # a run of the class in a user's own layout was measured (its ``own=1`` term); then the
    # model's bet is back. The switch is carried through with_bias and for_hardware.
    profile = replace(_profile(4, 1), job_class="gpt-1.3b").with_range(8, 16)
    plain = _estimator()
    assert plain.best(profile, 8).config != profile.requested
    first = Estimator(CostModel(A100), 8, own_layout_first=True)
    assert first.best(profile, 8).config == profile.requested
    options = first.option_run_times_s(profile, 8, 16)
    assert {gpus for gpus, _, _ in options} == {8, 16}  # 12: dp 3 does not divide the batch
    assert all((cfg.tp, cfg.pp, cfg.micro_batch_size) == (4, 1, 1) for _, cfg, _ in options)
    other_class = first.with_bias({feature_key("gpt-other", "own", 1): 1.0})
    assert other_class.own_layout_first and other_class.best(profile, 8).config == profile.requested
    measured = first.with_bias({feature_key("gpt-1.3b", "own", 1): 1.0})
    assert measured.best(profile, 8).config == plain.best(profile, 8).config
    assert first.for_hardware(CostModel(get_gpu_type("H100-80GB")), 8).own_layout_first
    assert launcher.best_config(profile, launcher.Allocation(*node_shape(8, 8)), first) == profile.requested


def test_simulated_site_with_own_layout_first_starts_each_class_in_its_users_layout() -> None:
    # End to end through the controller's tick and the online calibration: under
    # own_layout_first no job of a class runs another layout before a run of the class in a
    # user's own layout has finished (the simulator learns from finished jobs); without it
    # the model's bets start at once.
    from pipeswift_slurm.core.megatron_rules import same_layout
    from pipeswift_slurm.sim.runner import RunSpec, run_comparison

    spec = RunSpec(gpus=32, synthetic_jobs=80, policies=("pipeswift",), seed=1, learn=True)
    free = run_comparison(spec).results[0].records
    first = run_comparison(replace(spec, own_layout_first=True)).results[0].records
    assert any(not same_layout(r.config, r.requested) for r in free)
    moved = 0
    for rec in first:
        if rec.config is None or same_layout(rec.config, rec.requested):
            continue
        moved += 1
        assert any(o.job_class == rec.job_class and o.end_s is not None and o.end_s <= rec.run_started_s
                   and same_layout(o.config, o.requested) for o in first), rec.job_id
    assert moved < sum(1 for r in free if r.config is not None and not same_layout(r.config, r.requested))
    # ... and a class explores one relaid job at a time until one has finished: a relaid job
    # that starts while another of its class runs comes after a relaid run of it has ended
    relaid = [r for r in first if r.config is not None and not same_layout(r.config, r.requested)]
    for rec in relaid:
        beside = [o for o in relaid if o is not rec and o.job_class == rec.job_class
                  and o.run_started_s <= rec.run_started_s and (o.end_s is None or rec.run_started_s < o.end_s)]
        assert not beside or any(o.job_class == rec.job_class and o.end_s is not None
                                 and o.end_s <= rec.run_started_s for o in relaid), rec.job_id


def test_a_held_job_runs_its_users_layout_or_one_the_site_measured() -> None:
    # known_layouts_only (set by the controller's exploration rule) keeps the user's layout
    # where the fastest layout has a feature the class never ran in a layout pipeswift chose;
    # once each of its features was measured the bet is back, weighed by the learned terms;
    # profiles that differ only in the flag do not share options
    profile = replace(_profile(4, 1), job_class="gpt-1.3b").with_range(8, 16)
    own = {feature_key("gpt-1.3b", "own", 1): 1.0, feature_key("gpt-1.3b", "own", 0): 0.9}
    est = _estimator().with_bias(own)
    fastest = est.best(profile, 8).config
    assert fastest != profile.requested
    held = replace(profile, known_layouts_only=True)
    assert est.best(held, 8).config == profile.requested
    assert all((cfg.tp, cfg.pp) == (4, 1) for _, cfg, _ in est.option_run_times_s(held, 8, 16))
    assert est.option_run_times_key(held, 8, 16) != est.option_run_times_key(profile, 8, 16)
    assert launcher.best_config(held, launcher.Allocation(*node_shape(8, 8)), est) == profile.requested
    # its decision says why, for `pipeswift explain`; a free job's does not
    from pipeswift_slurm.core.model import Job
    from pipeswift_slurm.policy.common import Option, decision_for

    job, opt = Job(1, "PENDING", 0.0, gpus=4), Option(8, profile.requested, 3600.0)
    assert "another job of its class" in decision_for(job, held, opt, 5, "start now", est).reason
    assert decision_for(job, profile, None, 5, "start now", est).reason == "start now"
    ran = {feature_key("gpt-1.3b", f, v): 1.0 for f, v in layout_features(fastest)}
    assert est.with_bias({**own, **ran}).best(held, 8).config == fastest


def test_exploration_holds_one_unmeasured_bet_per_class() -> None:
    from pipeswift_slurm.core.layout_fit import exploration_holds

    jobs = [(1, "b", False, False), (2, "b", False, False), (3, "b", False, False),  # b: 1 may explore
            (4, "c", True, True), (5, "c", False, False),              # c: an unmeasured bet in flight
            (6, "d", True, False), (7, "d", False, False), (8, "d", False, False)]  # d: a measured one runs
    assert exploration_holds(jobs) == {2, 3, 5, 8}
    assert exploration_holds([]) == frozenset()


def test_controller_marks_the_held_jobs_only_under_own_layout_first() -> None:
    from pipeswift_slurm.core.model import Job
    from pipeswift_slurm.slurm.explore import with_exploration_holds

    profile = replace(_profile(4, 1), job_class="gpt-1.3b")
    relaid = ExecConfig(tp=1, pp=1, dp=8, micro_batch_size=8, num_micro_batches=1, num_nodes=1, gpus_per_node=8)
    jobs = [Job(3, "PENDING", 30.0), Job(1, "RUNNING", 5.0, config=relaid), Job(2, "PENDING", 20.0),
            Job(4, "PENDING", 10.0)]
    profiles = {1: profile, 2: profile, 3: profile, 4: replace(profile, job_class="gpt-other")}
    runnable = {2: profile, 3: profile, 4: profiles[4]}
    assert with_exploration_holds(_estimator(), jobs, profiles, runnable) is runnable
    first = Estimator(CostModel(A100), 8, own_layout_first=True)
    held = with_exploration_holds(first, jobs, profiles, runnable)
    assert {j for j, p in held.items() if p.known_layouts_only} == {2, 3}
    # once the running job's layout was measured, the first pending job of the class (in
    # submit order) may explore; as when that run ends
    ran = {feature_key("gpt-1.3b", f, v): 1.0 for f, v in layout_features(relaid, profile.requested)}
    measured = with_exploration_holds(first.with_bias(ran), jobs, profiles, runnable)
    done = with_exploration_holds(first, [j for j in jobs if j.job_id != 1], profiles, runnable)
    assert {j for j, p in measured.items() if p.known_layouts_only} == {3}
    assert {j for j, p in done.items() if p.known_layouts_only} == {3}


def test_only_the_controller_explores_a_layout_the_site_has_not_measured() -> None:
    # The launcher (and psbatch) plan without knowing the jobs in flight: under
    # own_layout_first they run only the user's layout or measured ones, where the
    # controller's estimator may let one job of the class explore.
    profile = replace(_profile(4, 1), job_class="gpt-1.3b")
    own = {feature_key("gpt-1.3b", "own", 1): 1.0}
    controller = Estimator(CostModel(A100), 8, own, own_layout_first=True)
    job_side = Estimator(CostModel(A100), 8, own, own_layout_first=True, explores=False)
    fastest = controller.best(profile, 8).config
    assert fastest != profile.requested
    assert job_side.best(profile, 8).config == profile.requested
    assert not job_side.with_bias(own).explores and not job_side.for_hardware(CostModel(A100), 4).explores
    ran = {feature_key("gpt-1.3b", f, v): 1.0 for f, v in layout_features(fastest, profile.requested)}
    assert job_side.with_bias({**own, **ran}).best(profile, 8).config == fastest
