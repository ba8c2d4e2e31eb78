"""Issue 25's goal for learned corrections on a small synthetic set: after 20 finished runs
of a class, how far off are the predictions of its layouts that none of those runs used?

The truth's error depends on the layout: log(true / model) = a class offset (N(0, 0.2))
+ one term per tp, pp, micro-batch and vp value (each N(0, 0.075)), plus 3 % run noise;
4 users. Printed per seed set (10 seeds): |corrected / true - 1| over the unseen layouts
(median, 90th percentile, max), with the class term alone, and with the cost model alone.
The same set is the unit test ``test_goal_unseen_layouts_within_10_percent_after_20_runs``.

    python3 bench/layout_learning.py [--runs 20] [--seeds 10]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics

from pipeswift_slurm.core.calibration import Observation, fit_bias, lookup_bias
from pipeswift_slurm.core.layout_fit import layout_features
from pipeswift_slurm.core.model import ExecConfig

LEVELS = {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "mbs": [1, 2], "vp": [1, 2]}


def one_seed(seed: int, runs: int) -> dict[str, list[float]]:
    rng = random.Random(seed)
    terms = {(f, v): rng.gauss(0.0, 0.075) for f, vs in LEVELS.items() for v in vs}
    offset = rng.gauss(0.0, 0.2)
    layouts = list(itertools.product(*LEVELS.values()))
    truth = {l: offset + sum(terms[(f, v)] for f, v in zip(LEVELS, l)) for l in layouts}
    cfg = {l: ExecConfig(tp=l[0], pp=l[1], dp=1, micro_batch_size=l[2], num_micro_batches=8, vp=l[3]) for l in layouts}
    seen = [rng.choice(layouts) for _ in range(runs)]
    data = [Observation("gpt-<2B", 100.0, 100.0 * math.exp(truth[l] + rng.gauss(0.0, 0.03)), 0.0, "u%d" % (i % 4),
                        layout_features(cfg[l])) for i, l in enumerate(seen)]
    bias = {k: c.ratio for k, c in fit_bias(data, now=0.0).items()}
    unseen = [l for l in layouts if l not in seen]
    return {"learned": [abs(lookup_bias(bias, "gpt-<2B", cfg[l]) / math.exp(truth[l]) - 1) for l in unseen],
            "class term only": [abs(lookup_bias(bias, "gpt-<2B") / math.exp(truth[l]) - 1) for l in unseen],
            "cost model": [abs(1.0 / math.exp(truth[l]) - 1) for l in unseen]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    per = [one_seed(s, args.runs) for s in range(1, args.seeds + 1)]
    for name in per[0]:
        p90 = [sorted(p[name])[int(0.9 * (len(p[name]) - 1))] for p in per]
        print("%-16s median %5.1f %%  p90 %5.1f %% (median over seeds; worst seed %5.1f %%)  max %5.1f %%" % (
            name, 100 * statistics.median(x for p in per for x in p[name]), 100 * statistics.median(p90),
            100 * max(p90), 100 * max(x for p in per for x in p[name])))


if __name__ == "__main__":
    main()
