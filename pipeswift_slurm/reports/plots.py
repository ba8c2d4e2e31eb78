"""PNG figures of the admin reports (``reports.py``): queue ratio, JCT CDF, waits,
estimator bias and decisions, one Figure per report kind or all stacked.

Owns the plotting only. matplotlib is imported lazily inside ``_figure`` (figures are built
with ``matplotlib.figure.Figure`` on the Agg canvas, never through pyplot's global state),
so importing this module needs no matplotlib. Must not import click or SQLAlchemy, and no
SQL or database access.
"""

from __future__ import annotations

import io
from typing import Any, Optional

from pipeswift_slurm.core.fmt import utc_datetime, visible
from pipeswift_slurm.reports.base import QueueRatioRow
from pipeswift_slurm.reports.queries import (
    BiasReport,
    DecisionsReport,
    QueueRatioReport,
    WaitsReport,
)

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


ROLLING_WINDOW_S = 6 * 3600.0  # the hourly curve's smoothing window


def rolling_ratio(rows: list[QueueRatioRow], window_s: float = ROLLING_WINDOW_S) -> list[Optional[float]]:
    """Per bucket, queue / JCT over the buckets that start in the ``window_s`` up to and
    including it (sums of queue and run time, so busy hours weigh more); None when the
    window holds no job time."""
    out: list[Optional[float]] = []
    for row in rows:
        end = row.bucket_s or 0.0
        inside = [r for r in rows if end - window_s < (r.bucket_s or 0.0) <= end]
        queue_s, total_s = sum(r.queue_s for r in inside), sum(r.queue_s + r.run_s for r in inside)
        out.append(queue_s / total_s if total_s > 0 else None)
    return out


def draw_queue_ratio(ax: Any, rep: QueueRatioReport) -> None:
    """Queue ratio per bucket as a curve (hour/day) or per group as bars, threshold dashed.
    By hour, the hourly values are faint and a 6-hour rolling ratio is the curve."""
    rows = [r for r in rep.rows if r.queue_ratio is not None]
    if rep.by == "hour" and rows:
        x = [utc_datetime(r.bucket_s or 0.0) for r in rows]
        ax.plot(x, [r.queue_ratio for r in rows], marker=".", linewidth=0.6, alpha=0.35, color="tab:blue",
                label="hourly")
        ax.plot(x, rolling_ratio(rows), linewidth=2.0, color="tab:blue",
                label="queue / JCT, %d-hour rolling" % (ROLLING_WINDOW_S // 3600))
        ax.set_xlabel("submission hour (UTC)")
        ax.tick_params(axis="x", labelrotation=30)
    elif rep.by == "day" and rows:
        x = [utc_datetime(r.bucket_s or 0.0) for r in rows]
        ax.plot(x, [r.queue_ratio for r in rows], marker=".", linewidth=1.2, label="queue / JCT")
        ax.set_xlabel("submission %s (UTC)" % rep.by)
        ax.tick_params(axis="x", labelrotation=30)
    else:
        ax.bar([_shown(r.group) for r in rows], [r.queue_ratio for r in rows], label="queue / JCT")
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


def _shown(name: Any) -> str:
    """A group or class name as a label: its control characters escaped (``visible``) and
    its ``$`` too, which matplotlib would read as the start of a formula (bad TeX in a
    name a user chose failed the whole report)."""
    return visible(str(name)).replace("$", r"\$")


def draw_jct_cdf(ax: Any, values: dict[str, list[float]]) -> None:
    """JCT CDF per group (one step line each), log time axis in hours."""
    for group, jcts in values.items():
        hours = sorted(max(v, 1.0) / 3600.0 for v in jcts)
        if hours:
            ax.step(
                hours,
                [(i + 1) / len(hours) for i in range(len(hours))],
                where="post",
                label="%s (%d)" % (_shown(group), len(hours)),
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
    groups = [_shown(r.group) for r in rep.rows]
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
        [_shown(r.job_class) for r in rep.rows], [r.median_ratio for r in rep.rows], label="median actual / predicted"
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
    """Write the figure as a PNG file (``core.files.write_atomic``: never into a device).

    Raises:
        OSError: it cannot be written there.
    """
    from pipeswift_slurm.core.files import write_atomic

    write_atomic(path, png_bytes(fig, dpi))
