"""``psbatch --pipeswift=check``: what psbatch would do with a submission, without submitting.

Owns: the report a researcher reads before submitting. It runs the steps of a real
submission (``plan.plan_job``: finding the training command, validating it with the
core, the Comment token, the rewritten line) and, for a job that would be opted in, the
planner on the GPU counts the job allows, so the researcher sees which layouts and run
times the controller will choose from. Prints on stdout; exit 0 when the job would be
opted in, 1 when it would go to ``sbatch`` unchanged (the reason is printed), 2 when a
submission would be refused (a bad ``--pipeswift-partitions``: the error line on stderr, as
a submission prints it). Nothing is
submitted and ``sbatch`` is not run: ``--test-only`` asks Slurm's own questions.

Predictions rest on what the launcher's own plan rests on (``estimator.job_side_estimator``):
the site model the controller publishes (``$PIPESWIFT_SITE_MODEL``: its learned bias and
GPU types), else ``PIPESWIFT_GPU_TYPE`` and ``PIPESWIFT_HARDWARE`` with the cost model
alone; GPUs per node come from the job's request, else ``PIPESWIFT_GPUS_PER_NODE``, else 8,
as psbatch validates. psbatch never reads the database.
"""

from __future__ import annotations

import re
import shlex
import sys
from typing import Callable, Mapping, Optional, Sequence, TextIO

from pipeswift_slurm.submit.jobscript import read_header
from pipeswift_slurm.submit.training import LAUNCHER
from pipeswift_slurm.core.model import JobProfile
from pipeswift_slurm.submit.plan import CHECK, TOO_BIG, Source, describe, plan_job
from pipeswift_slurm.submit.sbatch_args import PsbatchUsageError, effective_options, own_options, scan_argv
from pipeswift_slurm.submit.sbatch_args import strip_own_options
from pipeswift_slurm.submit.sbatch_args import time_limit_s

_OPTED_OUT = "not opted in to PipeSwift: opted out (--pipeswift=off or #PSWIFT off)"
_NOT_MEGATRON = ("not a Megatron job: no training command found (a pretrain_*.py script, the four shape flags"
                 " --num-layers --hidden-size --num-attention-heads --seq-length, or torchrun with Megatron"
                 " flags; #PSWIFT lines declare one)")
MAX_ROWS = 16  # GPU counts in the prediction table
_SHOWN_CHARS = 110  # a command line longer than this is shortened in the report


def report(raw: Sequence[str], environ: Mapping[str, str], read: Callable[[list[str]], Source],
           out: TextIO) -> int:
    """Print what psbatch would do with ``raw`` (psbatch's argv, with ``--pipeswift=check``);
    0 when the job would be opted in, 1 when it would be submitted unchanged, 2 when the
    submission would be refused."""
    try:
        argv, pairs = strip_own_options(raw)
        pairs = [pair for pair in pairs if pair != CHECK]
        source = read(argv)
        if source.text is None:
            return _unchanged(out, "not opted in to PipeSwift: " + (
                source.why or (TOO_BIG if source.too_big else
                               "psbatch cannot read the job script (sbatch says why, or reads it from a terminal)")))
        plan = plan_job(argv, pairs, source.text, environ)
        if plan is None:
            own = own_options(list(read_header(source.text.split("\n")).own) + pairs)
            return _unchanged(out, _OPTED_OUT if own.off else _NOT_MEGATRON)
    except PsbatchUsageError as exc:  # a submission prints the same line and submits nothing
        sys.stderr.write("psbatch: error: %s; nothing submitted\n" % exc)
        return 2
    except Exception as exc:  # what a submission would turn into its warning line
        return _unchanged(out, describe(exc))
    profile, cmd = plan.profile, plan.command
    lines = source.text.split("\n")
    new_line = (plan.text or "").split("\n")[cmd.line]
    becomes = _short(new_line.strip()) if new_line != lines[cmd.line] else \
        "unchanged (runs through %s)" % LAUNCHER
    plan_lines = [
        "psbatch: this Megatron job would be opted in to PipeSwift (--pipeswift=check: nothing submitted)",
        "  training command   line %d: %s" % (cmd.line + 1, _short(" ".join(cmd.words))),
        "  line %-13s %s" % ("%d becomes" % (cmd.line + 1), becomes),
        "  model              %s" % _model(profile),
        "  training           %s" % _training(profile),
        "  your config        %s" % profile.requested.short(),
        "  PipeSwift may use  %s" % _freedom(profile),
        "  sbatch gets        %s" % _short(" ".join(shlex.quote(_comment_shown(a)) for a in plan.argv), 300),
    ]
    header = read_header(lines).header[0]
    limit_s = time_limit_s(effective_options(scan_argv(plan.argv).opts, header, environ).get("time"))
    out.write("\n".join(plan_lines) + "\n\n" + _predictions(profile, environ, limit_s) + "\n")
    return 0


def _unchanged(out: TextIO, reason: str) -> int:
    out.write("psbatch: %s; psbatch would submit the job unchanged"
              " (--pipeswift=check: nothing submitted)\n" % reason)
    return 1


def _short(text: str, limit: int = _SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 5] + " ..."


