"""``pipeswift simulate`` and ``pipeswift demo``: thin commands over sim.runner."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import click

from pipeswift_slurm.cli.common import FiniteFloatRange, Obj, fail, hand_over_history, output_file, pass_obj
from pipeswift_slurm.cli.sim_notes import bound_warning, learn_line
from pipeswift_slurm.cli.sim_options import knobs_option, policies_option, ratios_option, start_option
from pipeswift_slurm.cli.sim_table import print_comparison, utc_date
from pipeswift_slurm.core.fmt import json_text
from pipeswift_slurm.core.hardware import DEFAULT_GPU_TYPE
from pipeswift_slurm.core.model import COMPLETED
from pipeswift_slurm.core.request import MAX_GPUS


def on_terminal() -> bool:
    """True when both stdout and stderr are a terminal: only then is a progress bar drawn."""
    return sys.stdout.isatty() and sys.stderr.isatty()


class Progress:
    """A stderr progress bar of jobs finished, over every policy run of a comparison.

    Pass ``start`` as the runner's ``on_start`` and ``tick`` as its ``on_tick``. Drawn only
    when ``enabled`` (a terminal; see ``on_terminal``); otherwise every call does nothing.
    """

    def __init__(self, runs: int, enabled: bool):
        self.runs = runs
        self.enabled = enabled
        self.bar: Any = None

    def start(self, policy: str, jobs: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            self.bar = click.progressbar(length=max(1, self.runs * jobs), file=sys.stderr, width=30,
                                         label="simulating", show_eta=True)
            self.bar.__enter__()
        self.bar.label = "simulating %-16s" % policy

    def tick(self, policy: str, now: float, report: Any) -> None:
        if self.bar is not None:
            self.bar.update(sum(1 for job in report.view.jobs if job.state == COMPLETED))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def history_file(db: str) -> Path:
    """``--db`` as the SQLite file a simulation writes; a server's URL: one line, exit 2 (its
    made-up jobs would mix with, or overwrite, a controller's real history there)."""
    from pipeswift_slurm.store.history import shown_url, sqlite_path

    if not db.strip():
        fail("--db %r: give a file name, e.g. --db sim.sqlite" % db)
    path = sqlite_path(db)
    if path is not None:
        output_file(str(path), "--db", database=True)
    if path is None:
        fail("--db %s: a simulation writes its history to a new SQLite file, never to a database server"
             " (its made-up jobs would mix with a controller's history there): give a file path, e.g."
             " --db sim.sqlite, and read it with pipeswift report all --db sim.sqlite" % shown_url(db))
    return path


def history_paths(db: str, policies: Sequence[str]) -> dict[str, Path]:
    """Where each policy's history goes: pipeswift's (else the first policy's) to exactly
    ``db`` (a file: ``history_file``), so ``pipeswift report ... --db`` with the same path
    reads it; each other one beside it as ``<stem>.<policy><suffix>``."""
    main = "pipeswift" if "pipeswift" in policies else policies[0]
    first = history_file(db)
    return {p: first if p == main else first.with_name(
        "%s.%s%s" % (first.stem, p.replace(":", "-"), first.suffix or ".sqlite")) for p in policies}


def refuse_non_history(path: Path) -> None:
    """Exit 2 (one line) when ``path`` holds a file that a simulation did not write: a
    simulation replaces its own history file, and must never delete anything else (another
    file, or a controller's history)."""
    from pipeswift_slurm.store.history import not_a_history
    from pipeswift_slurm.store.simulated import written_by_simulation

    why = not_a_history(path)
    if not why and path.exists() and not written_by_simulation(path):
        why = "a controller's history (a simulation writes its own file)"
    if why:
        fail("--db %s: %s; it is left alone: give a new file name" % (path, why))


def _run(spec: Any, db: Optional[str]) -> Any:
    from pipeswift_slurm.sim.runner import run_comparison
    from pipeswift_slurm.sim.workload import WorkloadError

    stores: dict[str, Any] = {}
    paths = history_paths(db, spec.policies) if db else {}
    for path in paths.values():
        refuse_non_history(path)
    if len(paths) > 1:
        click.echo("histories: %s" % ", ".join("%s in %s" % (p, path) for p, path in paths.items()), err=True)

    def store_for(policy: str) -> Any:
        from pipeswift_slurm.store.simulated import new_simulated_history

        stores[policy] = new_simulated_history(paths[policy])
        return stores[policy]

    progress = Progress(len(spec.policies), on_terminal())
    try:
        try:
            return run_comparison(spec, store_for=store_for if db else None, on_tick=progress.tick,
                                  on_start=progress.start)
        finally:
            progress.close()  # before any error line
            for store in stores.values():
                hand_over_history(store)
    except WorkloadError as exc:
        fail(str(exc))
    except RuntimeError as exc:
        fail(str(exc), 1)


