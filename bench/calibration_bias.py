"""Bench: does online calibration remove a per-family bias of the run-time estimator?

The experiment of issue #7. True run times = cost model x family bias x noise
(sim/workload.py ``Conversion``): one model FAMILY runs +30 % longer than the cost model
predicts, another -20 % shorter. The same seeded workload runs under ``pipeswift``:
  uncalibrated  the cost model alone (the bias is unknown);
  calibrated    OnlineCalibrator, given to the Simulation: the controller's calibration
                step learns from jobs as they finish and refits every
                ``--refit-every`` finished jobs (the same step cron runs on the history);
  oracle        the estimator with the true bias map (what perfect calibration gives);
  near_oracle_shrunk, near_oracle_stretched
                controls: the true ratios moved ~1 % toward 1 (about what a converged,
                shrunk calibration keeps) and ~1 % away from 1. How much of the
                oracle's gain an almost perfect estimator keeps, on either side of the
                truth: the noise floor of any "calibrated vs oracle" comparison.

Workload (scenario ``families``, the default), chosen so that the bias MATTERS to the
decisions ``pipeswift`` takes from the estimator (queue order: predicted run time minus
an aging credit; start now or wait, from the predicted ends of running jobs):
* two genuine model families, drawn 50/50 per job (``Conversion.bands``): GPT (gpt-1.3b,
  gpt-2.7b; classes ``gpt-<2B``, ``gpt-<8B``) and llama-style SwiGLU + GQA (llama-1b,
  llama-3b of ``workload.EXTRA_ZOO``; classes ``gpt-swiglu-gqa-<2B``,
  ``gpt-swiglu-gqa-<8B``). Truth: llama-style x1.3 (predicted too short: the family that
  gets a false priority), GPT x0.8 (predicted too long); each job x log-normal noise
  (sigma 0.1);
* they compete for the same GPUs with the same predicted run times: one category of
  whole-node fine-tuning jobs (``FAMILIES_MIX``: 8 GPUs, resizable 4-16, log-normal
  duration with median 1 h, sigma 0.8, 5 min .. 12 h). A row's duration is the cost
  model's prediction for its user config whatever its family, so both families'
  predicted run times have the same distribution and the 1.3 / 0.8 = 1.63x relative bias
  flips the shortest-predicted-first order of many pairs of jobs of different families;
* high but stable load: offered load 0.9 on 8 nodes x 8 A100-80GB, 800 jobs per seed,
  seeds 1..20. Queues form, so who gets the next free node decides the mean JCT.
Why not elsewhere: where the biased jobs are much shorter or longer than the jobs they
compete with, or of other widths, a +/-25 % error rarely flips an order, and any
changed decision reshuffles the packing of mixed widths, whose JCT effect (+/-3 % per
seed) swamps the gain; in overload (load >= 1) waits grow until the aging credit and the
wait bound (jobs past 24 h go first, in submit order) order the queue whatever the
estimator says. ``--scenario size-buckets`` is the previous version of this bench: the
default synthetic trace (mixed widths, load 1.0), where two size buckets of family gpt
are biased (gpt-<2B x1.3, gpt-<8B x0.8); there the oracle's gain is about 0 +/- 4 %.

Prints JSON (figures only, never pass/fail): per seed the mean JCT of each run, overall
and per family; the oracle's gain over uncalibrated; the gain recovered,
(uncal - cal) / (uncal - oracle), and the same for the controls; the residual bias
|fitted / true - 1| per class when its 50th job finished and at the end, and the final
fit; the mean |log(actual / predicted)| of each run; and ``decisions_vs_oracle``: at
every tick of the uncalibrated and of the calibrated run, a shadow ``pipeswift`` with the
oracle estimator decides on the same cluster view, and we count the ticks whose set of
jobs to start now differs, the share of started jobs the oracle would not have started
then, and the share of pairs of pending jobs of different true bias (among the first 40
of the queue) that the two order differently (same view, different estimator: no
cascade). Summary over seeds: median, min and max; the pooled gain recovered,
sum(uncal - cal) / sum(uncal - oracle), with a seeded bootstrap over seeds (5 and 95 %),
and the same for the controls; the worst residual per class; and the mean JCT per family
(where the false priority shows: the predicted-too-short family loses it).

Run: python bench/calibration_bias.py [--seeds 1 2 3] [--jobs 800] [--scenario size-buckets]
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeswift_slurm.core.calibration import FAMILY_SUFFIX, OnlineCalibrator, family_of, fit_bias  # noqa: E402
from pipeswift_slurm.core.costmodel import CostModel  # noqa: E402
from pipeswift_slurm.core.estimator import Estimator  # noqa: E402
from pipeswift_slurm.core.hardware import DEFAULT_GPU_TYPE, get_gpu_type  # noqa: E402
from pipeswift_slurm.policy import get_policy  # noqa: E402
from pipeswift_slurm.sim.engine import SimResult, SimSettings, Simulation  # noqa: E402
from pipeswift_slurm.sim.workload import (  # noqa: E402
    Conversion,
    WorkloadJob,
    build_workload,
    read_trace,
    rescale_load,
    synthetic_trace,
)

log = logging.getLogger(__name__)

MIN_JOBS = 50
# Controls: the true ratios raised to these powers, i.e. moved ~1 % toward 1 (1.3 -> 1.287,
# 0.8 -> 0.807; about the residual a converged calibration keeps, shrinkage at confidence
# ~0.96) and ~1 % away from 1 (1.3 -> 1.314, 0.8 -> 0.793). Their JCT differs from the
# oracle's only by the cascade of the few decisions a 1 % difference changes: the noise
# floor of any "calibrated vs oracle" comparison here.
NEAR_ORACLES = (("near_oracle_shrunk", 0.96), ("near_oracle_stretched", 1.04))
SEEDS = list(range(1, 21))
BOOTSTRAP_REPS = 2000
# One band for every GPU count: two models of each family, drawn 1/4 each per job.
FAMILIES_BANDS = ((10 ** 9, ("gpt-1.3b", "llama-1b", "gpt-2.7b", "llama-3b")),)
# synthetic_trace mix: (category, share, GPU counts and weights, median s, log-sigma, min s, max s)
FAMILIES_MIX = (("finetune", 1.0, ((8, 1.0),), 3600.0, 0.8, 300.0, 12 * 3600.0),)
SCENARIOS: dict[str, dict[str, Any]] = {
    "families": {"bias": (("gpt-<", 0.8), ("gpt-swiglu-gqa-<", 1.3)), "bands": FAMILIES_BANDS,
                 "mix": FAMILIES_MIX, "load": 0.9},
    "size-buckets": {"bias": (("gpt-<2B", 1.3), ("gpt-<8B", 0.8)), "bands": None, "mix": None, "load": 1.0},
}


def parse_bias(text: str) -> tuple[tuple[str, float], ...]:
    """"gpt-<=0.8,gpt-swiglu-gqa-<=1.3" -> (("gpt-<", 0.8), ("gpt-swiglu-gqa-<", 1.3))."""
    pairs = [item.rsplit("=", 1) for item in text.split(",") if item.strip()]
    return tuple((prefix.strip(), float(value)) for prefix, value in pairs)


def true_bias(job_class: str, class_bias: tuple[tuple[str, float], ...]) -> float:
    """The class part of the truth factor (same rule as workload._truth_factor: last match wins)."""
    bias = 1.0
    for prefix, value in class_bias:
        if job_class.startswith(prefix):
            bias = value
    return bias


def load_jobs(args: argparse.Namespace, cost: CostModel, seed: int) -> list[WorkloadJob]:
    gpus = args.nodes * args.gpus_per_node
    scenario = SCENARIOS[args.scenario]
    if args.workload:
        rows = [r for r in read_trace(args.workload) if r.num_gpus <= gpus
                and (scenario["bands"] is None or r.num_gpus % 4 == 0)][:args.jobs]  # families: tp x pp | 4
        rows = rescale_load(rows, gpus, args.load)
    else:
        rows = synthetic_trace(args.jobs, gpus, args.load, seed, mix=scenario["mix"])
    conv = Conversion(cost, gpus, args.gpus_per_node, flex=args.flex, seed=seed, class_bias=args.bias,
                      noise_sigma=args.noise_sigma, bands=scenario["bands"])
    return build_workload(rows, conv, drop_oversized=True)


class ShadowOracle:
    """Wraps the policy of a run: at every tick a second ``pipeswift`` decides on the same
    view with the oracle estimator, and the differences are counted. Changes nothing."""

    def __init__(self, main: Any, oracle: Estimator, pairs_per_tick: int = 40):
        self.main, self.shadow, self.oracle = main, get_policy("pipeswift"), oracle
        self.pairs_per_tick = pairs_per_tick
        self.ticks = self.ticks_start_differs = self.started = self.started_not_by_oracle = 0
        self.pairs = self.pairs_discordant = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.main, name)

    def decide(self, view: Any, profiles: Any, estimator: Any) -> list[Any]:
        mine = self.main.decide(view, profiles, estimator)
        if sum(1 for j in view.pending if j.job_id in profiles) < 2:
            return mine  # nothing to order
        theirs = self.shadow.decide(view, profiles, self.oracle)
        self.ticks += 1
        start_a = {d.job_id for d in mine if d.predicted_start_s == view.now}
        start_b = {d.job_id for d in theirs if d.predicted_start_s == view.now}
        self.ticks_start_differs += start_a != start_b
        self.started += len(start_a)
        self.started_not_by_oracle += len(start_a - start_b)
        rank_a = _ranks(mine)
        rank_b = _ranks(theirs)
        top = [j for j in sorted(rank_a, key=rank_a.__getitem__) if j in rank_b][:self.pairs_per_tick]
        for x, y in itertools.combinations(top, 2):
            if self.oracle.bias(profiles[x].job_class) != self.oracle.bias(profiles[y].job_class):
                self.pairs += 1
                self.pairs_discordant += (rank_a[x] < rank_a[y]) != (rank_b[x] < rank_b[y])
        return mine

    def summary(self) -> dict[str, Any]:
        return {"ticks_compared": self.ticks,
                "ticks_start_set_differs_pct": _pct(self.ticks_start_differs, self.ticks),
                "started_not_by_oracle_pct": _pct(self.started_not_by_oracle, self.started),
                "cross_bias_pairs_ordered_differently_pct": _pct(self.pairs_discordant, self.pairs)}


def _ranks(decisions: list[Any]) -> dict[int, int]:
    factors = {d.job_id: d.site_factor for d in decisions if d.site_factor is not None}
    return {j: i for i, j in enumerate(sorted(factors, key=lambda j: (-factors[j], j)))}


def _median(values: list[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _round(value: Optional[float], digits: int = 3) -> Optional[float]:
    return None if value is None else round(value, digits)


def _pct(num: int, den: int) -> Optional[float]:
    return round(100.0 * num / den, 2) if den else None


def simulate(jobs: list[WorkloadJob], estimator: Estimator, cost: CostModel, settings: SimSettings,
             calibrator: Optional[OnlineCalibrator] = None,
             shadow: Optional[Estimator] = None) -> tuple[SimResult, Optional[dict[str, Any]]]:
    policy = get_policy("pipeswift")
    spy = ShadowOracle(policy, shadow) if shadow is not None else None
    sim = Simulation(jobs, spy or policy, estimator, cost, settings, calibrator=calibrator)
    result = sim.run()
    return result, (spy.summary() if spy is not None else None)


def prediction_error(result: SimResult) -> float:
    """Mean |log(actual / predicted run time)| over jobs that ran once."""
    errs = [abs(math.log((r.end_s - r.run_started_s) / r.predicted_run_s)) for r in result.records
            if r.end_s is not None and not r.restarts and r.predicted_run_s > 0]
    return statistics.fmean(errs)


def residuals(cal: OnlineCalibrator, knobs: dict[str, float],
              class_bias: tuple[tuple[str, float], ...]) -> dict[str, dict[str, Any]]:
    """Per class with >= MIN_JOBS finished: |fitted/true - 1| when the MIN_JOBS-th finished and at the end."""
    obs = sorted(cal.observations, key=lambda o: o.end_time)
    out: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for k, o in enumerate(obs):
        counts[o.job_class] = counts.get(o.job_class, 0) + 1
        if counts[o.job_class] == MIN_JOBS:
            fitted = fit_bias(obs[:k + 1], now=o.end_time, **knobs)[o.job_class].ratio
            truth = true_bias(o.job_class, class_bias)
            out[o.job_class] = {"true_ratio": truth, "fitted_at_50": round(fitted, 4),
                                "residual_at_50": round(abs(fitted / truth - 1), 4)}
    for job_class, row in out.items():
        end = cal.fit[job_class]
        row.update(fitted_end=round(end.ratio, 4), residual_end=round(abs(end.ratio / row["true_ratio"] - 1), 4),
                   jobs_end=end.n_jobs, confidence_end=round(end.confidence, 3))
    return out


def _true_of_key(key: str, classes: Iterable[str],
                 class_bias: tuple[tuple[str, float], ...]) -> Optional[float]:
    """True ratio of a fit key: a class's, or for a family entry ``F-*`` the one its
    classes share (else None)."""
    if not key.endswith(FAMILY_SUFFIX):
        return true_bias(key, class_bias)
    family = key[:-len(FAMILY_SUFFIX)]
    values = {true_bias(c, class_bias) for c in classes if family_of(c) == family}
    return values.pop() if len(values) == 1 else None


def run_seed(args: argparse.Namespace, cost: CostModel, seed: int) -> dict[str, Any]:
    jobs = load_jobs(args, cost, seed)
    settings = SimSettings(args.nodes, args.gpus_per_node)
    base = Estimator(cost, args.gpus_per_node)
    oracle = base.with_bias({j.profile.job_class: true_bias(j.profile.job_class, args.bias) for j in jobs})
    knobs = {"half_life_s": args.half_life_s, "trim": args.trim, "prior_jobs": args.prior_jobs}
    cal = OnlineCalibrator(base, refit_every=args.refit_every, **knobs)
    shadow = oracle if args.shadow else None
    runs, decisions = {}, {}
    runs["uncalibrated"], decisions["uncalibrated"] = simulate(jobs, base, cost, settings, shadow=shadow)
    runs["calibrated"], decisions["calibrated"] = simulate(jobs, base, cost, settings, cal, shadow=shadow)
    runs["oracle"], _ = simulate(jobs, oracle, cost, settings)
    for name, exponent in NEAR_ORACLES:
        near = base.with_bias({c: b ** exponent for c, b in oracle.bias_by_class.items()})
        runs[name], _ = simulate(jobs, near, cost, settings)
    jct = {k: statistics.fmean(r.jct_s for r in res.records) for k, res in runs.items()}
    gain = jct["uncalibrated"] - jct["oracle"]
    per_class: dict[str, int] = {}
    for j in jobs:
        per_class[j.profile.job_class] = per_class.get(j.profile.job_class, 0) + 1
    families = sorted({family_of(c) for c in per_class})
    out = {
        "seed": seed, "jobs": len(jobs), "jobs_per_class": dict(sorted(per_class.items())),
        "mean_jct_s": {k: round(v, 1) for k, v in jct.items()},
        "oracle_gain_pct": round(100 * gain / jct["uncalibrated"], 2),
        "calibrated_gain_pct": round(100 * (jct["uncalibrated"] - jct["calibrated"]) / jct["uncalibrated"], 2),
        "gain_recovered": _round((jct["uncalibrated"] - jct["calibrated"]) / gain if gain else None),
        "near_oracle_gain_recovered": {name: _round((jct["uncalibrated"] - jct[name]) / gain if gain else None)
                                       for name, _ in NEAR_ORACLES},
        "mean_jct_s_by_family": {f: {k: round(statistics.fmean(r.jct_s for r in res.records
                                                               if family_of(r.job_class) == f), 1)
                                     for k, res in runs.items()} for f in families},
        "residual_bias": residuals(cal, knobs, args.bias),
        "fit_end": {c: {"true_ratio": _true_of_key(c, per_class, args.bias),
                        "fitted_ratio": round(cb.ratio, 4), "jobs": cb.n_jobs} for c, cb in sorted(cal.fit.items())},
        "mean_abs_log_pred_error": {k: round(prediction_error(r), 4) for k, r in runs.items()},
        "refits": cal.refits, "skipped_observations": cal.skipped,
        "sim_wall_s": {k: round(r.wall_s, 2) for k, r in runs.items()},
    }
    if args.shadow:
        out["decisions_vs_oracle"] = decisions
    return out


def _med_range(vals: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(vals), 4), "min": round(min(vals), 4), "max": round(max(vals), 4)}


def pooled_recovered(per_seed: list[dict[str, Any]], run: str = "calibrated") -> Optional[float]:
    """sum over seeds of (uncal - run) / sum of (uncal - oracle), mean JCT."""
    num = sum(s["mean_jct_s"]["uncalibrated"] - s["mean_jct_s"][run] for s in per_seed)
    den = sum(s["mean_jct_s"]["uncalibrated"] - s["mean_jct_s"]["oracle"] for s in per_seed)
    return num / den if den else None


def bootstrap(per_seed: list[dict[str, Any]], run: str = "calibrated", reps: int = BOOTSTRAP_REPS,
              seed: int = 0) -> Optional[list[float]]:
    """5 and 95 % percentiles of the pooled gain recovered, seeds resampled with replacement
    (seeded, so the JSON is reproducible); None with fewer than 3 seeds."""
    if len(per_seed) < 3:
        return None
    rng = random.Random(seed)
    draws = (pooled_recovered(rng.choices(per_seed, k=len(per_seed)), run) for _ in range(reps))
    vals = sorted(v for v in draws if v is not None)
    return [round(vals[int(0.05 * (len(vals) - 1))], 3), round(vals[int(0.95 * (len(vals) - 1))], 3)]


def summarize_seeds(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    runs = ("uncalibrated", "calibrated", "oracle") + tuple(name for name, _ in NEAR_ORACLES)
    worst_50: dict[str, float] = {}
    worst_end: dict[str, float] = {}
    for s in per_seed:
        for job_class, row in s["residual_bias"].items():
            worst_50[job_class] = max(worst_50.get(job_class, 0.0), row["residual_at_50"])
            worst_end[job_class] = max(worst_end.get(job_class, 0.0), row["residual_end"])
    recovered = [s["gain_recovered"] for s in per_seed if s["gain_recovered"] is not None]
    pooled = pooled_recovered(per_seed)
    families = sorted({f for s in per_seed for f in s["mean_jct_s_by_family"]})
    out: dict[str, Any] = {
        "seeds": len(per_seed),
        "mean_jct_s": {k: _med_range([s["mean_jct_s"][k] for s in per_seed]) for k in runs},
        "oracle_gain_pct": _med_range([s["oracle_gain_pct"] for s in per_seed]),
        "calibrated_gain_pct": _med_range([s["calibrated_gain_pct"] for s in per_seed]),
        "gain_recovered_per_seed": _med_range(recovered) if recovered else None,
        "gain_recovered_pooled": round(pooled, 3) if pooled is not None else None,
        "gain_recovered_pooled_bootstrap_5_95": bootstrap(per_seed),
        "near_oracle_gain_recovered_pooled": {
            name: {"pooled": _round(pooled_recovered(per_seed, name)), "bootstrap_5_95": bootstrap(per_seed, name)}
            for name, _ in NEAR_ORACLES},
        "mean_jct_s_by_family_mean_over_seeds": {
            f: {k: round(statistics.fmean(s["mean_jct_s_by_family"][f][k] for s in per_seed
                                          if f in s["mean_jct_s_by_family"]), 1) for k in runs} for f in families},
        "worst_residual_at_50_by_class": dict(sorted(worst_50.items())),
        "worst_residual_end_by_class": dict(sorted(worst_end.items())),
    }
    if all("decisions_vs_oracle" in s for s in per_seed):
        out["decisions_vs_oracle_median"] = {
            run: {key: _round(_median([s["decisions_vs_oracle"][run][key] for s in per_seed]), 2)
                  for key in ("ticks_start_set_differs_pct", "started_not_by_oracle_pct",
                              "cross_bias_pairs_ordered_differently_pct")}
            for run in ("uncalibrated", "calibrated")}
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="families",
                   help="workload and bias (default families; size-buckets is the old experiment)")
    p.add_argument("--bias", type=parse_bias, default=None,
                   help="true bias as CLASS_PREFIX=RATIO,... (last match wins; default: the scenario's,"
                        " families: gpt-<=0.8,gpt-swiglu-gqa-<=1.3)")
    p.add_argument("--seeds", type=int, nargs="+", default=SEEDS, help="default 1..20")
    p.add_argument("--jobs", type=int, default=800)
    p.add_argument("--load", type=float, default=None,
                   help="offered load (GPU-time / capacity; default: the scenario's, families 0.9)")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--flex", type=float, default=1.0, help="share of jobs that allow resizing")
    p.add_argument("--noise-sigma", type=float, default=0.1, help="per-job log-normal noise of the truth")
    p.add_argument("--refit-every", type=int, default=5)
    p.add_argument("--half-life-s", type=float, default=14 * 86400.0)
    p.add_argument("--trim", type=float, default=0.2)
    p.add_argument("--prior-jobs", type=float, default=5.0)
    p.add_argument("--no-shadow", dest="shadow", action="store_false",
                   help="skip the shadow-oracle decision comparison (faster)")
    p.add_argument("--workload", help="trace CSV(.gz) instead of the synthetic generator (the scenario's"
                                      " models; families keeps rows whose GPU count is a multiple of 4)")
    args = p.parse_args(argv)
    if args.bias is None:
        args.bias = SCENARIOS[args.scenario]["bias"]
    if args.load is None:
        args.load = SCENARIOS[args.scenario]["load"]
    return args


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    wall0 = time.perf_counter()
    cost = CostModel(get_gpu_type(DEFAULT_GPU_TYPE))
    per_seed = [run_seed(args, cost, seed) for seed in args.seeds]
    scenario = SCENARIOS[args.scenario]
    out = {"bench": "calibration_bias", "policy": "pipeswift", "scenario": args.scenario,
           "class_bias": dict(args.bias),
           "workload": {"source": args.workload or "synthetic_trace", "jobs": args.jobs, "load": args.load,
                        "nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "flex": args.flex,
                        "noise_sigma": args.noise_sigma, "gpu_type": DEFAULT_GPU_TYPE,
                        "bands": scenario["bands"], "mix": scenario["mix"]},
           "calibration": {"refit_every": args.refit_every, "half_life_s": args.half_life_s, "trim": args.trim,
                           "prior_jobs": args.prior_jobs},
           "seeds": per_seed, "summary": summarize_seeds(per_seed),
           "wall_s": round(time.perf_counter() - wall0, 1)}
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
