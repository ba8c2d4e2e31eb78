"""Run the tiny megatron-core trainer (examples/tiny_megatron/train_tiny_gpt.py) and read its log.

Owns: how tests start the trainer (one process, or torchrun on 127.0.0.1 with a free port)
and how they read its two machine-readable lines, ``PIPESWIFT_RUN {json}`` (rank 0, the layout
that ran) and ``PIPESWIFT_LOSS {json}`` (one per iteration, last pipeline stage). ``parse_log``
accepts any text holding those lines, with prefixes too (``srun --label`` output, Slurm job
files), so an end-to-end Slurm test can reuse it on a job's output file.

Reuse from another test folder:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from tiny_megatron import TRAINER, megatron_missing, parse_log, run_tiny

Must not import torch or megatron (the subprocess does); the pytest process stays light.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "tiny_megatron" / "train_tiny_gpt.py"

_LINE = re.compile(r"PIPESWIFT_(RUN|LOSS) (\{.*\})\s*$")


@dataclass(frozen=True)
class RunResult:
    """One trainer run: exit status, the PIPESWIFT_RUN dict, losses by iteration, raw output."""

    returncode: int
    run_info: dict
    losses: list[float]
    stdout: str
    stderr: str = field(default="", repr=False)


def megatron_missing() -> str | None:
    """Why the tiny Megatron runs cannot happen here (None when torch and megatron.core exist)."""
    for module in ("torch", "megatron.core"):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken parent package counts as missing
            found = False
        if not found:
            return f"{module} is not importable (install the `megatron` extra)"
    return None


def parse_log(text: str) -> tuple[dict, list[float]]:
    """Read the trainer's log lines.

    Args:
        text: any output holding PIPESWIFT_RUN / PIPESWIFT_LOSS lines (other lines are ignored).

    Returns:
        (run_info, losses): the last PIPESWIFT_RUN dict ({} if none) and the losses ordered
        by iteration (a repeated iteration keeps its last value).
    """
    run_info: dict = {}
    by_iteration: dict[int, float] = {}
    for line in text.splitlines():
        match = _LINE.search(line)
        if not match:
            continue
        payload = json.loads(match.group(2))
        if match.group(1) == "RUN":
            run_info = payload
        else:
            by_iteration[int(payload["iteration"])] = float(payload["loss"])
    return run_info, [by_iteration[i] for i in sorted(by_iteration)]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the usual bind-to-0 trick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def trainer_command(argv: Sequence[str], nproc: int, port: int) -> list[str]:
    """The command line: plain python for one process, torchrun (as a module) for more."""
    if nproc == 1:
        return [sys.executable, str(TRAINER), *argv]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={port}", str(TRAINER), *argv]


def run_tiny(argv: Sequence[str], nproc: int = 1, env: Mapping[str, str] | None = None,
             timeout_s: float = 180.0) -> RunResult:
    """Run the tiny trainer and parse its log.

    Args:
        argv: Megatron-LM flags for the trainer (e.g. ``["--pipeline-model-parallel-size", "2"]``).
        nproc: processes on this machine (world size); > 1 goes through torchrun.
        env: extra environment variables, layered over this process's environment.
        timeout_s: wall-clock limit for the whole run (subprocess.TimeoutExpired beyond it).

    Returns:
        RunResult with the exit status, parsed run info and losses, and the raw output.
    """
    port = free_port()
    full_env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "PYTHONWARNINGS": "ignore", **(env or {})}
    proc = subprocess.run(trainer_command(argv, nproc, port), env=full_env, capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    run_info, losses = parse_log(proc.stdout)
    return RunResult(proc.returncode, run_info, losses, proc.stdout, proc.stderr)