def comparison_json(comp: Any) -> dict[str, Any]:
    spec = comp.spec
    return {"spec": {"gpus": spec.gpus, "gpus_per_node": spec.gpus_per_node, "gpu_type": spec.gpu.name if spec.gpu
                     else DEFAULT_GPU_TYPE, "workload": spec.workload or (spec.history.source if spec.history is not None
                                                                     else "synthetic"), "load": spec.load,
                     "seed": spec.seed, "start_day": spec.start_day, "window_days": spec.window_days,
                     "flex": spec.flex, "layouts": spec.layouts, "tick_interval_s": spec.tick_interval_s,
                     "ticks_on_events": spec.ticks_on_events, "first_look_s": spec.first_look_s,
                     "wait_bound_s": spec.wait_bound_s,
                     "truth_noise": spec.noise_sigma, "truth_shape_noise": spec.shape_sigma,
                     "truth_user_favour": spec.user_favour, "slurm": spec.slurm.as_dict(),
                     "partitions": [p.text() for p in spec.partitions], "partition_flex": spec.partition_flex,
                     "truth_partition_factors": dict(spec.partition_truth),
                     "start": utc_date(comp.workload["start_epoch_s"])},
            "workload": comp.workload, "policies": comp.metrics,
            **({"what_changed": comp.changed} if comp.changed is not None else {})}


def plot_cdf(comp: Any, path: str) -> None:
    """JCT CDF per policy to a PNG (drawn as ``report jct --plot`` draws it)."""
    from pipeswift_slurm.reports.plots import figure, save_png

    try:
        fig = figure("jct", None, {r.policy: [rec.jct_s for rec in r.records] for r in comp.results})
    except RuntimeError as exc:  # no matplotlib
        fail(str(exc), 1)
    try:
        save_png(fig, path, dpi=110)
    except OSError as exc:
        fail("--plot %s: cannot write it (%s)" % (path, exc.strerror or exc))


def _outputs(comp: Any, json_out: Optional[str], plot: Optional[str]) -> None:
    if json_out:
        text = json_text(comparison_json(comp), indent=2)
        if json_out == "-":
            click.echo(text)
        else:
            try:
                Path(json_out).write_text(text + "\n")
            except OSError as exc:
                fail("--json %s: cannot write it (%s)" % (json_out, exc.strerror or exc))
    if plot:
        plot_cdf(comp, plot)


@click.command()
@click.option("--workload", type=click.Path(exists=True, dir_okay=False),
              help="Trace CSV (optionally .gz) in the shared schema; default: the synthetic LLM cluster.")
@click.option("--sacct", "sacct_file", type=click.Path(dir_okay=False),
              help="Replay the site's own history from this `sacct --json` file (Slurm 22.05 or 24.11): jobs"
              " with a psbatch profile as flexible Megatron jobs, every other job as it ran; adds what would"
              " have changed per user and job class.")
@click.option("--history", "history_db", metavar="DB",
              help="Replay the controller's own history database (a file or URL) the same way as --sacct.")
@click.option("--slurm-config", metavar="FILE", help="The site's `scontrol show config` output or slurm.conf:"
              " the simulated Slurm's priority weights and backfill settings [default: Slurm's own].")
@click.option("--jobs", "synthetic_jobs", type=click.IntRange(min=1, max=1_000_000), default=400, show_default=True,
              help="Jobs of the synthetic workload.")
@click.option("--gpus", type=click.IntRange(min=1, max=MAX_GPUS), default=64, show_default=True)
@click.option("--gpus-per-node", type=click.IntRange(min=1, max=MAX_GPUS), help="[default: the --config's, else 8]")
@click.option("--gpu-type", help="[default: the --config's, else %s]" % DEFAULT_GPU_TYPE)
@click.option("--partition", "partition_items", multiple=True, metavar="NAME=GPU_TYPE:NODESxGPUS",
              help="A mixed cluster, one partition per option (e.g. a100=A100-80GB:4x8); replaces --gpus,"
              " --gpus-per-node and --gpu-type. Each job is submitted to one partition it fits in.")
@click.option("--partition-flex", type=FiniteFloatRange(0, 1), default=1.0, show_default=True,
              help="With --partition: share of jobs that allow every partition they fit in (pipeswift may"
              " move them; the baselines keep each job where it was submitted).")
@click.option("--truth-partition-factor", "partition_truth", multiple=True, metavar="NAME=RATIO",
              help="With --partition: every config really runs RATIO times the predicted iteration time there.")
@click.option("--load", type=FiniteFloatRange(min=0.01, max=100), help="Rescale arrivals to this offered load (synthetic"
              " default 0.9; traces keep their own times unless given).")
