"""Megatron's own iteration times, read by the launcher as the job runs.

The launcher runs the training command as a child, copies its stdout byte for byte to
its own (the job's log does not change), and parses Megatron's iteration lines::

     [2026-01-05 10:00:00] iteration       20/    1000 | consumed samples: 640 |
     elapsed time per iteration (ms): 1234.5 | learning rate: ... |

(megatron-core 0.16's training loop; newer ones print ``(ms): 1234.5/1250.0``, the
interval's and the running mean, of which the first is read). Each line's value is the
mean over the log interval that ends at that iteration. The report is the median of the
values after the warm-up (lines at iteration <= ``WARMUP_ITERATIONS`` and the first line,
which includes compilation and the first allocator growth), with the layout that ran,
written to ``<measure dir>/<job id>.<random>.json`` (``report_name``; ``PIPESWIFT_MEASURE_DIR``, a spool folder the
site creates like /tmp: writable by all, sticky): atomically, after every
``REPORT_EVERY`` lines and at the end. The controller (``slurm/measured.py``) trusts
it only as a claim about that job: the file must belong to the job's user, and the value
is bounded and checked against Slurm's elapsed time. While the child runs, the launcher
outlives the signals Slurm sends the whole step (``STEP_SIGNALS``): the child gets them too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
from typing import BinaryIO, Callable, Optional, Sequence

from pipeswift_slurm.core.files import write_atomic
from pipeswift_slurm.core.model import ExecConfig

ITERATION_LINE = re.compile(
    rb"\biteration\s+(\d+)\s*/\s*(?:\d+|infinity)\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9]+(?:\.[0-9]*)?)")
WARMUP_ITERATIONS = 3
REPORT_EVERY = 5
MEASURE_DIR_ENV = "PIPESWIFT_MEASURE_DIR"


def parse_iteration(line: bytes) -> Optional[tuple[int, float]]:
    """(iteration, seconds per iteration) of one Megatron iteration line, else None."""
    m = ITERATION_LINE.search(line)
    if m is None:
        return None
    ms = float(m.group(2))
    return (int(m.group(1)), ms / 1000.0) if ms > 0 else None


class IterationLog:
    """The iteration lines seen so far, and the measured median after the warm-up."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, float]] = []

    def feed(self, line: bytes) -> bool:
        """Parse one line; True when it was an iteration line."""
        got = parse_iteration(line)
        if got is not None:
            self.lines.append(got)
        return got is not None

    def steady(self) -> list[float]:
        """Seconds per iteration of the lines after the warm-up."""
        return [s for i, (it, s) in enumerate(self.lines) if i > 0 and it > WARMUP_ITERATIONS]

    def median_s(self) -> Optional[float]:
        """The median seconds per iteration after the warm-up (None before any)."""
        values = self.steady()
        return statistics.median(values) if values else None

    @property
    def last_iteration(self) -> int:
        return self.lines[-1][0] if self.lines else 0


def report(job_id: int, config: ExecConfig, log: IterationLog) -> dict[str, object]:
    """The measurement file's content."""
    return {"job_id": job_id, "config": dataclasses.asdict(config), "median_iter_s": log.median_s(),
            "iterations": log.last_iteration, "samples": len(log.steady())}


def report_name(job_id: int) -> str:
    """A new report file name for one run of job ``job_id``: ``<job id>.<16 random hex>.json``.
    The folder is shared (mode 1777), so a name another user could guess (``<job id>.json``)
    could be taken before the job starts, and the sticky bit would keep the job from ever
    writing its report; a random part nobody can guess leaves nothing to take."""
    return "%d.%s.json" % (job_id, secrets.token_hex(8))


def write_report(folder: str, name: str, job_id: int, config: ExecConfig, log: IterationLog) -> None:
    """Write ``<folder>/<name>`` (``report_name``) atomically (``core.files.write_atomic``).

    Raises:
        OSError: the folder cannot be written (``run_measured`` says so once and stops trying).
    """
    write_atomic(os.path.join(folder, name), json.dumps(report(job_id, config, log), sort_keys=True))


def copy_and_parse(source: BinaryIO, sink: BinaryIO, log: IterationLog,
                   on_lines: Optional[Callable[[], None]] = None) -> None:
    """Copy ``source`` to ``sink`` unchanged, a line at a time (flushed: the job's log
    stays live), feeding every line to ``log``; ``on_lines()`` after every REPORT_EVERY
    iteration lines."""
    for line in iter(source.readline, b""):
        sink.write(line)
        sink.flush()
        if log.feed(line) and on_lines is not None and len(log.lines) % REPORT_EVERY == 0:
            on_lines()


def run_measured(command: Sequence[str], folder: str, job_id: int, config: ExecConfig,
                 sink: Optional[BinaryIO] = None) -> int:
    """Run ``command`` with its stdout copied to ``sink`` (this process's stdout) and
    parsed; write the report along the way and at the end. Returns the child's exit code
    (128 + signal when a signal ended it, as a shell reports it)."""
    sink = sink if sink is not None else sys.stdout.buffer
    log = IterationLog()
    broken: list[str] = []
    name = report_name(job_id)  # one file per run, rewritten as the run goes

    def save() -> None:
        if broken or log.median_s() is None:
            return
        try:
            write_report(folder, name, job_id, config, log)
        except OSError as exc:
            broken.append(str(exc))
            sys.stderr.write("pipeswift-launch: warning: cannot write the measured iteration time to %s: %s\n"
                             % (folder, exc))

    child = subprocess.Popen(list(command), stdout=subprocess.PIPE)
    assert child.stdout is not None
    previous = {sig: signal.signal(sig, _outlive) for sig in STEP_SIGNALS}
    try:
        copy_and_parse(child.stdout, sink, log, save)
    finally:
        code = child.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    save()
    return 128 - code if code < 0 else code


# Slurm signals every process of a job step (scancel, --signal, the time limit): the
# training gets them itself; the launcher outlives them while it runs, so a Megatron that
# saves a checkpoint on SIGTERM still has its stdout (a dead reader would break its pipe).
STEP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _outlive(signum: int, frame: object) -> None:
    """A signal to the launcher while the training runs: the training decides."""

