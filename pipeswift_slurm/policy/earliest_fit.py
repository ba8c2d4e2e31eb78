"""When a job could start at the earliest were it first in the queue, node by node: the
``pipeswift`` policy's test of a job at risk of its wait bound. Pure."""

from __future__ import annotations

import math
from typing import Mapping

from pipeswift_slurm.core.model import ClusterView, ExecConfig


class EarliestFit:
    """When a job of a given shape could start at the earliest were it first in the queue:
    on ``num_nodes`` nodes with ``gpus_per_node`` free GPUs each, counting each node's GPUs
    free now (``free``, per node of ``view.nodes``) and those its running jobs release at
    their predicted ``ends`` (job id -> time). Running jobs whose nodes are unknown release
    nothing. Called as ``fit(config)``; infinite when no such time comes. Cached per shape."""

    def __init__(self, view: ClusterView, free: list[int], ends: Mapping[int, float]):
        self._now = view.now
        index = {n.name: i for i, n in enumerate(view.nodes) if n.usable}
        releases: list[list[tuple[float, int]]] = [[] for _ in free]
        for job in view.running:
            for name in job.node_list:
                if name in index:
                    releases[index[name]].append((ends[job.job_id], job.gpus // len(job.node_list)))
        self._steps = []  # per node: (time, GPUs free from then on), times ascending
        for node, events in enumerate(releases):
            steps, count = [(self._now, free[node])], free[node]
            for end_s, gpus in sorted(events):
                count += gpus
                steps.append((end_s, count))
            self._steps.append(steps)
        # every shape that ever fits does by then: when the last running job ends
        self.latest_s = max((steps[-1][0] for steps in self._steps), default=self._now)
        self._cache: dict[tuple[int, int], float] = {}

    @staticmethod
    def _node_s(steps: list[tuple[float, int]], gpus: int) -> float:
        return next((t for t, count in steps if count >= gpus), math.inf)

    def __call__(self, config: ExecConfig) -> float:
        shape = (config.num_nodes, config.gpus_per_node)
        hit = self._cache.get(shape)
        if hit is None:
            times = sorted(self._node_s(steps, shape[1]) for steps in self._steps)
            hit = times[shape[0] - 1] if 0 < shape[0] <= len(times) else math.inf
            self._cache[shape] = hit
        return hit