@click.option("--policy", "policy_text", default="fifo,slurm,sjf,tiresias,pipeswift", show_default=True,
              help="Policies to compare. BASE:NAME runs BASE under that name, with the preset knobs of"
              " pipeswift:preempt (requeue allowed), pipeswift:order, pipeswift:config, else its defaults.")
@click.option("--knob", "knob_items", multiple=True, metavar="POLICY.NAME=VALUE",
              help="Set a policy knob for one entry of --policy, e.g. pipeswift:preempt.preempt_margin=0.3.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Also run the controller's policy as this config sets it ([policy] name and knobs,"
              " [controller] allow_requeue, [slurm] gpu_type and gpus_per_node), named POLICY:site.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--start", "start_epoch_s", callback=lambda _c, _p, v: start_option(v), metavar="YYYY-MM-DD",
              help="Date (UTC) of the simulation's first moment, as the history (--db) and the reports show it;"
              " default: the trace's own dates when its times are dates (epoch seconds), else today.")
@click.option("--start-day", type=FiniteFloatRange(min=0), default=0.0, show_default=True,
              help="Skip this many days of the trace (see --window-days).")
@click.option("--window-days", type=FiniteFloatRange(min=0.001))
@click.option("--vc", "cluster_filter", help="Only jobs of this trace cluster (Philly virtual cluster).")
@click.option("--flex", type=FiniteFloatRange(0, 1), default=1.0, show_default=True,
              help="Share of jobs that allow resizing (half to double their GPUs).")
@click.option("--tick-interval", "tick_interval_s", type=FiniteFloatRange(min=1), default=60.0, show_default=True)
@click.option("--cron-ticks", is_flag=True, help="The controller ticks only on its own clock, every --tick-interval"
              " seconds, as cron or `controller run` does (default: also at every arrival and end).")
@click.option("--first-look", "first_look_s", type=FiniteFloatRange(0, 3600), default=60.0, show_default=True,
              help="With --cron-ticks: psbatch's first-look begin time, in seconds (0: none).")
@click.option("--wait-bound-h", type=FiniteFloatRange(min=0.1, max=8760), default=48.0, show_default=True,
              help="Hard bound on any job's wait for pipeswift (hours).")
@click.option("--truth-bias", multiple=True, help="CLASS_PREFIX=RATIO: true/predicted run time for a job class.")
@click.option("--truth-noise", type=FiniteFloatRange(min=0), default=0.0, show_default=True,
              help="Log-normal sigma of per-job truth noise (0 to 1).")
@click.option("--truth-shape-noise", type=FiniteFloatRange(min=0), default=0.0, show_default=True,
              help="Log-normal sigma of a seeded true/predicted factor per config shape (tp, pp, micro-batch;"
              " 0 to 1).")
@click.option("--truth-user-favour", type=FiniteFloatRange(min=0.1, max=10), default=1.0, show_default=True,
              help="The layout shape each job asked for really runs this many times faster than predicted.")
@click.option("--layouts", type=click.Choice(("user", "expert")), default="user", show_default=True,
              help="Users' own layouts: the workload's (zoo defaults), or expert: the planner's fastest"
              " at the job's GPU count.")
@click.option("--learn", is_flag=True, help="Calibrate online with layout terms from finished jobs (issue 25).")
@click.option("--own-layout-first", is_flag=True,
              help="With --learn: change no user's layout of a model class before a run in one was measured,"
              " then explore one unmeasured layout per class at a time ([calibration] own_layout_first;"
              " on when --config sets it).")
@click.option("--drop-oversized", is_flag=True, help="Drop jobs larger than the cluster instead of failing.")
@click.option("--json", "json_out", help="Write JSON metrics to this file ('-' for stdout).")
@click.option("--db", help="Write the controller history of pipeswift (else of the first policy) to this SQLite"
              " file (not a server URL), and each other policy's beside it as STEM.POLICY.sqlite.")
