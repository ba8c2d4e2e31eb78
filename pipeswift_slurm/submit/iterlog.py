"""Megatron's own iteration times, read by the launcher as the job runs.

The launcher runs the training command as a child, copies its stdout byte for byte to
its own (the job's log does not change), and parses Megatron's iteration lines::

     [2026-01-05 10:00:00] iteration       20/    1000 | consumed samples: 640 |
     elapsed time per iteration (ms): 1234.5 | learning rate: ... |

(megatron-core 0.16's training loop; newer ones print ``(ms): 1234.5/1250.0``, the
interval's and the running mean, of which the first is read). Each line's value is the
mean over the log interval that ends at that iteration. The report is the median of the
latest values (``MAX_SAMPLES``) after the warm-up (lines at iteration <= ``WARMUP_ITERATIONS``
and the first line, which includes compilation and the first allocator growth), with the
layout that ran and the iterations this run made (``IterationLog.iterations``: a resumed
run counts from where it resumed), written to ``<measure dir>/<job id>.<random>.json``
(``report_name``; ``PIPESWIFT_MEASURE_DIR``, a spool folder the site creates like /tmp:
writable by all, sticky): atomically, after every ``REPORT_EVERY`` lines (at most every
``SAVE_EVERY_S``) and at the end. The controller (``slurm/measured.py``) trusts it only as
a claim about that job: the file must belong to the job's user, and the value is bounded
and checked against Slurm's elapsed time.

What the training writes is copied as it comes, in chunks; only the first
``MAX_LINE_BYTES`` of a line are parsed, so neither memory nor time grows with a line's
length. A log that cannot be written costs one warning, and the training goes on. The copy
ends at the end of the output, or ``EXIT_DRAIN_S`` after the training exited when a
process it left running holds its output open. While the child runs, the launcher
outlives the signals Slurm sends the whole step (``STEP_SIGNALS``): the child gets them too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import select
import signal
import statistics
import subprocess
import sys
import time
from collections import deque
from typing import BinaryIO, Callable, Iterator, Optional, Sequence

from pipeswift_slurm.core.files import write_atomic
from pipeswift_slurm.core.model import ExecConfig

# Megatron's iteration lines are a few hundred bytes: only a line's first MAX_LINE_BYTES are
# parsed (the pattern's cost grows with the square of what it searches), and no number of
# more than a dozen digits is one of Megatron's
MAX_LINE_BYTES = 4096
ITERATION_LINE = re.compile(
    rb"\biteration\s+(\d{1,12})\s*/\s*(?:\d{1,12}|infinity)\s*\|.*?elapsed time per iteration \(ms\):"
    rb"\s*([0-9]{1,12}(?:\.[0-9]{0,12})?)(?![0-9])")
WARMUP_ITERATIONS = 3
REPORT_EVERY = 5
SAVE_EVERY_S = 10.0  # and at most this often while the run goes (a tick reads it once a minute or so)
MAX_SAMPLES = 4096  # the median is over the latest values: the run's steady state, in bounded memory
CHUNK_BYTES = 1 << 16
EXIT_DRAIN_S = 10.0  # once the training exited, what a process it left behind writes is copied this long
MEASURE_DIR_ENV = "PIPESWIFT_MEASURE_DIR"


def parse_iteration(line: bytes) -> Optional[tuple[int, float]]:
    """(iteration, seconds per iteration) of one Megatron iteration line, else None."""
    m = ITERATION_LINE.search(line, 0, MAX_LINE_BYTES)
    if m is None:
        return None
    ms = float(m.group(2))
    return (int(m.group(1)), ms / 1000.0) if ms > 0 else None


class IterationLog:
    """The iteration lines seen so far: how many, the first and last iteration numbers, and
    the latest ``MAX_SAMPLES`` values after the warm-up."""

    def __init__(self) -> None:
        self.count = 0
        self.first_iteration = 0
        self.last_iteration = 0
        self.samples: deque[float] = deque(maxlen=MAX_SAMPLES)

    def feed(self, line: bytes) -> bool:
        """Parse one line; True when it was an iteration line."""
        got = parse_iteration(line)
        if got is None:
            return False
        iteration, seconds = got
        if self.count and iteration > WARMUP_ITERATIONS:
            self.samples.append(seconds)
        if not self.count:
            self.first_iteration = iteration
        self.last_iteration = iteration
        self.count += 1
        return True

    def steady(self) -> list[float]:
        """Seconds per iteration of the (latest) lines after the warm-up."""
        return list(self.samples)

    def median_s(self) -> Optional[float]:
        """The median seconds per iteration after the warm-up (None before any)."""
        return statistics.median(self.samples) if self.samples else None

    @property
    def iterations(self) -> int:
        """The iterations this run made: from one log interval before its first line to its
        last (a run resumed from a checkpoint logs from where it resumed, so its last
        iteration number is not its count; rounded down, never more than it ran)."""
        if self.count < 2:
            return self.last_iteration if self.count else 0
        interval = (self.last_iteration - self.first_iteration) // (self.count - 1)
        return max(0, self.last_iteration - max(0, self.first_iteration - interval))


def report(job_id: int, config: ExecConfig, log: IterationLog) -> dict[str, object]:
    """The measurement file's content."""
    return {"job_id": job_id, "config": dataclasses.asdict(config), "median_iter_s": log.median_s(),
            "iterations": log.iterations, "samples": len(log.samples)}


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