def _comment_shown(word: str) -> str:
    """sbatch's argument, with the profile token's base64 Megatron flags shown by size."""
    if not word.startswith("--comment="):
        return word
    return re.sub(r"\bpswift1;args=([A-Za-z0-9_=-]+)", lambda m: "pswift1;args=<%d characters: the Megatron"
                  " flags>" % len(m.group(1)), word)


def _model(profile: JobProfile) -> str:
    shape = profile.shape
    text = "%d layers, hidden %d, %d heads" % (shape.num_layers, shape.hidden_size, shape.num_attention_heads)
    if shape.num_query_groups != shape.num_attention_heads:
        text += " (%d query groups)" % shape.num_query_groups
    params = shape.num_params
    return text + ", sequence %d%s: %s parameters" % (shape.seq_length, ", SwiGLU" if shape.swiglu else "",
                                                       "%.2fB" % (params / 1e9) if params >= 1e9 else
                                                       "%.1fM" % (params / 1e6))


def _training(profile: JobProfile) -> str:
    plan = profile.plan
    text = "global batch %d (kept), %s iterations, %s" % (plan.global_batch_size, f"{plan.iterations:,}",
                                                          plan.precision)
    if plan.save_interval:
        return text + "; checkpoints every %d iterations and resumes" % plan.save_interval
    return text + "; no --save/--load/--save-interval: never requeued"


def _freedom(profile: JobProfile) -> str:
    lo, hi = profile.gpu_range
    parts = ["%d-%d GPUs" % (lo, hi) if hi > lo else
             "%d GPUs only (let it choose: --pipeswift-gpus=LO-HI or #PSWIFT gpus=LO-HI)" % lo]
    parts.append("micro-batch >= %d" % profile.min_micro_batch_size)
    if profile.allowed_pp:
        parts.append("pp in %s" % ",".join(str(p) for p in profile.allowed_pp))
    parts.append("any layout Megatron accepts")
    if profile.partitions:
        parts.append("partitions %s (where it is predicted to finish first)" % ",".join(profile.partitions))
    return "; ".join(parts)


def gpu_counts(lo: int, hi: int, requested: int, per_node: int, limit: int = MAX_ROWS) -> list[int]:
    """The GPU counts to show: every count in [lo, hi] when few, else the bounds, the
    request, the powers of two and the whole-node multiples, thinned to powers of two."""
    if hi - lo + 1 <= limit:
        return list(range(lo, hi + 1))
    ends = {lo, hi, requested}
    powers = {1 << k for k in range(hi.bit_length()) if lo <= 1 << k <= hi}
    nodes = {n * per_node for n in range(1, hi // max(per_node, 1) + 1) if lo <= n * per_node <= hi}
    counts = ends | powers | nodes
    if len(counts) > limit:
        counts = ends | powers
    return sorted(counts)


def _predictions(profile: JobProfile, environ: Mapping[str, str], limit_s: Optional[int] = None) -> str:
    from pipeswift_slurm.core.estimator import job_side_estimator
    from pipeswift_slurm.core.fmt import duration, table

    per_node = profile.requested.gpus_per_node or 8
    estimator, basis = job_side_estimator(environ, per_node)
    lo, hi = profile.gpu_range
    user = profile.requested
    rows: list[list[object]] = []
    best: Optional[tuple[float, int]] = None
    none: list[int] = []
    for gpus in gpu_counts(lo, hi, user.gpus, per_node):
        found = estimator.best_run_time_s(profile, gpus)
        if found is None:
            none.append(gpus)
            continue
        config, run_s = found
        rows.append([gpus, config.short(), duration(run_s)])
        if best is None or run_s < best[0]:
            best = (run_s, len(rows) - 1)
    if best is not None:
        rows[best[1]][0] = "%s *" % rows[best[1]][0]
    estimate = estimator.cost.estimate(profile, user)
    user_s = estimator.run_time_s(profile, user)
    mine = "your config: %s on %d GPUs, %.1f of %.0f GiB per GPU%s" % (
        duration(user_s), user.gpus, estimate.mem_gib, estimator.cost.gpu.mem_gib,
        "" if estimate.fits else " (does not fit: Megatron would run out of memory)")
    lines = ["Predicted run time on %s, %d GPUs per node, by %s (PIPESWIFT_GPU_TYPE sets your cluster's GPU"
             " type; PIPESWIFT_SITE_MODEL the controller's published corrections):"
             % (estimator.cost.gpu.name, per_node, basis)]
    if rows:
        lines.append(table(["GPUs", "layout it runs", "run time"], rows))
    if none:
        from pipeswift_slurm.core.planner import describe_no_layout

        lines.extend(describe_no_layout(estimator.planner, profile, none))
    lines.append("%s%s. The controller picks the count that ends the job soonest, queue included."
                 % ("* fastest; " if rows else "", mine))
    if not rows:
        lines.append("warning: no layout PipeSwift may use runs on the GPU counts you allow, so it cannot plan"
                     " this job, which runs your own config (loosen the --pipeswift-* or #PSWIFT options, or"
                     " submit it with sbatch)")
    if limit_s and user_s > limit_s:
        lines.append("warning: your config's predicted run time %s exceeds the job's time limit %s (--time):"
                     " Slurm would stop it first%s" % (duration(user_s), duration(limit_s),
                     "" if best is None or best[0] > limit_s else "; a faster layout above fits"))
    return "\n".join(lines)