@click.option("--plot", help="Draw the JCT CDF per policy to this PNG.")
@pass_obj
def simulate(obj: Obj, workload: Optional[str], synthetic_jobs: int, gpus: int, gpus_per_node: Optional[int],
             gpu_type: Optional[str], load: Optional[float], policy_text: str, seed: int, start_day: float,
             window_days: Optional[float], cluster_filter: Optional[str], flex: float, tick_interval_s: float,
             cron_ticks: bool, first_look_s: float, wait_bound_h: float, truth_bias: tuple[str, ...],
             truth_noise: float, truth_shape_noise: float, truth_user_favour: float, learn: bool, own_layout_first: bool, drop_oversized: bool,
             json_out: Optional[str], db: Optional[str], plot: Optional[str], knob_items: tuple[str, ...],
             config_path: Optional[str], start_epoch_s: Optional[float], sacct_file: Optional[str] = None,
             history_db: Optional[str] = None, slurm_config: Optional[str] = None,
             layouts: str = "user", partition_items: tuple[str, ...] = (), partition_flex: float = 1.0,
             partition_truth: tuple[str, ...] = ()) -> None:
    """Replay a workload on a simulated Slurm cluster under several policies."""
    from pipeswift_slurm.cli.whatif import load_history, load_slurm_settings, print_what_changed, skipped_note
    from pipeswift_slurm.sim.runner import RunSpec

    if workload and (sacct_file or history_db):
        fail("--workload and --%s: give one workload to replay" % ("sacct" if sacct_file else "history"))
    if own_layout_first and not learn:
        fail("--own-layout-first needs --learn: without learning no user's layout is ever measured")
    if not (workload or sacct_file or history_db):
        given = [name for name, set_ in (("start-day", start_day), ("window-days", window_days),
                                         ("vc", cluster_filter)) if set_]
        if given:
            fail("--%s selects from a trace: give --workload (or --sacct/--history), or leave it out for the"
                 " synthetic workload" % given[0])

    policies = policies_option(policy_text)
    if db is not None:
        history_file(db)  # before the run: an empty name, a folder, a server URL
    outputs = {"--json": json_out, "--plot": plot}
    for what, path in outputs.items():  # before the run: never onto an input, the history or each other
        if path is not None and path != "-":
            output_file(path, what, (workload, sacct_file, history_db, config_path, db,
                                     *(other for name, other in outputs.items() if name != what)))
    site, no_requeue = None, ()  # type: Optional[tuple[str, dict[str, Any]]], tuple[str, ...]
    gpu = obj.gpu(gpu_type) if gpu_type else None
    if config_path is not None:
        from pipeswift_slurm.cli.controller import site_gpu

        cfg, site = _site(config_path)
        policies += (site[0],) if site[0] not in policies else ()
        no_requeue = () if cfg.allow_requeue else (site[0],)
        gpus_per_node = gpus_per_node or cfg.gpus_per_node or None
        gpu = gpu or site_gpu(cfg, obj)
        own_layout_first = own_layout_first or cfg.own_layout_first
    knobs = knobs_option(knob_items, policies)
    if site is not None:
        knobs[site[0]] = {**site[1], **knobs.get(site[0], {})}
    gpu = gpu or obj.gpu(DEFAULT_GPU_TYPE)
    spec = RunSpec(gpus=gpus, gpus_per_node=gpus_per_node or 8, gpu=gpu, workload=workload,
                   synthetic_jobs=synthetic_jobs, load=load if (load or workload) else 0.9, policies=policies,
                   policy_knobs=knobs, no_requeue=no_requeue, seed=seed, start_day=start_day,
                   window_days=window_days, flex=flex, tick_interval_s=tick_interval_s, ticks_on_events=not cron_ticks,
                   first_look_s=first_look_s,
                   wait_bound_s=wait_bound_h * 3600.0, drop_oversized=drop_oversized, class_bias=ratios_option(truth_bias),
                   noise_sigma=truth_noise, shape_sigma=truth_shape_noise, user_favour=truth_user_favour,
                   cluster_filter=cluster_filter, start_epoch_s=start_epoch_s, learn=learn,
                   own_layout_first=own_layout_first, layouts=layouts,
                   slurm=load_slurm_settings(slurm_config), partition_flex=partition_flex,
                   partitions=_partitions(partition_items, obj),
                   partition_truth=ratios_option(partition_truth, "--truth-partition-factor"),
                   history=load_history(sacct_file, history_db, load=load, vc=cluster_filter)
                   if (sacct_file or history_db) else None)
    comp = _run(spec, db)
    if json_out != "-":
        print_comparison(comp)
        if comp.changed is not None:
            print_what_changed(comp)
    for m in comp.metrics if learn and json_out != "-" else ():
        click.echo(learn_line(m))
    for line in filter(None, (skipped_note(comp.workload), bound_warning(comp))):
        click.echo(line, err=True)
    _outputs(comp, json_out, plot)


def _partitions(items: tuple[str, ...], obj: Obj) -> tuple[Any, ...]:
    """``--partition`` values as SimPartitions (one error line each)."""
    from pipeswift_slurm.sim.mixed import check_partitions, parse_partition
    from pipeswift_slurm.sim.workload import WorkloadError

    try:
        parts = tuple(parse_partition(text, obj.hardware) for text in items)
        check_partitions(parts)
    except WorkloadError as exc:
        fail("--partition %s" % exc)
    return parts


def _site(path: str) -> tuple[Any, tuple[str, dict[str, Any]]]:
    """The controller config at ``path``, and its policy's simulate label and knobs."""
    from pipeswift_slurm.slurm.config import ConfigError, load_config, policy_knobs

    try:
        cfg = load_config(path)
    except ConfigError as exc:
        fail(str(exc))
    return cfg, ("%s:site" % cfg.policy, policy_knobs(cfg))
