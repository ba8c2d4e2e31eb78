"""Turn report rows (``reports.py``) and explanations (``explain.py``) into output:
terminal tables, CSV, JSON, PNG figures, one self-contained HTML file, and Prometheus
text for node_exporter's textfile collector.

It owns presentation only: no SQL, no database access. matplotlib is imported lazily
inside the plotting functions (figures are built with ``matplotlib.figure.Figure`` on the
Agg canvas, never through pyplot's global state), so tables and Prometheus output work
without it. Must not import click or SQLAlchemy.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import logging
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Optional

from .fmt import duration, table
from .reports import (
    BiasReport,
    DecisionsReport,
    FullReport,
    JctReport,
    QueueRatioReport,
    TickStats,
    WaitsReport,
    Window,
)

log = logging.getLogger(__name__)

# Columns holding epoch timestamps (shown as UTC times, not durations).
TIME_COLUMNS = frozenset(
    {"at_s", "predicted_start_s", "predicted_end_s", "last_tick_s", "submit_s", "start_s", "end_s"}
)


@dataclass(frozen=True)
class Table:
    """A titled table of raw values (seconds, ratios), with notes shown around it."""

    name: str
    title: str
    headers: list[str]
    rows: list[list[Any]]
    notes: list[str] = field(default_factory=list)


def utc(epoch_s: Optional[float]) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SS`` UTC ('-' for None)."""
    if epoch_s is None:
        return "-"
    return datetime.fromtimestamp(float(epoch_s), tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def window_text(window: Window) -> str:
    """'between A and B UTC', 'since A UTC', 'before B UTC', or '' for all time."""
    since, until = window.since_s, window.until_s
    if since is not None and until is not None:
        return "between %s and %s UTC" % (utc(since), utc(until))
    if since is not None:
        return "since %s UTC" % utc(since)
    if until is not None:
        return "before %s UTC" % utc(until)
    return ""


def _human(header: str, value: Any) -> Any:
    if value is None:
        return None
    if header in TIME_COLUMNS:
        return utc(value)
    if header.endswith("_s") and isinstance(value, (int, float)):
        return "%.3gs" % value if 0 < value < 10 else duration(float(value))
    if header.endswith("ratio") and isinstance(value, float):
        return "%.3f" % value
    return value


# ---------------------------------------------------------------- tables


def queue_ratio_table(rep: QueueRatioReport) -> Table:
    headers = [rep.by, "n_jobs", "queue_s", "run_s", "queue_ratio", "mean_job_ratio"]
    rows = [
        [r.group, r.n_jobs, r.queue_s, r.run_s, r.queue_ratio, r.mean_job_ratio]
        for r in rep.rows + [rep.overall]
    ]
    small = rep.small
    notes = [
        rep.verdict,
        "small jobs: %d, queue ratio %s (threshold %.2f)"
        % (small.n_jobs, "-" if small.queue_ratio is None else "%.3f" % small.queue_ratio, rep.threshold),
    ]
    return Table(
        "queue_ratio_by_%s" % rep.by, "Queue-time ratio (queue / JCT) by %s" % rep.by, headers, rows, notes
    )


def jct_table(rep: JctReport) -> Table:
    headers = [rep.by, "n_jobs", "mean_s", "p50_s", "p95_s", "p99_s", "max_s", "mean_queue_s"]
    rows = [
        [r.group, r.n_jobs, r.mean_s, r.p50_s, r.p95_s, r.p99_s, r.max_s, r.mean_queue_s]
        for r in rep.rows + ([rep.overall] if rep.overall else [])
    ]
    return Table(
        "jct_by_%s" % rep.by,
        "Job completion time (submit to end) by %s" % rep.by,
        headers,
        rows,
        ["completed jobs only; percentiles are nearest-rank"],
    )


def waits_table(rep: WaitsReport) -> Table:
    headers = [
        rep.by,
        "n_jobs",
        "n_pending",
        "mean_s",
        "median_s",
        "max_s",
        "max_wait_job_id",
        "n_over_bound",
    ]
    rows = [
        [r.group, r.n_jobs, r.n_pending, r.mean_s, r.median_s, r.max_s, r.max_job_id, r.n_over_bound]
        for r in rep.rows + ([rep.overall] if rep.overall else [])
    ]
    over = rep.overall.n_over_bound if rep.overall else 0
    notes = [
        "%d job(s) waited over the bound of %s; pending waits measured to %s"
        % (over, duration(rep.wait_bound_s), utc(rep.now_s))
    ]
    return Table("waits_by_%s" % rep.by, "Waits by %s (pending jobs included)" % rep.by, headers, rows, notes)


def bias_table(rep: BiasReport) -> Table:
    headers = [
        "job_class",
        "n_jobs",
        "mean_ratio",
        "median_ratio",
        "min_ratio",
        "max_ratio",
        "calibrated_ratio",
        "calibrated_on",
    ]
    rows = [
        [
            r.job_class,
            r.n_jobs,
            r.mean_ratio,
            r.median_ratio,
            r.min_ratio,
            r.max_ratio,
            r.calibrated_ratio,
            r.calibrated_on,
        ]
        for r in rep.rows
    ]
    notes = ["ratio = actual / predicted run time; above 1: jobs ran longer than predicted"]
    seen = {r.job_class for r in rep.rows}
    extra = ["%s %.3f (on %d jobs)" % (k, v[0], v[1]) for k, v in rep.calibration.items() if k not in seen]
    if extra:
        notes.append("calibrated classes without finished jobs here: " + ", ".join(extra))
    return Table("estimator_bias", "Estimator bias per job class", headers, rows, notes)


def decisions_table(rep: DecisionsReport) -> Table:
    headers = [
        "id",
        "tick_id",
        "at_s",
        "job_id",
        "user",
        "kind",
        "config",
        "gpus",
        "site_factor",
        "time_limit_s",
        "outcome",
        "reason",
        "error",
    ]
    rows = [
        [
            d.id,
            d.tick_id,
            d.at_s,
            d.job_id,
            d.user,
            d.kind,
            d.config,
            d.gpus,
            d.site_factor,
            d.time_limit_s,
            d.outcome,
            d.reason,
            d.error,
        ]
        for d in rep.rows
    ]
    notes = [
        "%d decision(s) in the window: %d moved a lever, %d applied, %d FAILED, %d not attempted; latest %d "
        "shown" % (rep.n_total, rep.n_intended, rep.n_applied, rep.n_failed, rep.n_not_attempted, len(rows))
    ]
    return Table("decisions", "Decision log (newest first)", headers, rows, notes)


def ticks_table(stats: TickStats) -> Table:
    headers = ["n_ticks", "n_failed", "last_tick_s", "last_duration_s", "mean_duration_s", "last_status"]
    rows = [
        [
            stats.n_ticks,
            stats.n_failed,
            stats.last_tick_s,
            stats.last_duration_s,
            stats.mean_duration_s,
            stats.last_status,
        ]
    ]
    return Table("ticks", "Controller ticks", headers, rows)


def full_tables(rep: FullReport) -> list[Table]:
    """Every table of ``pipeswift report all``, in display order."""
    return [
        queue_ratio_table(rep.queue_ratio),
        queue_ratio_table(rep.queue_ratio_by_size),
        jct_table(rep.jct),
        waits_table(rep.waits),
        bias_table(rep.bias),
        decisions_table(rep.decisions),
        ticks_table(rep.ticks),
    ]


def text_tables(tables: Sequence[Table]) -> str:
    """Readable terminal output: title, table, notes; durations human, times UTC."""
    parts = []
    for t in tables:
        rows = [[_human(h, v) for h, v in zip(t.headers, row, strict=True)] for row in t.rows]
        body = table(t.headers, rows) if rows else "(no rows)"
        parts.append("\n".join(["== %s" % t.title, body] + ["  " + n for n in t.notes]))
    return "\n\n".join(parts)


def csv_tables(tables: Sequence[Table]) -> str:
    """CSV with raw values (seconds, ratios); several tables are separated by '# name' lines."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for i, t in enumerate(tables):
        if len(tables) > 1:
            out.write("%s# %s\n" % ("\n" if i else "", t.name))
        writer.writerow(t.headers)
        writer.writerows([["" if v is None else v for v in row] for row in t.rows])
    return out.getvalue()


def json_text(report: Any) -> str:
    """A report dataclass as JSON (full precision; times in epoch seconds)."""
    return json.dumps(asdict(report), indent=2, default=str)


# ---------------------------------------------------------------- figures (matplotlib, lazily)


def _figure(n_axes: int = 1, width_in: float = 8.0, height_in: float = 4.5) -> Any:
    """A pyplot-free Figure with ``n_axes`` stacked axes (Agg canvas)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise RuntimeError("plots need matplotlib: pip install 'pipeswift-slurm[plot]'") from exc
    fig = Figure(figsize=(width_in, height_in * n_axes))
    fig.subplots(n_axes, 1, squeeze=False)
    return fig


def draw_queue_ratio(ax: Any, rep: QueueRatioReport) -> None:
    """Queue ratio per bucket as a curve (hour/day) or per group as bars, threshold dashed."""
    rows = [r for r in rep.rows if r.queue_ratio is not None]
    if rep.by in ("hour", "day") and rows:
        x = [datetime.fromtimestamp(r.bucket_s or 0.0, tz=UTC) for r in rows]
        ax.plot(x, [r.queue_ratio for r in rows], marker=".", linewidth=1.2, label="queue / JCT")
        ax.set_xlabel("submission %s (UTC)" % rep.by)
        ax.tick_params(axis="x", labelrotation=30)
    else:
        ax.bar([r.group for r in rows], [r.queue_ratio for r in rows], label="queue / JCT")
        ax.set_xlabel(rep.by)
        ax.tick_params(axis="x", labelrotation=45)
    ax.axhline(
        rep.threshold, color="tab:red", linestyle="--", linewidth=1, label="threshold %.2f" % rep.threshold
    )
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("queue-time ratio")
    ax.set_title("Queue-time ratio by %s: %s" % (rep.by, "%s-bound" % rep.bound if rep.bound else "no data"))
    ax.legend(loc="best")
    ax.grid(True, alpha=0.3)


def draw_jct_cdf(ax: Any, values: dict[str, list[float]]) -> None:
    """JCT CDF per group (one step line each), log time axis in hours."""
    for group, jcts in values.items():
        hours = sorted(max(v, 1.0) / 3600.0 for v in jcts)
        if hours:
            ax.step(
                hours,
                [(i + 1) / len(hours) for i in range(len(hours))],
                where="post",
                label="%s (%d)" % (group, len(hours)),
            )
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT distribution")
    ax.grid(True, alpha=0.3)
    if values:
        ax.legend(loc="lower right")


def draw_waits(ax: Any, rep: WaitsReport) -> None:
    """Median and max wait (hours) per group, side by side bars, bound dashed."""
    groups = [r.group for r in rep.rows]
    xs = list(range(len(groups)))
    ax.bar([x - 0.2 for x in xs], [r.median_s / 3600.0 for r in rep.rows], width=0.4, label="median")
    ax.bar([x + 0.2 for x in xs], [r.max_s / 3600.0 for r in rep.rows], width=0.4, label="max")
    ax.axhline(rep.wait_bound_s / 3600.0, color="tab:red", linestyle="--", linewidth=1, label="bound")
    ax.set_xticks(xs, groups)
    ax.set_ylabel("wait (hours)")
    ax.set_title("Waits by %s" % rep.by)
    ax.legend(loc="best")
    ax.grid(True, axis="y", alpha=0.3)


def draw_bias(ax: Any, rep: BiasReport) -> None:
    """Median actual/predicted ratio per job class as bars; 1.0 (unbiased) dashed."""
    ax.bar(
        [r.job_class for r in rep.rows], [r.median_ratio for r in rep.rows], label="median actual / predicted"
    )
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="unbiased")
    ax.set_ylabel("actual / predicted run time")
    ax.set_title("Estimator bias per job class")
    ax.tick_params(axis="x", labelrotation=30)
    ax.legend(loc="best")
    ax.grid(True, axis="y", alpha=0.3)


