"""``pipeswift report <kind>`` and ``pipeswift explain JOBID``: thin commands over
``reports``, ``explain`` and ``report_render``.

Every command reads the history database given by ``--db`` (or ``$PIPESWIFT_DB``, else
the controller's default path), never writes it, and exits 2 with one line when it is
missing or unreadable. A window without jobs is not an error: it says so and exits 0.
matplotlib is imported only when a plot or HTML file is asked for.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Optional

import click

from pipeswift_slurm.cli.common import FiniteFloatRange, Obj, fail, output_file, pass_obj
from pipeswift_slurm.cli.history_db import open_history, readable_values
from pipeswift_slurm.core.hardware import DEFAULT_GPU_TYPE
from pipeswift_slurm.policy.knobs import PipeSwiftKnobs
from pipeswift_slurm.slurm.config import DEFAULT_PATH as DEFAULT_CONFIG_PATH
from pipeswift_slurm.slurm.config import MAX_GPUS_PER_NODE

DEFAULT_DB = "/var/lib/pipeswift/pipeswift.sqlite"
BY_CHOICES = ("hour", "day", "user", "size", "partition")


def _db_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--db",
        envvar="PIPESWIFT_DB",
        default=DEFAULT_DB,
        show_default=True,
        help="History database: SQLite file or SQLAlchemy URL [env PIPESWIFT_DB].",
    )(fn)


def _report_options(default_by: Optional[str]) -> Callable[..., Any]:
    """The options every report kind shares (``--by`` only where grouping applies)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        opts = [
            _db_option,
            click.option(
                "--since", help="From this time: epoch s, ISO date/time (UTC), or -7d (before the last tick)."
            ),
            click.option("--until", help="Up to (excluding) this time; same forms as --since."),
            click.option(
                "--format",
                "fmt",
                type=click.Choice(["table", "csv", "json"]),
                default="table",
                show_default=True,
            ),
            click.option("--plot", type=click.Path(dir_okay=False), help="Also draw the figure to this PNG."),
            click.option(
                "--html",
                "html_out",
                type=click.Path(dir_okay=False),
                help="Also write one self-contained HTML report (tables + figures).",
            ),
            click.option(
                "--prometheus",
                type=click.Path(dir_okay=False),
                help="Also write every headline metric in Prometheus text format (atomically).",
            ),
            click.option(
                "-q", "--quiet", is_flag=True, help="No terminal output (with --prometheus/--plot/--html)."
            ),
            click.option(
                "--threshold",
                type=FiniteFloatRange(0, 1),
                default=0.5,
                show_default=True,
                help="Queue share of small jobs' JCT above which the verdict is queue-bound.",
            ),
            click.option(
                "--wait-bound-h",
                type=FiniteFloatRange(min=0, max=8760),
                default=PipeSwiftKnobs().wait_bound_s / 3600.0,
                show_default=True,
                help="Waits above this count as over the bound (default: the policy's wait_bound_s).",
            ),
        ]
        if default_by is not None:
            opts.append(
                click.option(
                    "--by",
                    type=click.Choice(BY_CHOICES),
                    default=default_by,
                    show_default=True,
                    help="Group rows by submission hour/day, user, size class or partition.",
                )
            )
        for opt in reversed(opts):
            fn = opt(fn)
        return fn

    return decorate


@click.group()
def report() -> None:
    """Where the time goes: queue-time ratio, JCT, waits, estimator bias, decisions.

    Example: pipeswift report all --db pipeswift.sqlite --since 2024-06-01 --html report.html
    """


def _window(store: Any, since: Optional[str], until: Optional[str]) -> Any:
    from pipeswift_slurm.reports.queries import ReportError, Window, history_now_s

    latest = history_now_s(store)
    try:
        from pipeswift_slurm.reports.queries import parse_time

        window = Window(parse_time(since, latest), parse_time(until, latest))
    except ReportError as exc:
        fail("--since/--until: %s" % exc)
    if window.since_s is not None and window.until_s is not None and window.until_s <= window.since_s:
        fail("--until must be later than --since")
    return window


def _compute(kind: str, store: Any, window: Any, o: dict[str, Any]) -> Any:
    from pipeswift_slurm.reports import queries as r

    bound_s = o["wait_bound_h"] * 3600.0
    by = o.get("by")
    builders: dict[str, Callable[[], Any]] = {
        "queue-ratio": lambda: r.queue_ratio(store, window, by, o["threshold"]),
        "jct": lambda: r.jct(store, window, by),
        "waits": lambda: r.waits(store, window, by, bound_s),
        "bias": lambda: r.bias(store, window),
        "decisions": lambda: r.decisions(
            store, window, o.get("job"), o.get("limit") or 50, o.get("all_kinds", False)
        ),
        "all": lambda: r.full_report(
            store, window, by or "day", o["threshold"], bound_s, o.get("limit") or 20
        ),
    }
    return builders[kind]()


