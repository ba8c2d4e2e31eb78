"""``pipeswift demo``: the main job on the embedded default (a synthetic LLM-cluster
workload on a simulated 64-GPU Slurm with SQLite, every policy side by side, and where the
gains come from). Uses the simulate command's runner and output; never imports the group.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import click

from pipeswift_slurm.cli.common import Obj, hand_over_history, output_file, pass_obj
from pipeswift_slurm.cli.sim import Progress, history_file, on_terminal, plot_cdf, refuse_non_history
from pipeswift_slurm.cli.sim_table import print_comparison
from pipeswift_slurm.core.hardware import DEFAULT_GPU_TYPE

DEMO_VARIANTS = ("pipeswift:order", "pipeswift:config")  # presets: the gains taken apart


@click.command()
@click.option("--db", default="pipeswift-demo.sqlite", show_default=True,
              help="SQLite history of the pipeswift run (try: pipeswift report all --db FILE).")
@click.option("--plot", help="Also draw the JCT CDF to this PNG.")
@click.option("--seed", type=int, default=1, show_default=True)
@pass_obj
def demo(obj: Obj, db: str, plot: Optional[str], seed: int) -> None:
    """The main job on the embedded default: a synthetic LLM-cluster workload on a
    simulated 64-GPU Slurm cluster with SQLite, every policy, and where the gains come from."""
    from pipeswift_slurm.sim.runner import ALL_POLICIES, RunSpec, run_comparison

    path = history_file(db)  # a server URL is refused before the runs
    refuse_non_history(path)  # and a file no simulation wrote
    if plot is not None:
        output_file(plot, "--plot")
    spec = RunSpec(gpus=64, gpus_per_node=8, gpu=obj.gpu(DEFAULT_GPU_TYPE), synthetic_jobs=300, load=0.9,
                   policies=ALL_POLICIES + DEMO_VARIANTS, seed=seed, start_epoch_s=None)
    progress = Progress(len(spec.policies) + 1, on_terminal())  # + the history run
    try:
        comp = run_comparison(spec, on_tick=progress.tick, on_start=progress.start)
        _demo_history(spec, path, progress)
    finally:
        progress.close()  # before the first line of output
    print_comparison(comp)
    _explain_gains(comp)
    click.echo("\ncontroller history of the pipeswift run written to %s (pipeswift report all --db %s)" % (db, db))
    if plot:
        plot_cdf(comp, plot)


def _explain_gains(comp: Any) -> None:
    by = {m["policy"]: m for m in comp.metrics}
    slurm, order, config, full = (by[k]["mean_jct_s"] for k in ("slurm", "pipeswift:order", "pipeswift:config",
                                                                 "pipeswift"))
    click.echo("\nwhere the gains come from (mean JCT relative to slurm):")
    click.echo("  queue order + waiting bound only (user configs):   %.2f" % (order / slurm))
    click.echo("  + best pipeline config at the user's GPU count:    %.2f" % (config / slurm))
    click.echo("  + resizing pending jobs (fragments, start now):    %.2f" % (full / slurm))
    click.echo("  lower bound (every job alone, best config):        %.2f"
               % (comp.workload["lower_bound_mean_jct_s"] / slurm))


def _demo_history(spec: Any, path: Path, progress: Progress) -> None:
    from pipeswift_slurm.sim.runner import run_comparison
    from pipeswift_slurm.store.simulated import new_simulated_history

    stores: list[Any] = []

    def store_for(_policy: str) -> Any:
        stores.append(new_simulated_history(path))
        return stores[-1]

    run_comparison(replace(spec, policies=("pipeswift",), policy_knobs={}), store_for=store_for,
                   on_tick=progress.tick, on_start=progress.start)
    for store in stores:
        hand_over_history(store)
