"""The model commands: ``estimate``, ``plan`` and ``profile`` (Megatron arguments in,
predictions out). Imports the core, never the group.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any, Optional, Sequence

import click

from pipeswift_slurm.cli.common import (Obj, echo_json, fail, layer_profile_option, load_layer_profile, output_file,
                                        pass_obj)
from pipeswift_slurm.core.hardware import DEFAULT_GPU_TYPE, GpuType
from pipeswift_slurm.core.request import MAX_GPUS
from pipeswift_slurm.slurm.config import MAX_GPUS_PER_NODE


def _profile(megatron_args: Sequence[str], world: Optional[int], gpus_per_node: int,
             gpu_range: Optional[tuple[int, int]] = None) -> Any:
    from pipeswift_slurm.core.megatron import MegatronArgError, profile_from_argv

    if not megatron_args:
        fail("no Megatron arguments given; put them after '--', e.g. -- --num-layers 24 ...")
    unread = unread_flags(megatron_args)
    if unread:
        click.echo("warning: not read by the cost model (no effect on this answer): %s" % " ".join(unread), err=True)
    try:
        return profile_from_argv(list(megatron_args), world_size=world, gpus_per_node=gpus_per_node,
                                 gpu_range=gpu_range)
    except MegatronArgError as exc:
        fail("%s (in the Megatron arguments; fix that flag)" % exc)



def unread_flags(argv: Sequence[str]) -> list[str]:
    """The ``--flags`` in ``argv`` that the cost model does not read (``megatron.FLAGS``),
    in order, each once: a typo, or a flag Megatron reads and the estimate ignores."""
    from pipeswift_slurm.core.megatron import FLAGS, split_flag

    flags = [split_flag(a)[0] for a in argv if a.startswith("--") and len(a) > 2]
    return list(dict.fromkeys(f for f in flags if f not in FLAGS))


GPU_TYPE_ENV = "PIPESWIFT_GPU_TYPE"
MAX_PROFILED_MICRO_BATCH = 1024  # a layer's micro-batch beyond this fits no GPU's memory
gpu_type_option = click.option("--gpu-type", default=DEFAULT_GPU_TYPE, show_default=True, envvar=GPU_TYPE_ENV,
                               help="GPU type the predictions assume (env %s)." % GPU_TYPE_ENV)


def gpu_type_source() -> str:
    """Where ``--gpu-type`` came from: "default", "--gpu-type" or the environment variable."""
    source = click.get_current_context().get_parameter_source("gpu_type")
    if source == click.core.ParameterSource.COMMANDLINE:
        return "--gpu-type"
    return GPU_TYPE_ENV if source == click.core.ParameterSource.ENVIRONMENT else "default"


def gpu_type_note(gpu: GpuType, source: str) -> str:
    """'A100-80GB (default; --gpu-type to change)', or the name and where it was set."""
    if source == "default":
        return "%s (default; --gpu-type or %s to change)" % (gpu.name, GPU_TYPE_ENV)
    return "%s (from %s)" % (gpu.name, source)


def _config_dict(cfg: Any) -> dict[str, Any]:
    return {k: v for k, v in asdict(cfg).items()}


def estimate_dict(est: Any, profile: Any, cost: Any) -> dict[str, Any]:
    """The stable JSON form of one estimate (keys documented in the README)."""
    iters = profile.plan.iterations
    return {
        "gpus": est.config.gpus,
        "config": _config_dict(est.config),
        "iter_time_s": est.iter_time_s,
        "tflops_per_gpu": est.tflops_per_gpu,
        "mem_gib": est.mem_gib,
        "fits": est.fits,
        "bubble_fraction": est.bubble_fraction,
        "num_micro_batches": est.config.num_micro_batches,
        "data_parallel_size": est.config.dp,
        "job_time_s": cost.job_time_s(profile, est.config) if iters else None,
        "error_band": est.band.rel,
        "error_band_group": est.band.group,
    }


@click.command()
@gpu_type_option
@click.option("--num-gpus", type=click.IntRange(min=1, max=MAX_GPUS), help="World size (default tp*pp*cp).")
@click.option("--gpus-per-node", type=click.IntRange(1, MAX_GPUS_PER_NODE), default=8, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (stable keys).")
@layer_profile_option
@click.argument("megatron_args", nargs=-1, type=click.UNPROCESSED)
@pass_obj
def estimate(obj: Obj, gpu_type: str, num_gpus: Optional[int], gpus_per_node: int, as_json: bool,
             layer_profile: Optional[str], megatron_args: tuple[str, ...]) -> None:
    """Predict iteration time, TFLOP/s, memory and bubble of a Megatron command line.

    Exits 1 when the config does not fit in the GPU's memory (the figures are still
    printed, marked DOES NOT FIT), 2 on bad arguments. Flags the cost model does not read
    are named in a warning.

    Example: pipeswift estimate --num-gpus 8 -- --num-layers 24 --hidden-size 2048
    --num-attention-heads 16 --seq-length 2048 --global-batch-size 512 --train-iters 1000 --bf16
    """
    from pipeswift_slurm.core.costmodel import CostModel

    gpu = obj.gpu(gpu_type)
    profile = _profile(megatron_args, num_gpus, gpus_per_node)
    cost = CostModel(gpu, layer_profile=load_layer_profile(layer_profile, gpu, profile))
    est = cost.estimate(profile, profile.requested)
    data = estimate_dict(est, profile, cost)
    data["gpu_type"], data["gpu_type_source"] = gpu.name, gpu_type_source()
    if as_json:
        echo_json(data)
        sys.exit(0 if est.fits else 1)  # as the text: the object printed, and the status says it
    from pipeswift_slurm.core.fmt import duration

    lines = [
        ("config", est.config.short()),
        ("gpu type", gpu_type_note(gpu, data["gpu_type_source"])),
        ("iteration time", "%.3f s %s" % (est.iter_time_s, est.band.text())),
        ("error band", "%s: %s" % (est.band.text(), est.band.group if est.band.measured else
                                   "%s (a wide default)" % est.band.group)),
        ("model TFLOP/s per GPU", "%.1f (%.0f%% of peak)" % (est.tflops_per_gpu, 100 * est.tflops_per_gpu
                                                             / gpu.peak_tflops)),
        ("memory per GPU", "%.1f GiB of %.1f%s" % (est.mem_gib, gpu.mem_gib, "" if est.fits else "  DOES NOT FIT")),
        ("bubble fraction", "%.3f" % est.bubble_fraction),
        ("micro-batches (M)", str(est.config.num_micro_batches)),
        ("data-parallel size", str(est.config.dp)),
    ]
    if data["job_time_s"] is not None:
        lines.append(("job time", "%s %s (%d iterations)" % (duration(data["job_time_s"]), est.band.text(),
                                                             profile.plan.iterations)))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        click.echo("%s  %s" % (key.ljust(width), value))
    if not est.fits:
        sys.exit(1)


def parse_gpu_range(text: str) -> tuple[int, int]:
    """'8' -> (8, 8); '4-16' -> (4, 16)."""
    lo, sep, hi = text.partition("-")
    parts = (lo, hi) if sep else (lo,)
    if not all(p and len(p) <= 9 and all("0" <= c <= "9" for c in p) for p in parts):
        fail("--gpus %r: expected N or A-B in digits 0-9, e.g. 4-16" % text[:40])
    low, high = int(lo), int(hi) if sep else int(lo)
    if low < 1 or high < low:
        fail("--gpus %r: need 1 <= A <= B" % text)
    if high > MAX_GPUS:
        fail("--gpus %r: %d GPUs is beyond any cluster (at most %d)" % (text, high, MAX_GPUS))
    return low, high


@click.command()
@click.option("--gpus", "gpus_text", required=True, help="GPU count or range, e.g. 8 or 4-64.")
@click.option("--gpus-per-node", type=click.IntRange(1, MAX_GPUS_PER_NODE), default=8, show_default=True)
@gpu_type_option
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--explain", is_flag=True, help="Also list excluded configs and why.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (stable keys).")
@layer_profile_option
@click.argument("megatron_args", nargs=-1, type=click.UNPROCESSED)
@pass_obj
def plan(obj: Obj, gpus_text: str, gpus_per_node: int, gpu_type: str, top: int, explain: bool,
         as_json: bool, layer_profile: Optional[str], megatron_args: tuple[str, ...]) -> None:
    """Rank every valid config of a Megatron job over a GPU count or range.

    Exits 1 when no config is valid in the range. The JSON has ``excluded`` (every
    excluded config and why) only with --explain."""
    from pipeswift_slurm.core.costmodel import CostModel
    from pipeswift_slurm.core.planner import Planner, no_layout_groups

    lo, hi = parse_gpu_range(gpus_text)
    gpu = obj.gpu(gpu_type)
    profile = _profile(megatron_args, None, gpus_per_node).with_range(lo, hi)
    cost = CostModel(gpu, layer_profile=load_layer_profile(layer_profile, gpu, profile))
    planner = Planner(cost, gpus_per_node)
    result = planner.plan(profile, lo, hi, explain=explain)
    rows = [estimate_dict(e, profile, cost) for e in result.ranked[:top]]
    chosen = [(e, planner.best(profile, e.config.gpus)) for e in
              (planner.choose(profile, g) for g in range(lo, hi + 1)) if e is not None]
    runs = {e.config for e, _ in chosen}
    for est, row in zip(result.ranked, rows):
        row["chosen"] = est.config in runs
    kept = [(e, fast) for e, fast in chosen if fast is not None and e.config != fast.config]
    none = no_layout_groups(planner, profile, range(lo, hi + 1))
    if as_json:
        echo_json({"gpu_type": gpu.name, "gpu_type_source": gpu_type_source(), "gpus": [lo, hi],
                   "valid_configs": len(result.ranked), "configs": rows,
                   "no_layout": [{"gpus": counts, "reason": why} for counts, why in none],
                   "user_layout_kept": [{"gpus": e.config.gpus, "config": _config_dict(e.config),
                                         "iter_time_s": e.iter_time_s, "fastest_iter_time_s": fast.iter_time_s,
                                         "error_band": max(e.band.rel, fast.band.rel)} for e, fast in kept],
                   **({"excluded": [{"gpus": x.gpus, "config": x.config and _config_dict(x.config),
                                     "reason": x.reason} for x in result.excluded]} if explain else {})})
        sys.exit(0 if result.ranked else 1)
    click.echo("GPU type: %s" % gpu_type_note(gpu, gpu_type_source()))
    if not result.ranked:
        click.echo("no valid config in that GPU range (--explain lists every excluded config):", err=True)
    for counts, why in none:
        click.echo("no valid layout on %s: %s" % (_counts_text(counts), why), err=not result.ranked)
    _print_plan(result, rows, gpu, explain)
    for est, fast in kept[:top]:
        click.echo("runs on %d GPUs: your layout %s (the fastest gains %.0f %%, within the %s band)"
                   % (est.config.gpus, est.config.short(), 100 * (1 - fast.iter_time_s / est.iter_time_s),
                      "\u00b1 %.0f %%" % (100 * max(est.band.rel, fast.band.rel))))
    if len(kept) > top:
        click.echo("... and on %d more GPU counts (--json lists them)" % (len(kept) - top))
    if not result.ranked:
        sys.exit(1)


COUNTS_SHOWN = 40  # GPU counts (or runs of them) one "no valid layout" line names; --json has all


def _counts_text(counts: list[int]) -> str:
    """'3, 5, 6, 7 GPUs' for a few counts, '9-16 GPUs' for a run, a mix for both; past
    ``COUNTS_SHOWN`` items, how many more counts there are."""
    runs: list[list[int]] = []
    for gpus in counts:
        if runs and gpus == runs[-1][-1] + 1:
            runs[-1].append(gpus)
        else:
            runs.append([gpus])
    items = [("%d-%d" % (r[0], r[-1]),) if len(r) > 2 else tuple(map(str, r)) for r in runs]
    words = [w for item in items for w in item]
    if len(words) <= COUNTS_SHOWN:
        return ", ".join(words) + " GPUs"
    shown, n_shown = [], 0
    for run, item in zip(runs, items):
        if len(shown) + len(item) > COUNTS_SHOWN:
            break
        shown.extend(item)
        n_shown += len(run)
    return "%s GPUs and %s more counts (--json lists them)" % (", ".join(shown), "{:,}".format(len(counts) - n_shown))


def _print_plan(result: Any, rows: list[dict[str, Any]], gpu: GpuType, explain: bool) -> None:
    from pipeswift_slurm.core.fmt import duration, table

    headers = ["#", "gpus", "nodes", "tp", "pp", "vp", "dp", "mbs", "M", "iter_s", "band", "TFLOP/s", "mem_GiB",
               "bubble", "job_time", "runs"]
    table_rows = [[i + 1, r["gpus"], "%dx%d" % (r["config"]["num_nodes"], r["config"]["gpus_per_node"]),
                   r["config"]["tp"], r["config"]["pp"], r["config"]["vp"], r["config"]["dp"],
                   r["config"]["micro_batch_size"], r["config"]["num_micro_batches"], r["iter_time_s"],
                   "\u00b1%.0f%%" % (100 * r["error_band"]), r["tflops_per_gpu"], r["mem_gib"], r["bubble_fraction"],
                   duration(r["job_time_s"]), "*" if r["chosen"] else ""]
                  for i, r in enumerate(rows)]
    if rows:
        click.echo("%d valid configs on %s; top %d by iteration time:" % (len(result.ranked), gpu.name, len(rows)))
        click.echo(table(headers, table_rows))
        click.echo("band: the model's error for layouts like this one (published runs); runs *: the layout the"
                   " controller and pipeswift-launch run on that GPU count (yours, unless the fastest gains more"
                   " than the larger band)")
    if explain:
        click.echo("\nexcluded (%d):" % len(result.excluded))
        for x in result.excluded:
            click.echo("  %s gpus=%d: %s" % (x.config.short() if x.config else "-", x.gpus, x.reason))


@click.command()
@click.option("--gpu-type", help="GPU type to file the profile under (default: the table type of this"
                                  " machine's GPU; a CPU run is always 'cpu').")
@click.option("--micro-batch-sizes", default="1,2,4,8", show_default=True, help="Comma-separated candidates.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="Write the profile TOML here.")
@click.option("--json", "as_json", is_flag=True, help="Print the measurements as JSON.")
@click.argument("megatron_args", nargs=-1, type=click.UNPROCESSED)
@pass_obj
def profile(obj: Obj, gpu_type: Optional[str], micro_batch_sizes: str, out_path: Optional[str], as_json: bool,
            megatron_args: tuple[str, ...]) -> None:
    """Time one transformer layer of the job's shape (fwd+bwd per micro-batch size) on
    this machine's GPU (or CPU: structure only) and write a profile for --layer-profile."""
    try:
        sizes = [int(x) for x in micro_batch_sizes.split(",") if x.strip()]
    except ValueError:
        fail("--micro-batch-sizes %r: expected integers like 1,2,4,8" % micro_batch_sizes)
    if not sizes or min(sizes) < 1:
        fail("--micro-batch-sizes %r: need positive integers" % micro_batch_sizes)
    job = _profile(megatron_args, None, 8)
    most = min(MAX_PROFILED_MICRO_BATCH, job.plan.global_batch_size)
    if max(sizes) > most:
        fail("--micro-batch-sizes %r: at most %d (the global batch, and %d at most)"
             % (micro_batch_sizes, most, MAX_PROFILED_MICRO_BATCH))
    if out_path:
        output_file(out_path, "--out")  # before the run, not after it
    try:
        import torch  # noqa: F401
    except ImportError:
        fail("profiling needs torch: pip install 'pipeswift-slurm[megatron]'", 1)
    from pipeswift_slurm.core.layer_profile import measured_on_cpu
    from pipeswift_slurm.core.profile_file import profile_to_dict
    from pipeswift_slurm.measure.profiler import ProfileLabelError, main_profile

    try:
        result = main_profile(job.shape, sizes, gpu_type, out_path, dtype=job.plan.precision)
    except ProfileLabelError as exc:
        fail(str(exc))
    except (RuntimeError, MemoryError) as exc:  # torch: out of memory, on the GPU or the host
        fail("profiling micro-batch sizes %s failed: %s; try smaller --micro-batch-sizes"
             % (",".join(map(str, sizes)), (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]), 1)
    if as_json:
        echo_json(profile_to_dict(result))
        return
    click.echo("%s on %s (%s, %s):" % (result.backend, result.device, result.layer_spec, result.dtype))
    if result.layer_spec == "local" and not measured_on_cpu(result):
        click.echo("note: megatron-core's local spec computes attention unfused (no Transformer Engine here);"
                   " on an H200 it ran 1.2 to 3.9 x slower than a flash-attention layer (docs/benchmarks.md)."
                   " If your jobs run with Transformer Engine, profile on a node that has it.", err=True)
    for t in result.timings:
        click.echo("  micro-batch %3d: %9.2f ms fwd+bwd per layer, %7.1f TFLOP/s"
                   % (t.micro_batch_size, t.fwd_bwd_ms, t.tflops))
    if out_path:
        click.echo("wrote %s (use it with --layer-profile)" % out_path)