def _tables(kind: str, data: Any) -> list[Any]:
    from pipeswift_slurm.reports import render as rr

    makers: dict[str, Callable[[Any], Any]] = {
        "queue-ratio": rr.queue_ratio_table,
        "jct": rr.jct_table,
        "waits": rr.waits_table,
        "bias": rr.bias_table,
    }
    if kind == "all":
        return rr.full_tables(data)
    return rr.decisions_tables(data) if kind == "decisions" else [makers[kind](data)]


def _is_empty(kind: str, store: Any, window: Any, data: Any) -> bool:
    from pipeswift_slurm.reports.queries import job_count

    if kind == "decisions":
        return bool(data.n_total == 0)
    return job_count(store, window).n_jobs == 0


def _empty_line(kind: str, window: Any, db: str) -> str:
    from pipeswift_slurm.reports.render import window_text

    what = "decisions" if kind == "decisions" else "jobs"
    span = window_text(window)
    return "no %s recorded%s in %s" % (what, " " + span if span else "", db)


def run_report(kind: str, o: dict[str, Any]) -> None:
    """Compute one report kind and write every output asked for."""
    from pipeswift_slurm.reports import render as rr

    outputs = {"--plot": o.get("plot"), "--html": o.get("html_out"), "--prometheus": o.get("prometheus")}
    for what, path in outputs.items():  # before any work: never onto the history or each other
        if path is not None:
            output_file(path, what, (o["db"], *(other for name, other in outputs.items() if name != what)))
    store = open_history(o["db"])
    with readable_values(o["db"]):
        window = _window(store, o.get("since"), o.get("until"))
        if o.get("prometheus"):
            _write_prometheus(store, window, o)
        data = _compute(kind, store, window, o)
        if _is_empty(kind, store, window, data):
            line = _empty_line(kind, window, o["db"])
            if o.get("html_out"):
                _save(o["html_out"], rr.html_report("pipeswift report", [line], [], []))
            click.echo(line, err=o["fmt"] != "table" or o["quiet"])
            if o["fmt"] != "table" and not o["quiet"]:
                _print(kind, data, o["fmt"])  # a program reading the output still gets its (empty) tables
            return
        if not o["quiet"]:
            _print(kind, data, o["fmt"])
        if o.get("plot") or o.get("html_out"):
            _figures(kind, store, window, data, o)


def _print(kind: str, data: Any, fmt: str) -> None:
    from pipeswift_slurm.reports import render as rr

    if fmt == "json":
        click.echo(rr.json_text(data))
    elif fmt == "csv":
        click.echo(rr.csv_tables(_tables(kind, data)), nl=False)
    else:
        click.echo(rr.text_tables(_tables(kind, data)))


def _save(path: str, content: Any) -> None:
    """Write an output file the command was asked for (atomically, never into a device)."""
    from pipeswift_slurm.core.files import write_atomic

    try:
        write_atomic(path, content)
    except OSError as exc:
        fail("cannot write %s: %s" % (path, exc.strerror or exc), 1)


def _figures(kind: str, store: Any, window: Any, data: Any, o: dict[str, Any]) -> None:
    from pipeswift_slurm.reports import render as rr
    from pipeswift_slurm.reports.queries import jct_values

    jcts = (
        jct_values(store, window, o.get("by") or "size")
        if kind == "jct"
        else (jct_values(store, window, "size") if kind == "all" else None)
    )
    try:
        fig = rr.figure(kind, data, jcts)
    except RuntimeError as exc:  # matplotlib missing
        fail(str(exc), 1)
    png = rr.png_bytes(fig)
    if o.get("plot"):
        _save(o["plot"], png)
    if o.get("html_out"):
        intro = ["jobs submitted %s" % (rr.window_text(window) or "at any time")]
        if kind in ("all", "queue-ratio"):
            intro.insert(0, (data.queue_ratio if kind == "all" else data).verdict)
        _save(o["html_out"], rr.html_report("pipeswift report: %s" % kind, intro, _tables(kind, data), [(kind, png)]))


def _write_prometheus(store: Any, window: Any, o: dict[str, Any]) -> None:
    from pipeswift_slurm.reports import render as rr
    from pipeswift_slurm.reports.queries import full_report

    rep = full_report(store, window, "size", o["threshold"], o["wait_bound_h"] * 3600.0, 1)
    _save(o["prometheus"], rr.prometheus_text(rep))


_DOCS = {
    "queue-ratio": "Queue time / JCT per hour (or --by), with the verdict: queue-bound or execution-bound.",
    "jct": "JCT distribution (mean, P50, P95, P99, max) per size class (or --by).",
    "waits": "Waits (median, max, jobs over the bound) per size class (or --by), pending jobs included.",
    "bias": "Estimator bias per job class: actual / predicted run time, with counts and calibration.",
    "decisions": "The decision log: what was changed, when, why, and whether it was applied.",
    "all": "Every report: queue ratio by day (or --by), by size and per hour; JCT; waits; bias; decisions.",
}