def draw_decisions(ax: Any, rep: DecisionsReport) -> None:
    """Decisions in the window by outcome (bars)."""
    names = ["applied", "FAILED", "not attempted", "no change"]
    counts = [rep.n_applied, rep.n_failed, rep.n_not_attempted, rep.n_total - rep.n_intended]
    ax.bar(names, counts, color=["tab:green", "tab:red", "tab:gray", "tab:blue"])
    ax.set_ylabel("decisions")
    ax.set_title("Decisions by outcome (%d in the window)" % rep.n_total)
    ax.grid(True, axis="y", alpha=0.3)


def figure(kind: str, data: Any, jct_by_group: Optional[dict[str, list[float]]] = None) -> Any:
    """The Figure for one report kind (``data`` is that kind's report; for "all" a FullReport).

    ``jct_by_group`` (``reports.jct_values``) feeds the JCT CDF for kinds "jct" and "all".
    """
    if kind == "all":
        fig = _figure(4, height_in=3.6)
        axes = fig.axes
        draw_queue_ratio(axes[0], data.queue_ratio_by_hour)
        draw_jct_cdf(axes[1], jct_by_group or {})
        draw_waits(axes[2], data.waits)
        draw_bias(axes[3], data.bias)
    else:
        fig = _figure(1)
        drawers = {
            "queue-ratio": draw_queue_ratio,
            "waits": draw_waits,
            "bias": draw_bias,
            "decisions": draw_decisions,
        }
        if kind == "jct":
            draw_jct_cdf(fig.axes[0], jct_by_group or {})
        else:
            drawers[kind](fig.axes[0], data)
    fig.tight_layout()
    return fig


