"""The simulator's truth where it differs from the cost model by config SHAPE.

Some parallel layouts really run faster or slower than the cost model predicts (a kernel
that suits one micro-batch size, a pipeline schedule that overlaps better): the truth
multiplies the predicted iteration time of a config by a factor of its shape, log-normal
with sigma ``--truth-shape-noise``, drawn once per (seed, shape key), so every policy of
one run, and every job, sees the same factor for the same shape, the user's own layout
included.

The shape key is (tp, pp, cp, micro-batch size, virtual pipeline stages). The data-parallel
size (the GPU count) is NOT part of it: the factor stands for how well a layout runs, which
the model's scaling over data parallelism already covers; so resizing a job keeps its
layout's factor, and only a change of layout draws another. The factor applies to the
iteration time only (startup and checkpoint loading do not depend on the layout), on top
of the per-job factor (class bias x noise, ``workload.py``). Sigma 0 (the default): every
factor is 1 and the truth is the cost model.

``user_favour`` F (``--truth-user-favour``, default 1) says users run tuned recipes: the
shape a job asked for really runs F times faster than the model predicts (on top of its
shape factor), any other shape does not; F > 1 makes every change of layout a worse bet.
Pure.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Any, Optional

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.hardware import GpuType
from pipeswift_slurm.core.model import ExecConfig, JobProfile

# The widest log-normal sigma of a truth error (per job or per shape): 1 already puts one job
# in a hundred past 10 x its prediction; wider ones make run times astronomical (a simulation
# of three jobs at sigma 10 never ends, and e**(sigma x z) overflows from about 700).
MAX_TRUTH_SIGMA = 1.0

ShapeKey = tuple[int, int, int, int, int]


def shape_key(config: ExecConfig) -> ShapeKey:
    """(tp, pp, cp, micro-batch size, vp) of a config: what its shape factor is drawn for."""
    return (config.tp, config.pp, config.cp, config.micro_batch_size, config.vp)


@functools.lru_cache(maxsize=4096)
def _draw(seed: int, sigma: float, key: ShapeKey) -> float:
    rng = random.Random("shape:%d:%s" % (seed, ",".join(map(str, key))))
    return math.exp(rng.gauss(0.0, sigma))


@dataclass(frozen=True)
class ShapeNoise:
    """The seeded true/predicted factor of each config shape (see the module docstring)."""

    sigma: float = 0.0
    seed: int = 0
    user_favour: float = 1.0

    def factor(self, config: ExecConfig, requested: Optional[ExecConfig] = None) -> float:
        """True / predicted iteration time of ``config``'s shape (1 when sigma is 0), for a
        job that asked for ``requested`` (its shape gets ``user_favour``; None: no job's)."""
        drawn = _draw(self.seed, self.sigma, shape_key(config)) if self.sigma > 0 else 1.0
        if self.user_favour != 1.0 and requested is not None and shape_key(requested) == shape_key(config):
            return drawn / self.user_favour
        return drawn


class TruthModel(CostModel):
    """The cost model with each config's iteration time times its shape factor (and
    ``gpu_factor``: how much slower than predicted every config runs on this GPU type, the
    model's error for one partition of a mixed cluster, ``--truth-partition-factor``):
    what the simulator's true run times (engine) and the lower bound (metrics) are computed
    with."""

    def __init__(self, gpu: GpuType, shape: ShapeNoise = ShapeNoise(), layer_profile: Optional[Any] = None,
                 gpu_factor: float = 1.0):
        super().__init__(gpu, layer_profile=layer_profile)
        self.shape = shape
        self.gpu_factor = gpu_factor

    def iter_time_s(self, profile: JobProfile, cfg: ExecConfig) -> float:
        return super().iter_time_s(profile, cfg) * self.shape.factor(cfg, profile.requested) * self.gpu_factor