def _command(kind: str, default_by: Optional[str], extra: tuple[Callable[..., Any], ...] = ()) -> None:
    """Register ``pipeswift report <kind>`` with the shared options (plus ``extra``)."""

    def cmd(obj: Obj, **options: Any) -> None:
        run_report(kind, options)

    cmd.__name__ = kind.replace("-", "_")
    fn: Callable[..., Any] = pass_obj(cmd)
    for opt in reversed(extra):
        fn = opt(fn)
    fn = _report_options(default_by)(fn)
    report.command(kind, help=_DOCS[kind])(fn)


_LIMIT = click.option(  # clamped: a larger limit lists the same rows, and SQLite's LIMIT is 64-bit
    "--limit", type=click.IntRange(min=1, max=2**31, clamp=True),
    help="Most decisions listed (default 50; 20 in 'all').",
)
JOB_ID = click.IntRange(min=0, max=2**32 - 1)  # Slurm's job ids are 32 bits
_command("queue-ratio", "hour")
_command("jct", "size")
_command("waits", "size")
_command("bias", None)
_command(
    "decisions",
    None,
    (
        click.option("--job", type=JOB_ID, help="Only this job's decisions."),
        click.option("--all-kinds", is_flag=True, help="Also list decisions that changed nothing."),
        _LIMIT,
    ),
)
_command("all", "day", (_LIMIT,))


@report.command("sql")
@click.argument("name")
def admin_sql(name: str) -> None:
    """Print admin query NAME (as sql/NAME.sql in the source tree), for sqlite3 or psql:
    queue_ratio_by_hour, jct_by_size_class, waits, estimator_bias or decisions; or the
    history's tables as SQLite DDL, with what each column holds: schema.

    Example: pipeswift report sql waits | sqlite3 -header -column /var/lib/pipeswift/pipeswift.sqlite
    """
    from pipeswift_slurm.reports.admin_sql import NAMES, render

    if name not in NAMES:
        fail("no admin query %r; choose one of: %s" % (name[:40], ", ".join(NAMES)))
    click.echo(render(name), nl=False)


def _controller_config(gpu_type: Optional[str]) -> Any:
    """The controller's config, read once for ``explain``: a bad one is one line and exit 2,
    unless ``--gpu-type`` lets explain run without it (then None)."""
    from pipeswift_slurm.slurm.config import ConfigError, load_config

    try:
        return load_config()
    except ConfigError as exc:
        if gpu_type:
            return None
        fail(str(exc))


def _gpu_of_partition(obj: Obj, gpu_type: Optional[str], cfg: Any) -> Callable[[str], Any]:
    """Partition -> the GpuType ``explain`` predicts on: ``--gpu-type`` for every partition,
    else what the controller's config ``cfg`` plans that partition on."""
    if gpu_type:
        gpu = obj.gpu(gpu_type)
        return lambda partition: gpu
    from pipeswift_slurm.cli.controller import partition_gpu
    from pipeswift_slurm.core.hardware import HardwareError

    def gpu_of(partition: str) -> Any:
        try:
            return partition_gpu(cfg, obj, partition)
        except HardwareError as exc:
            fail("%s: GPU type of partition %s: %s" % (cfg.source, partition, exc))
    return gpu_of


@click.command()
@click.argument("job_id", type=JOB_ID)
@_db_option
@click.option("--gpu-type", help="The GPU type to predict on. Default: the job's partition's in the controller's"
              " config ([slurm.partition_gpu_types], else [slurm] gpu_type; $PIPESWIFT_CONFIG or %s), else %s."
              % (DEFAULT_CONFIG_PATH, DEFAULT_GPU_TYPE))
@click.option("--gpus-per-node", type=click.IntRange(1, MAX_GPUS_PER_NODE), help="Default: from the last tick (else 8).")
@click.option(
    "--top", type=click.IntRange(min=1), default=8, show_default=True, help="Candidate configs listed."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (stable keys).")
@pass_obj
def explain(
    obj: Obj, job_id: int, db: str, gpu_type: Optional[str], gpus_per_node: Optional[int], top: int, as_json: bool
) -> None:
    """Why a job waits or runs as it does: state and reason, predicted start and end, the
    candidate configs with their predicted run times, and the chosen one."""
    from dataclasses import asdict

    from pipeswift_slurm.core.fmt import json_text
    from pipeswift_slurm.reports.explain import UnknownJob, explain_job
    from pipeswift_slurm.reports.render import explain_text

    store = open_history(db)
    cfg = _controller_config(gpu_type)
    try:
        with readable_values(db):
            expl = explain_job(store, job_id, _gpu_of_partition(obj, gpu_type, cfg), gpus_per_node, top,
                               own_layout_first=cfg is not None and cfg.own_layout_first)
            text = json_text(asdict(expl), indent=2) if as_json else explain_text(expl)
    except UnknownJob:
        fail(
            "job %d is not in the history DB %s (the controller has not seen it yet, or wrong --db)"
            % (job_id, db)
        )
    click.echo(text)
    sys.stdout.flush()