def say(text: str) -> None:
    """One line of the launcher's on the job's stderr (one that cannot be written is lost,
    never the job: a full disk must not stop the training)."""
    try:
        sys.stderr.write("pipeswift-launch: %s\n" % text)
        sys.stderr.flush()
    except OSError:
        pass


class _Copy:
    """The training's output as it comes: copied to ``sink`` unchanged (flushed: the job's
    log stays live; a sink that fails is said once and skipped, the training goes on), and
    cut into lines of at most ``MAX_LINE_BYTES`` for ``log``."""

    def __init__(self, sink: BinaryIO, log: IterationLog, on_lines: Optional[Callable[[], None]]) -> None:
        self.sink: Optional[BinaryIO] = sink
        self.log, self.on_lines = log, on_lines
        self.partial = b""

    def feed(self, data: bytes) -> None:
        if self.sink is not None:
            try:
                self.sink.write(data)
                self.sink.flush()
            except OSError as exc:
                self.sink = None
                say("warning: cannot copy the training's output to the job's log (%s); the training goes on" % exc)
        *lines, rest = data.split(b"\n")
        for piece in lines:
            self._line(self.partial + piece[:MAX_LINE_BYTES])
            self.partial = b""
        self.partial = (self.partial + rest[:MAX_LINE_BYTES])[:MAX_LINE_BYTES]

    def close(self) -> None:
        if self.partial:
            self._line(self.partial)
            self.partial = b""

    def _line(self, line: bytes) -> None:
        if self.log.feed(line) and self.on_lines is not None and self.log.count % REPORT_EVERY == 0:
            self.on_lines()


def copy_and_parse(source: BinaryIO, sink: BinaryIO, log: IterationLog,
                   on_lines: Optional[Callable[[], None]] = None) -> None:
    """Copy ``source`` to ``sink`` unchanged, feeding every line to ``log``; ``on_lines()``
    after every REPORT_EVERY iteration lines."""
    copy = _Copy(sink, log, on_lines)
    for data in iter(lambda: source.read1(CHUNK_BYTES), b""):
        copy.feed(data)
    copy.close()


def _child_output(fd: int, child: subprocess.Popen) -> Iterator[bytes]:  # type: ignore[type-arg]
    """What the child writes to ``fd``, as it comes, until end of file, or once the child has
    exited and nothing more comes (a process it left running in the background holds the
    pipe open: waiting for its end would keep the job on its GPUs until the time limit), at
    most ``EXIT_DRAIN_S`` after the exit."""
    deadline: Optional[float] = None
    while True:
        if deadline is None and child.poll() is not None:
            deadline = time.monotonic() + EXIT_DRAIN_S
        wait_s = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
        if not select.select([fd], [], [], wait_s)[0]:
            if deadline is not None:
                return
            continue
        data = os.read(fd, CHUNK_BYTES)
        if not data:
            return
        yield data
        if deadline is not None and time.monotonic() >= deadline:
            return


def run_measured(command: Sequence[str], folder: str, job_id: int, config: ExecConfig,
                 sink: Optional[BinaryIO] = None) -> int:
    """Run ``command`` with its stdout copied to ``sink`` (this process's stdout) and
    parsed; write the report along the way and at the end. Returns the child's exit code
    (128 + signal when a signal ended it, as a shell reports it).

    Raises:
        OSError: the command cannot be started (nothing ran).
    """
    sink = sink if sink is not None else sys.stdout.buffer
    log = IterationLog()
    broken: list[str] = []
    name = report_name(job_id)  # one file per run, rewritten as the run goes

    saved_at = [-SAVE_EVERY_S]

    def save(final: bool = False) -> None:
        if broken or not log.samples or (not final and time.monotonic() - saved_at[0] < SAVE_EVERY_S):
            return
        saved_at[0] = time.monotonic()
        try:
            write_report(folder, name, job_id, config, log)
        except OSError as exc:
            broken.append(str(exc))
            say("warning: cannot write the measured iteration time to %s: %s" % (folder, exc))

    child = subprocess.Popen(list(command), stdout=subprocess.PIPE)
    assert child.stdout is not None
    previous = {sig: signal.signal(sig, _outlive) for sig in STEP_SIGNALS}
    copy = _Copy(sink, log, save)
    try:
        for data in _child_output(child.stdout.fileno(), child):
            copy.feed(data)
        copy.close()
    finally:
        child.stdout.close()  # a process left writing gets EPIPE, not a pipe that never drains
        code = child.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    save(final=True)
    return 128 - code if code < 0 else code


# Slurm signals every process of a job step (scancel, --signal, the time limit): the
# training gets them itself; the launcher outlives them while it runs, so a Megatron that
# saves a checkpoint on SIGTERM still has its stdout (a dead reader would break its pipe).
STEP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _outlive(signum: int, frame: object) -> None:
    """A signal to the launcher while the training runs: the training decides."""

