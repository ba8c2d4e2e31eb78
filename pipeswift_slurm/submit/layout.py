"""The processes a training command starts, set to exactly the allocation.

Owns: recognising how a command starts its processes (torchrun, ``python -m
torch.distributed.run``/``.launch``, a plain ``python script.py``, each maybe behind ``srun``)
and rewriting it so that it starts one process per allocated GPU on every allocated node. A
resized job must keep every GPU it was given busy: torchrun alone on a 2-node allocation runs
on the first node only, and a plain ``python`` runs one process whatever the GPU count.

A form this module does not know (``bash -c``, deepspeed, mpirun, an srun option it cannot
read) is reported as a problem, never guessed: the launcher then runs the user's command
exactly as written. Pure: no I/O; the caller passes the rendezvous host and the job id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

RENDEZVOUS_PORT = 29500
_TORCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")

# srun options as a training line writes them: those that take a value, and plain flags.
_SRUN_VALUE = {"-N", "--nodes", "-n", "--ntasks", "--ntasks-per-node", "-c", "--cpus-per-task", "--gpus",
               "-G", "--gpus-per-node", "--gpus-per-task", "--gres", "--mem", "--mem-per-cpu", "--mem-per-gpu",
               "--mpi", "--export", "-o", "--output", "-e", "--error", "-J", "--job-name", "-t", "--time",
               "--cpu-bind", "-m", "--distribution", "-w", "--nodelist", "--container-image",
               "--container-mounts", "--container-workdir", "--kill-on-bad-exit", "-K", "--wait", "-W"}
_SRUN_FLAG = {"-l", "--label", "-u", "--unbuffered", "--exclusive", "--overlap", "--no-kill",
              "--container-remap-root", "--no-container-mount-home"}
_SRUN_COUNTS = {"-N", "--nodes", "-n", "--ntasks", "--ntasks-per-node"}

# torchrun options (spelled with '-' or '_'): those that take a value, and plain flags.
_TORCHRUN_VALUE = {"--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port",
                   "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--max-restarts",
                   "--monitor-interval", "--start-method", "--role", "--log-dir", "-r", "--redirects", "-t",
                   "--tee", "--local-addr", "--logs-specs", "--local-ranks-filter", "--rdzv-timeout"}
_TORCHRUN_FLAG = {"--standalone", "--no-python", "-m", "--module", "--run-path", "--use-env"}
# Replaced by the rewrite: the counts always, the rendezvous when the job spans nodes.
_TORCHRUN_COUNTS = {"--nnodes", "--nproc-per-node"}
_TORCHRUN_RENDEZVOUS = {"--node-rank", "--master-addr", "--master-port", "--rdzv-backend", "--rdzv-endpoint",
                        "--rdzv-id", "--rdzv-conf", "--standalone"}
_PYTHON_VALUE = {"-X", "-W"}
# python's own options that change neither what it runs nor where its arguments start; any
# other (-c CODE, -, --, -um, ...) names a program the rewrite cannot find safely
_PYTHON_FLAG = {"-u", "-B", "-O", "-OO", "-s", "-S", "-E", "-I", "-b", "-bb", "-q", "-d", "-v", "-P", "-R"}


class LayoutError(ValueError):
    """The command's way of starting processes is not one this module can rewrite."""


@dataclass(frozen=True)
class Target:
    """Where the processes must run: ``num_nodes`` x ``gpus_per_node``; the rendezvous host is
    the batch host (the first node), ``job_id`` names the rendezvous."""

    num_nodes: int
    gpus_per_node: int
    rendezvous_host: str = "localhost"
    job_id: Optional[int] = None


@dataclass(frozen=True)
class Rewritten:
    """The command that starts one process per GPU, and how it does so (for the log line)."""

    command: list[str]
    how: str


def _options(words: Sequence[str], start: int, value_opts: set[str], flag_opts: set[str],
             spelled: bool = False) -> tuple[list[tuple[str, Optional[str]]], int]:
    """Read ``--opt value``, ``--opt=value`` and flags from ``start``; (options, index after)."""
    out: list[tuple[str, Optional[str]]] = []
    i = start
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        flag, eq, value = words[i].partition("=")
        name = "--" + flag[2:].replace("_", "-") if spelled and flag.startswith("--") else flag
        if name in flag_opts and not eq:
            out.append((name, None))
        elif name in value_opts:
            if not eq:
                i += 1
                if i >= len(words):
                    raise LayoutError("%s has no value" % flag)
                value = words[i]
            out.append((name, value))
        else:
            raise LayoutError("unknown option %s" % flag)
        i += 1
    return out, i


def _render(options: Sequence[tuple[str, Optional[str]]]) -> list[str]:
    return [name if value is None else "%s=%s" % (name, value) for name, value in options]


def _is_python(word: str) -> bool:
    base = os.path.basename(word)
    return base == "python" or (base.startswith("python") and base[6:].replace(".", "").isdigit())


