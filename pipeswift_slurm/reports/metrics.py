"""Prometheus text exposition of a FullReport (``reports.py``), for node_exporter's
textfile collector (written with ``core.files.write_atomic``, so the collector never
reads half a file).

Owns the metric names, help texts and labels. Must not import click, SQLAlchemy or
matplotlib, and no SQL or database access.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

from pipeswift_slurm.reports.base import BiasReport, JctReport, QueueRatioReport, WaitsReport
from pipeswift_slurm.reports.queries import FullReport


# ---------------------------------------------------------------- Prometheus text format


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """Collects metric families; ``text()`` renders the exposition format."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(
        self,
        name: str,
        kind: str,
        help_text: str,
        samples: Sequence[tuple[dict[str, str], Optional[float]]],
        suffix: str = "",
    ) -> None:
        """Add # HELP / # TYPE once and a sample per (labels, value); None values are skipped."""
        self._lines += ["# HELP %s %s" % (name, help_text), "# TYPE %s %s" % (name, kind)]
        self.samples(name + suffix, samples)

    def samples(self, name: str, samples: Sequence[tuple[dict[str, str], Optional[float]]]) -> None:
        for labels, value in samples:
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            label_text = ",".join('%s="%s"' % (k, _escape_label(str(v))) for k, v in labels.items())
            self._lines.append("%s%s %s" % (name, "{%s}" % label_text if label_text else "", _number(value)))

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _jct_metrics(m: Metrics, rep: JctReport) -> None:
    rows = rep.rows + ([rep.overall] if rep.overall else [])
    m.family(
        "pipeswift_jct_seconds",
        "summary",
        "Job completion time (submit to end) of completed jobs, nearest-rank quantiles; "
        'size="all" is every job.',
        [
            ({"size": r.group, "quantile": q}, v)
            for r in rows
            for q, v in (("0.5", r.p50_s), ("0.95", r.p95_s), ("0.99", r.p99_s))
        ],
    )
    m.samples("pipeswift_jct_seconds_sum", [({"size": r.group}, r.mean_s * r.n_jobs) for r in rows])
    m.samples("pipeswift_jct_seconds_count", [({"size": r.group}, r.n_jobs) for r in rows])
    m.family(
        "pipeswift_jct_max_seconds",
        "gauge",
        "Longest JCT of a completed job.",
        [({"size": r.group}, r.max_s) for r in rows],
    )


def _wait_metrics(m: Metrics, rep: WaitsReport) -> None:
    rows = rep.rows + ([rep.overall] if rep.overall else [])
    over = rep.overall.n_over_bound if rep.overall else 0
    m.family(
        "pipeswift_jobs_over_wait_bound",
        "gauge",
        "Jobs whose wait (pending ones: so far) exceeds the bound.",
        [({}, over)],
    )
    m.family(
        "pipeswift_jobs_pending_over_wait_bound",
        "gauge",
        "Jobs still pending at the last tick that have waited past the bound (the load is beyond it).",
        [({}, rep.overall.n_pending_over_bound if rep.overall else 0)],
    )
    m.family(
        "pipeswift_wait_bound_seconds",
        "gauge",
        "The wait bound used by pipeswift_jobs_over_wait_bound.",
        [({}, rep.wait_bound_s)],
    )
    m.family(
        "pipeswift_jobs_pending",
        "gauge",
        "Jobs still pending at the last tick.",
        [({}, rep.overall.n_pending if rep.overall else 0)],
    )
    m.family(
        "pipeswift_wait_median_seconds",
        "gauge",
        "Median wait per size class.",
        [({"size": r.group}, r.median_s) for r in rows],
    )
    m.family(
        "pipeswift_wait_max_seconds",
        "gauge",
        "Longest wait per size class.",
        [({"size": r.group}, r.max_s) for r in rows],
    )


def _queue_metrics(m: Metrics, rep: QueueRatioReport, by_size: QueueRatioReport) -> None:
    m.family(
        "pipeswift_queue_ratio",
        "gauge",
        "Queue time / (queue + run) time of finished jobs in the window.",
        [({}, rep.overall.queue_ratio)],
    )
    m.family(
        "pipeswift_queue_ratio_by_size",
        "gauge",
        "Queue-time ratio per job size class.",
        [({"size": r.group}, r.queue_ratio) for r in by_size.rows],
    )
    m.family(
        "pipeswift_queue_bound",
        "gauge",
        "1 when small jobs spend more than the threshold of their JCT queued "
        "(the scheduler is the bottleneck).",
        [({}, None if rep.bound is None else float(rep.bound == "queue"))],
    )


def _bias_metrics(m: Metrics, rep: BiasReport) -> None:
    m.family(
        "pipeswift_estimator_bias",
        "gauge",
        "Median actual / predicted run time per job class.",
        [({"job_class": r.job_class}, r.median_ratio) for r in rep.rows],
    )
    m.family(
        "pipeswift_estimator_bias_jobs",
        "gauge",
        "Finished jobs behind pipeswift_estimator_bias.",
        [({"job_class": r.job_class}, r.n_jobs) for r in rep.rows],
    )
    m.family(
        "pipeswift_calibration_ratio",
        "gauge",
        "Calibration ratio the controller applies per job class.",
        [({"job_class": k}, v[0]) for k, v in rep.calibration.items()],
    )


def _tick_metrics(m: Metrics, rep: FullReport) -> None:
    t, d = rep.ticks, rep.decisions
    m.family(
        "pipeswift_last_tick_timestamp_seconds",
        "gauge",
        "When the last controller tick ran (epoch s).",
        [({}, t.last_tick_s)],
    )
    m.family(
        "pipeswift_tick_duration_seconds",
        "gauge",
        "Wall seconds the last tick took.",
        [({}, t.last_duration_s)],
    )
    m.family(
        "pipeswift_last_tick_ok",
        "gauge",
        "1 when the last tick succeeded.",
        [({}, None if t.last_status is None else float(t.last_status == "ok"))],
    )
    m.family(
        "pipeswift_ticks",
        "gauge",
        "Ticks recorded in the window, by status.",
        [({"status": "ok"}, t.n_ticks - t.n_failed), ({"status": "failed"}, t.n_failed)],
    )
    m.family(
        "pipeswift_decisions",
        "gauge",
        "Decisions in the window, by outcome.",
        [
            ({"outcome": "applied"}, d.n_applied),
            ({"outcome": "failed"}, d.n_failed),
            ({"outcome": "not_attempted"}, d.n_not_attempted),
            ({"outcome": "no_change"}, d.n_total - d.n_intended),
        ],
    )
    m.family(
        "pipeswift_decision_levers",
        "gauge",
        "Applied decisions in the window that moved each lever (requeue_reshape: a requeue into a new shape).",
        [({"lever": c.lever}, c.n_decisions) for c in d.levers],
    )
    m.family(
        "pipeswift_job_requeues_max",
        "gauge",
        "The most requeues of one job in the window (applied decisions).",
        [({}, max((j.requeues for j in d.most_requeued), default=0))],
    )
    m.family(
        "pipeswift_report_jobs", "gauge", "Jobs submitted in the report window.", [({}, rep.jobs.n_jobs)]
    )


def prometheus_text(rep: FullReport) -> str:
    """Every headline figure of a FullReport in the Prometheus text exposition format."""
    m = Metrics()
    _queue_metrics(m, rep.queue_ratio, rep.queue_ratio_by_size)
    _jct_metrics(m, rep.jct)
    _wait_metrics(m, rep.waits)
    _bias_metrics(m, rep.bias)
    _tick_metrics(m, rep)
    return m.text()
