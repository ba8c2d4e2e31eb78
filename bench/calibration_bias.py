"""Bench: does online calibration remove a per-class bias of the run-time estimator?

True run times = cost model x class bias x noise (sim/workload.py ``Conversion``): one
class runs +30 % longer than predicted, another -20 % shorter. The same seeded workload
runs under ``pipeswift`` three times:
  uncalibrated  the cost model alone (the bias is unknown);
  calibrated    OnlineCalibrator: learns from jobs as they finish, swaps
                ``sim.controller.estimator`` every ``--refit-every`` finished jobs;
  oracle        the estimator with the true class bias map.
Prints JSON: mean JCT of each, gain recovered = (uncal - cal) / (uncal - oracle), the
residual bias |fitted / true - 1| per class once 50 jobs of it have finished (and at the
end), the mean |log(actual / predicted)| of each run's predictions, and the share of job
pairs of different classes whose predicted run-time order matches the true order.
Figures only; never pass/fail.

Note on the classes: the zoo models the synthetic generator uses (<= 64 GPUs) are all of
family "gpt" (llama-70b, family "gpt-swiglu-gqa", is only drawn for >= 128-GPU jobs), so
the two biased "families" are two size buckets: gpt-<2B (760M, 1.3B) and gpt-<8B (2.7B,
6.7B), each with > 50 jobs in a 500-job trace (about 180 each).

``oracle_distance_closed`` = 1 - sum|cal - oracle| / sum|uncal - oracle| over seeds
(mean JCT): how far calibration moved the outcome to the oracle's, whatever its sign;
``gain_recovered`` is ill-conditioned when the oracle's gain is near 0.

Run: python bench/calibration_bias.py [--seeds 1 2 3] [--jobs 800] [--workload FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from typing import Any, Optional

from pipeswift_slurm.calibration import OnlineCalibrator, fit_bias
from pipeswift_slurm.costmodel import CostModel
from pipeswift_slurm.estimator import Estimator
from pipeswift_slurm.hardware import DEFAULT_GPU_TYPE, get_gpu_type
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.sim.engine import SimResult, SimSettings, Simulation
from pipeswift_slurm.sim.workload import (
    Conversion,
    WorkloadJob,
    build_workload,
    read_trace,
    rescale_load,
    synthetic_trace,
)

log = logging.getLogger(__name__)

CLASS_BIAS = (("gpt-<2B", 1.3), ("gpt-<8B", 0.8))
MIN_JOBS = 50


def parse_bias(text: str) -> tuple[tuple[str, float], ...]:
    """"gpt-<2B=1.3,gpt-<8B=0.8" -> (("gpt-<2B", 1.3), ("gpt-<8B", 0.8))."""
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
    if args.workload:
        rows = [r for r in read_trace(args.workload) if r.num_gpus <= gpus][:args.jobs]
        rows = rescale_load(rows, gpus, args.load)
    else:
        rows = synthetic_trace(args.jobs, gpus, args.load, seed)
    conv = Conversion(cost, gpus, args.gpus_per_node, flex=args.flex, seed=seed, class_bias=args.bias,
                      noise_sigma=args.noise_sigma)
    return build_workload(rows, conv, drop_oversized=True)


def simulate(jobs: list[WorkloadJob], estimator: Estimator, cost: CostModel, settings: SimSettings,
             calibrator: Optional[OnlineCalibrator] = None) -> SimResult:
    sim = Simulation(jobs, get_policy("pipeswift"), estimator, cost, settings)
    if calibrator is not None:
        calibrator.attach(sim)
    return sim.run()


def prediction_error(result: SimResult) -> float:
    """Mean |log(actual / predicted run time)| over jobs that ran once."""
    errs = [abs(math.log((r.end_s - r.run_started_s) / r.predicted_run_s)) for r in result.records
            if r.end_s is not None and not r.restarts and r.predicted_run_s > 0]
    return statistics.fmean(errs)


def order_agreement(jobs: list[WorkloadJob], estimator: Estimator, cost: CostModel) -> float:
    """Share of job pairs of different classes whose predicted run-time order (user's
    config) is the true order: what SJF-style ordering sees."""
    pred = [(j.profile.job_class, estimator.run_time_s(j.profile, j.profile.requested),
             cost.job_time_s(j.profile, j.profile.requested) * j.truth_factor) for j in jobs]
    agree = total = 0
    for i, (ci, pi, ti) in enumerate(pred):
        for cj, pj, tj in pred[i + 1:]:
            if ci != cj:
                total += 1
                agree += (pi < pj) == (ti < tj)
    return agree / total if total else float("nan")


def residuals(cal: OnlineCalibrator, knobs: dict[str, float], class_bias: tuple[tuple[str, float], ...]) -> dict[str, dict[str, Any]]:
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


def run_seed(args: argparse.Namespace, cost: CostModel, seed: int) -> dict[str, Any]:
    jobs = load_jobs(args, cost, seed)
    settings = SimSettings(args.nodes, args.gpus_per_node)
    base = Estimator(cost, args.gpus_per_node)
    oracle = base.with_bias({j.profile.job_class: true_bias(j.profile.job_class, args.bias) for j in jobs})
    knobs = {"half_life_s": args.half_life_s, "trim": args.trim, "prior_jobs": args.prior_jobs}
    cal = OnlineCalibrator(base, refit_every=args.refit_every, **knobs)
    runs = {"uncalibrated": simulate(jobs, base, cost, settings), "calibrated": simulate(jobs, base, cost, settings, cal),
            "oracle": simulate(jobs, oracle, cost, settings)}
    jct = {k: statistics.fmean(r.jct_s for r in res.records) for k, res in runs.items()}
    gain = jct["uncalibrated"] - jct["oracle"]
    per_class: dict[str, int] = {}
    for j in jobs:
        per_class[j.profile.job_class] = per_class.get(j.profile.job_class, 0) + 1
    biased = sorted({c for c in per_class if true_bias(c, args.bias) != 1.0})
    return {
        "seed": seed, "jobs": len(jobs), "jobs_per_class": dict(sorted(per_class.items())),
        "mean_jct_s": {k: round(v, 1) for k, v in jct.items()},
        "oracle_gain_pct": round(100 * gain / jct["uncalibrated"], 2),
        "calibrated_gain_pct": round(100 * (jct["uncalibrated"] - jct["calibrated"]) / jct["uncalibrated"], 2),
        "gain_recovered": round((jct["uncalibrated"] - jct["calibrated"]) / gain, 3) if gain else None,
        "mean_jct_s_biased_classes": {c: {k: round(statistics.fmean(r.jct_s for r in res.records if r.job_class == c), 1)
                                          for k, res in runs.items()} for c in biased},
        "residual_bias": residuals(cal, knobs, args.bias),
        "mean_abs_log_pred_error": {k: round(prediction_error(r), 4) for k, r in runs.items()},
        "pair_order_agreement": {"uncalibrated": round(order_agreement(jobs, base, cost), 4),
                                 "calibrated_final": round(order_agreement(jobs, cal.estimator(), cost), 4),
                                 "oracle": round(order_agreement(jobs, oracle, cost), 4)},
        "refits": cal.refits, "skipped_observations": cal.skipped,
        "sim_wall_s": {k: round(r.wall_s, 2) for k, r in runs.items()},
    }


def summarize_seeds(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> Optional[float]:
        vals = [s[key] for s in per_seed if s[key] is not None]
        return round(statistics.median(vals), 4) if vals else None

    def spread(key: str) -> list[float]:
        vals = [s[key] for s in per_seed]
        return [min(vals), max(vals)]

    # sign-agnostic: how much of the distance |uncal - oracle| in mean JCT calibration closed
    dist_uncal = sum(abs(s["mean_jct_s"]["uncalibrated"] - s["mean_jct_s"]["oracle"]) for s in per_seed)
    dist_cal = sum(abs(s["mean_jct_s"]["calibrated"] - s["mean_jct_s"]["oracle"]) for s in per_seed)
    worst: dict[str, float] = {}
    for s in per_seed:
        for job_class, row in s["residual_bias"].items():
            worst[job_class] = max(worst.get(job_class, 0.0), row["residual_at_50"])
    return {"median_oracle_gain_pct": med("oracle_gain_pct"), "median_calibrated_gain_pct": med("calibrated_gain_pct"),
            "median_gain_recovered": med("gain_recovered"),
            "oracle_gain_pct_range": spread("oracle_gain_pct"),
            "oracle_distance_closed": round(1 - dist_cal / dist_uncal, 3) if dist_uncal else None,
            "worst_residual_at_50_by_class": dict(sorted(worst.items()))}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bias", type=parse_bias, default=CLASS_BIAS,
                   help="true class bias as PREFIX=RATIO,... (default gpt-<2B=1.3,gpt-<8B=0.8)")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(1, 11)))
    p.add_argument("--jobs", type=int, default=800)
    p.add_argument("--load", type=float, default=1.0, help="offered load (GPU-time / capacity)")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--flex", type=float, default=1.0, help="share of jobs that allow resizing")
    p.add_argument("--noise-sigma", type=float, default=0.1, help="per-job log-normal noise of the truth")
    p.add_argument("--refit-every", type=int, default=5)
    p.add_argument("--half-life-s", type=float, default=14 * 86400.0)
    p.add_argument("--trim", type=float, default=0.2)
    p.add_argument("--prior-jobs", type=float, default=5.0)
    p.add_argument("--workload", help="trace CSV(.gz) instead of the synthetic generator")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    wall0 = time.perf_counter()
    cost = CostModel(get_gpu_type(DEFAULT_GPU_TYPE))
    per_seed = [run_seed(args, cost, seed) for seed in args.seeds]
    out = {"bench": "calibration_bias", "policy": "pipeswift", "class_bias": dict(args.bias),
           "workload": {"source": args.workload or "synthetic_trace", "jobs": args.jobs, "load": args.load,
                        "nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "flex": args.flex,
                        "noise_sigma": args.noise_sigma, "gpu_type": DEFAULT_GPU_TYPE},
           "calibration": {"refit_every": args.refit_every, "half_life_s": args.half_life_s, "trim": args.trim,
                           "prior_jobs": args.prior_jobs},
           "seeds": per_seed, "summary": summarize_seeds(per_seed),
           "wall_s": round(time.perf_counter() - wall0, 1)}
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