def png_bytes(fig: Any, dpi: int = 100) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def save_png(fig: Any, path: str, dpi: int = 100) -> None:
    """Write the figure as a PNG file."""
    Path(path).write_bytes(png_bytes(fig, dpi))


# ---------------------------------------------------------------- HTML

_CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:.5em 0}"
    "th,td{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#eee}"
    "td:first-child,th:first-child{text-align:left}.note{color:#444}.verdict{font-weight:bold}"
)


def html_table(t: Table) -> str:
    """One Table as an HTML <table> (human cells, escaped)."""
    head = "".join("<th>%s</th>" % html.escape(h) for h in t.headers)
    body = "".join(
        "<tr>%s</tr>"
        % "".join(
            "<td>%s</td>" % html.escape("-" if c is None else str(c))
            for c in (_human(h, v) for h, v in zip(t.headers, row, strict=True))
        )
        for row in t.rows
    )
    notes = "".join('<p class="note">%s</p>' % html.escape(n) for n in t.notes)
    return "<h2>%s</h2>\n%s\n<table><tr>%s</tr>%s</table>" % (html.escape(t.title), notes, head, body)


def html_img(png: bytes, alt: str) -> str:
    return '<img src="data:image/png;base64,%s" alt="%s">' % (
        base64.b64encode(png).decode(),
        html.escape(alt),
    )