def _srun_part(command: Sequence[str]) -> tuple[Optional[list[tuple[str, Optional[str]]]], int]:
    if not command or os.path.basename(command[0]) != "srun":
        return None, 0
    opts, i = _options(command, 1, _SRUN_VALUE, _SRUN_FLAG)
    return opts, i


def _srun(opts: Optional[list[tuple[str, Optional[str]]]], nodes: int, tasks_per_node: int) -> list[str]:
    kept = [o for o in (opts or []) if o[0] not in _SRUN_COUNTS]
    counts = [("--nodes", str(nodes)), ("--ntasks", str(nodes * tasks_per_node)),
              ("--ntasks-per-node", str(tasks_per_node))]
    return ["srun"] + _render(counts + kept)


def _torchrun_counts(opts: list[tuple[str, Optional[str]]], target: Target) -> list[str]:
    """Torchrun's options for the target: the counts set; across nodes, our own rendezvous
    (a node rank or master address written into the script is the same on every node)."""
    drop = _TORCHRUN_COUNTS | (_TORCHRUN_RENDEZVOUS if target.num_nodes > 1 else set())
    out = [("--nnodes", str(target.num_nodes)), ("--nproc-per-node", str(target.gpus_per_node))]
    if target.num_nodes > 1:
        out += [("--rdzv-backend", "c10d"), ("--rdzv-endpoint", "%s:%d" % (target.rendezvous_host, RENDEZVOUS_PORT)),
                ("--rdzv-id", str(target.job_id or "pipeswift"))]
    return _render(out + [o for o in opts if o[0] not in drop])


def _python_program(command: Sequence[str], i: int) -> tuple[list[str], Optional[int], int]:
    """``python [opts] (-m MODULE | script)``: (python and its options, index of -m's module or
    None, index of the program)."""
    j = i + 1
    while j < len(command) and command[j].startswith("-") and command[j] != "-m":
        option = command[j]
        if not (option in _PYTHON_FLAG or option in _PYTHON_VALUE or option[:2] in _PYTHON_VALUE):
            raise LayoutError("python option %s: pipeswift-launch cannot tell which program it runs" % option[:40])
        j += 2 if option in _PYTHON_VALUE else 1
    if j < len(command) and command[j] == "-m":
        if j + 1 >= len(command):
            raise LayoutError("python -m names no module")
        return list(command[i:j]), j + 1, j + 1
    if j >= len(command):
        raise LayoutError("python names no program")
    return list(command[i:j]), None, j


def set_processes(command: Sequence[str], target: Target) -> Rewritten:
    """``command`` rewritten to start one process per GPU of ``target``.

    Raises:
        LayoutError: the form is not one this module knows; run the command as written.
    """
    srun_opts, i = _srun_part(command)
    if i >= len(command):
        raise LayoutError("nothing to run after srun")
    nodes, per_node = target.num_nodes, target.gpus_per_node
    program = command[i]
    python: list[str] = []
    if _is_python(program):
        python, module_at, j = _python_program(command, i)
        if module_at is not None and module_at < len(command) and command[module_at] in _TORCH_MODULES:
            torch_opts, k = _options(command, module_at + 1, _TORCHRUN_VALUE, _TORCHRUN_FLAG, spelled=True)
            head = python + ["-m", command[module_at]]
        elif srun_opts is not None:
            # srun starts the processes itself (one task per GPU, ranks from Slurm).
            return Rewritten(_srun(srun_opts, nodes, per_node) + list(command[i:]),
                             "srun: %d tasks = %d node(s) x %d" % (nodes * per_node, nodes, per_node))
        elif nodes * per_node == 1:
            return Rewritten(list(command), "1 process")
        else:
            torch_opts, k = [], j if module_at is None else module_at - 1
            head = python + ["-m", "torch.distributed.run"]
    elif program.endswith(".py"):
        # a script run directly (its own shebang): torchrun starts it as a program
        if nodes * per_node == 1 and srun_opts is None:
            return Rewritten(list(command), "1 process")
        torch_opts, k, head = [("--no-python", None)], i, ["torchrun"]
    elif os.path.basename(program) == "torchrun":
        torch_opts, k = _options(command, i + 1, _TORCHRUN_VALUE, _TORCHRUN_FLAG, spelled=True)
        head = [program]
    else:
        raise LayoutError("%s is not a launcher pipeswift-launch can set to the allocation"
                          " (torchrun, python -m torch.distributed.run, python, each maybe behind srun)"
                          % os.path.basename(program))
    rest = list(command[k:])
    run = head + _torchrun_counts(torch_opts, target) + rest
    if nodes > 1 or srun_opts is not None:
        run = _srun(srun_opts, nodes, 1) + run
    return Rewritten(run, "torchrun: %d processes = %d node(s) x %d" % (nodes * per_node, nodes, per_node))
