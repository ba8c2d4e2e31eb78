"""The table ``pipeswift simulate`` and ``pipeswift demo`` print: one row per policy, one unit
per duration column (named in its header), the workload line above it and the legend below."""

from __future__ import annotations

from typing import Any

import click

from pipeswift_slurm.cli.sim_notes import worst_users_line
from pipeswift_slurm.core.fmt import utc_datetime


def utc_date(epoch_s: float) -> str:
    """'2024-05-01' (UTC) of ``epoch_s``; the time of day too when it is not midnight."""
    stamp = utc_datetime(epoch_s)
    return stamp.strftime("%Y-%m-%d" if epoch_s % 86400 == 0 else "%Y-%m-%d %H:%M:%S")


# (header, metric key) of the duration columns, in table order after "vs BASE"
DURATION_COLUMNS = (("mean JCT", "mean_jct_s"), ("median", "median_jct_s"), ("P99", "p99_jct_s"),
                    ("P99 large", "p99_jct_s_large"), ("mean queue", "mean_queue_s"))


def comparison_table(comp: Any) -> str:
    """The per-policy table: one unit per duration column, named in its header."""
    from pipeswift_slurm.core.fmt import duration_column, table

    base = next((m for m in comp.metrics if m["policy"] == "slurm"), comp.metrics[0])
    columns = {}
    for header, key in DURATION_COLUMNS + (("max wait", "max_wait_s"),):
        unit, cells = duration_column([m[key] for m in comp.metrics])
        columns[header] = ("%s (%s)" % (header, unit), cells)
    headers = ["policy", columns["mean JCT"][0], "vs " + base["policy"]]
    headers += [columns[h][0] for h, _ in DURATION_COLUMNS[1:]]
    mixed = bool(comp.workload.get("partitions"))
    headers += ["queue ratio", columns["max wait"][0], "GPU util", "resized", "restarts"]
    headers += ["moved"] * mixed + ["decide ms"]
    rows = []
    for i, m in enumerate(comp.metrics):
        rows.append([m["policy"], columns["mean JCT"][1][i], "%.2f" % (m["mean_jct_s"] / base["mean_jct_s"])]
                    + [columns[h][1][i] for h, _ in DURATION_COLUMNS[1:]]
                    + ["%.2f" % (m["queue_ratio"] or 0), columns["max wait"][1][i],
                       "%.2f" % (m["gpu_utilisation"] or 0), m["reconfigured_jobs"], m["restarts"]]
                    + [m["moved_partition_jobs"]] * mixed + ["%.2f" % (m["decide_ms_mean"] or 0)])
    return table(headers, rows)


def legend(base: str, mixed: bool = False) -> str:
    """What the columns of ``comparison_table`` mean (units are in the headers)."""
    items = [
        ("vs " + base, "mean JCT over %s's mean JCT (below 1 is better)" % base),
        ("P99", "99th percentile JCT; P99 large: the same over large jobs (32 GPU-hours and more)"),
        ("mean queue", "mean time a job spends not running (waiting, and again after a requeue)"),
        ("queue ratio", "total time not running / total JCT, over all jobs"),
        ("max wait", "the longest any job spent not running"),
        ("GPU util", "busy GPU-time / (cluster GPUs x time to the last job's end)"),
        ("resized", "jobs run on another GPU count than they asked for"),
        ("restarts", "requeues of running jobs (a preempted job starts again from its checkpoint)"),
    ] + [("moved", "jobs run in another partition than they were submitted to")] * mixed + [
        ("decide ms", "mean time the policy took per controller tick, in milliseconds"),
    ]
    width = max(len(name) for name, _ in items)
    return "\n".join(["columns: JCT = job completion time, submit to end; durations in the unit of their header"]
                     + ["  %s  %s" % (name.ljust(width), text) for name, text in items])


def print_comparison(comp: Any) -> None:
    from pipeswift_slurm.core.fmt import duration

    w = comp.workload
    click.echo("workload: %s, %d jobs (%d flexible) over %.1f days from %s, offered load %.2f; lower bound mean"
               " JCT %s" % (w["source"], w["jobs"], w["flexible_jobs"], w["span_days"], utc_date(w["start_epoch_s"]),
                            w["offered_load"], duration(w["lower_bound_mean_jct_s"])))
    if w.get("partitions"):
        click.echo("partitions: %s; %d jobs allow several" % (", ".join(w["partitions"]), w["multi_partition_jobs"]))
    click.echo(comparison_table(comp))
    if worst_users_line(comp):
        click.echo(worst_users_line(comp))
    base = next((m["policy"] for m in comp.metrics if m["policy"] == "slurm"), comp.metrics[0]["policy"])
    click.echo(legend(base, bool(w.get("partitions"))))