def html_report(
    title: str, intro: Sequence[str], tables: Sequence[Table], figures: Sequence[tuple[str, bytes]]
) -> str:
    """One self-contained HTML page: intro lines, figures (base64 PNG), then the tables."""
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8"><title>%s</title><style>%s</style></head><body>'
        % (html.escape(title), _CSS),
        "<h1>%s</h1>" % html.escape(title),
    ]
    parts += ['<p class="verdict">%s</p>' % html.escape(line) for line in intro]
    parts += [
        "<figure>%s<figcaption>%s</figcaption></figure>" % (html_img(png, alt), html.escape(alt))
        for alt, png in figures
    ]
    parts += [html_table(t) for t in tables]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- Prometheus text format


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Metrics:
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


def _jct_metrics(m: _Metrics, rep: JctReport) -> None:
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


def _wait_metrics(m: _Metrics, rep: WaitsReport) -> None:
    rows = rep.rows + ([rep.overall] if rep.overall else [])
    over = rep.overall.n_over_bound if rep.overall else 0
    m.family(
        "pipeswift_jobs_over_wait_bound",
        "gauge",
        "Jobs whose wait (pending ones: so far) exceeds the bound.",
        [({}, over)],
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


def _queue_metrics(m: _Metrics, rep: QueueRatioReport, by_size: QueueRatioReport) -> None:
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


def _bias_metrics(m: _Metrics, rep: BiasReport) -> None:
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


def _tick_metrics(m: _Metrics, rep: FullReport) -> None:
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
        "pipeswift_report_jobs", "gauge", "Jobs submitted in the report window.", [({}, rep.jobs.n_jobs)]
    )


