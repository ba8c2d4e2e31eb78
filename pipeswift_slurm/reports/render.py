"""Turn report rows (``reports.py``) and explanations (``explain.py``) into output:
terminal tables, CSV, JSON and one self-contained HTML file. PNG figures are
``report_plots`` and Prometheus text is ``report_metrics`` (both re-exported here).

It owns presentation only: no SQL, no database access. It never imports matplotlib (the
HTML page takes figures as PNG bytes), so tables work without it. Must not import click
or SQLAlchemy.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import logging
from collections.abc import Sequence
from dataclasses import asdict, astuple, dataclass, field, fields
from typing import Any, Optional

from pipeswift_slurm.core.fmt import csv_text, duration, table, utc_datetime, visible
from pipeswift_slurm.core.fmt import json_text as fmt_json
from pipeswift_slurm.reports.metrics import Metrics, prometheus_text  # noqa: F401
from pipeswift_slurm.reports.plots import draw_bias, draw_decisions, draw_jct_cdf, draw_queue_ratio  # noqa: F401
from pipeswift_slurm.reports.plots import draw_waits, figure, png_bytes, save_png  # noqa: F401
from pipeswift_slurm.reports.queries import (
    BiasReport,
    BiasRow,
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
    return utc_datetime(epoch_s).strftime("%Y-%m-%d %H:%M:%S")


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
    headers = [f.name for f in fields(BiasRow)]
    rows = [list(astuple(r)) for r in rep.rows]
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


def levers_table(rep: DecisionsReport) -> Table:
    """Applied decisions per lever moved, and the jobs requeued most: how often the
    controller restarted running jobs (preemption, reshape) and held or released jobs."""
    rows = [[c.lever, c.n_decisions, c.n_jobs] for c in rep.levers]
    tally = {c.lever: c for c in rep.levers}
    notes = []
    requeue, reshape = tally.get("requeue"), tally.get("requeue_reshape")
    if requeue is not None and requeue.n_decisions:
        moved = reshape.n_decisions if reshape is not None else 0
        notes.append("requeues: %d on %d job(s), %d into a new shape (reshape), %d without (preemption); "
                     "a requeued job restarts from its last checkpoint"
                     % (requeue.n_decisions, requeue.n_jobs, moved, requeue.n_decisions - moved))
    if not any(c.n_decisions for c in rep.levers) and rep.n_not_attempted:
        notes.append("no decision was applied in the window (%d not attempted: a dry run?); these counts are of "
                     "applied decisions" % rep.n_not_attempted)
    if rep.most_requeued:
        notes.append("requeued most: " + ", ".join("job %d (%s) %d x" % (j.job_id, j.user or "?", j.requeues)
                                                   for j in rep.most_requeued))
    return Table("levers", "Levers moved (applied decisions in the window)", ["lever", "decisions", "jobs"],
                 rows, notes)


def decisions_tables(rep: DecisionsReport) -> list[Table]:
    """The decision log, then the levers it moved."""
    return [decisions_table(rep), levers_table(rep)]


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
        *decisions_tables(rep.decisions),
        ticks_table(rep.ticks),
    ]


def text_tables(tables: Sequence[Table]) -> str:
    """Readable terminal output: title, table, notes; durations human, times UTC."""
    parts = []
    for t in tables:
        rows = [[_human(h, v) for h, v in zip(t.headers, row, strict=True)] for row in t.rows]
        body = table(t.headers, rows) if rows else "(no rows)"
        parts.append("\n".join(["== %s" % t.title, body] + ["  " + visible(n) for n in t.notes]))
    return "\n\n".join(parts)


def csv_tables(tables: Sequence[Table]) -> str:
    """CSV with raw values (seconds, ratios); several tables are separated by '# name' lines."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for i, t in enumerate(tables):
        if len(tables) > 1:
            out.write("%s# %s\n" % ("\n" if i else "", t.name))
        writer.writerow(t.headers)
        writer.writerows([["" if v is None else csv_text(v) if isinstance(v, str) else v for v in row] for row in t.rows])
    return out.getvalue()


def json_text(report: Any) -> str:
    """A report dataclass as JSON (full precision; times in epoch seconds)."""
    return fmt_json(asdict(report), indent=2, default=str)


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
            "<td>%s</td>" % html.escape("-" if c is None else visible(str(c)))
            for c in (_human(h, v) for h, v in zip(t.headers, row, strict=True))
        )
        for row in t.rows
    )
    notes = "".join('<p class="note">%s</p>' % html.escape(visible(n)) for n in t.notes)
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
    text = [visible(line) for line in lines]  # one line each: a value's own newline is escaped
    if e.candidates:
        text.append("")
        text.append(visible(
            "candidate configs on %s, %d GPUs per node (GPU range %d-%d), by predicted run time:"
            % (e.gpu_type, e.gpus_per_node, e.gpu_range[0], e.gpu_range[1])
        ))
        text.append(
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
        text.append("  * chosen   u the user's own config   fits_now: fits the GPUs free at the last tick")
    return "\n".join(text)  # the table escapes its own cells