def prometheus_text(rep: FullReport) -> str:
    """Every headline figure of a FullReport in the Prometheus text exposition format."""
    m = _Metrics()
    _queue_metrics(m, rep.queue_ratio, rep.queue_ratio_by_size)
    _jct_metrics(m, rep.jct)
    _wait_metrics(m, rep.waits)
    _bias_metrics(m, rep.bias)
    _tick_metrics(m, rep)
    return m.text()


def write_atomic(path: str, content: str) -> None:
    """Write ``content`` to ``path`` via a temp file in the same folder and a rename, so a
    reader (node_exporter's textfile collector) never sees a half-written file."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % target.name, suffix=".tmp", dir=str(target.parent or "."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------- explain


def explain_text(e: Any) -> str:
    """``pipeswift explain`` for the terminal: state, predictions, why, candidates."""
    lines = [
        "job %d (%s, user %s%s): %s"
        % (
            e.job_id,
            e.name or "-",
            e.user or "-",
            ", partition %s" % e.partition if e.partition else "",
            e.summary,
        )
    ]
    lines.append("  submitted %s; started %s; ended %s" % (utc(e.submit_s), utc(e.start_s), utc(e.end_s)))
    if e.end_s is None:
        lines.append(
            "  predicted start %s, predicted completion %s%s"
            % (
                utc(e.predicted_start_s),
                utc(e.predicted_end_s),
                " (JCT %s)" % duration(e.predicted_end_s - e.submit_s)
                if e.predicted_end_s and e.submit_s is not None
                else "",
            )
        )
    elif e.predicted_run_s and e.run_s:
        lines.append(
            "  predicted run time %s, actual %s (actual / predicted %.2f)"
            % (duration(e.predicted_run_s), duration(e.run_s), e.run_s / e.predicted_run_s)
        )
    lines.append(
        "  config: %s%s"
        % (
            e.chosen_config or "-",
            "" if e.chosen_applied is not None or not e.chosen_config else " (not applied)",
        )
    )
    lines.append("  why: %s" % e.why)
    lines.append(
        "  decisions recorded: %d%s"
        % (e.n_decisions, ", latest at %s" % utc(e.last_decision_s) if e.last_decision_s is not None else "")
    )
    if e.profile_error:
        lines.append("  profile: %s" % e.profile_error)
    if e.candidates:
        lines.append(
            "\ncandidate configs on %s, %d GPUs per node (GPU range %d-%d), by predicted run time:"
            % (e.gpu_type, e.gpus_per_node, e.gpu_range[0], e.gpu_range[1])
        )
        lines.append(
            table(
                ["", "gpus", "config", "iter_s", "run_time", "GPU·h", "bubble", "mem_GiB", "fits_now"],
                [
                    [
                        "*" if c.chosen else ("u" if c.requested else ""),
                        c.gpus,
                        c.config,
                        c.iter_time_s,
                        duration(c.run_s),
                        c.gpu_hours,
                        c.bubble_fraction,
                        c.mem_gib,
                        {None: "-", True: "yes", False: "no"}[c.fits_free_now],
                    ]
                    for c in e.candidates
                ],
            )
        )
        lines.append("  * chosen   u the user's own config   fits_now: fits the GPUs free at the last tick")
    return "\n".join(lines)
