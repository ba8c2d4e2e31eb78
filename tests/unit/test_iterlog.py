"""The launcher reads Megatron's iteration lines as the job runs (``submit/iterlog.py``):
the parser on real-format lines among noise, the byte-identical copy, the report file."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from pipeswift_slurm.core.model import ExecConfig
from pipeswift_slurm.submit.iterlog import IterationLog, copy_and_parse, parse_iteration, run_measured

CFG = ExecConfig(tp=2, pp=2, dp=1, micro_batch_size=1, num_micro_batches=8, num_nodes=1, gpus_per_node=4)

# megatron-core 0.16 training_log (timestamp, consumed samples, throughput, losses), a newer
# one with the running mean after a slash, and what surrounds them in a real log
LOG = (
    "using world size: 4, data-parallel size: 1, tensor-model-parallel size: 2\n"
    "[after dataloaders are built] datetime: 2026-01-05 10:00:00\n"
    " [2026-01-05 10:00:05] iteration        1/     100 | consumed samples:           32 |"
    " elapsed time per iteration (ms): 9000.0 | learning rate: 1.000000E-04 | global batch size:    32 |"
    " lm loss: 1.083E+01 | loss scale: 1.0 | grad norm: 12.345 | number of skipped iterations:   0 |"
    " number of nan iterations:   0 |\n"
    "[Rank 0] (after 1 iterations) memory (MB) | allocated: 1234.5 | max allocated: 2345.6\n"
    " [2026-01-05 10:00:07] iteration        2/     100 | consumed samples:           64 |"
    " elapsed time per iteration (ms): 1100.0 | learning rate: 1.0E-04 |\n"
    " [2026-01-05 10:00:09] iteration        5/     100 | consumed samples:          160 |"
    " elapsed time per iteration (ms): 1000.5 | throughput per GPU (TFLOP/s/GPU): 312.4 |\n"
    " [2026-01-05 10:00:10.123456] iteration       10/     100 | consumed samples:          320 |"
    " elapsed time per iteration (ms): 990.0/995.2 | learning rate: 1.0E-04 |\n"
    "  validation loss at iteration 10 | lm loss value: 1.0E+01 |\n"
    " iteration       15/infinity | consumed samples: 480 | elapsed time per iteration (ms): 1010.0 |\n"
    "WARNING: iteration time (ms) went up\n"
)


def test_parser_reads_iteration_lines_and_skips_noise() -> None:
    got = [parse_iteration(line.encode()) for line in LOG.splitlines()]
    values = [g for g in got if g is not None]
    assert values == [(1, 9.0), (2, 1.1), (5, 1.0005), (10, 0.99), (15, 1.01)]


def test_median_skips_the_warm_up() -> None:
    log = IterationLog()
    for line in LOG.splitlines(keepends=True):
        log.feed(line.encode())
    assert log.steady() == [1.0005, 0.99, 1.01]  # not iteration 1 (first line) nor 2 (<= 3)
    assert log.median_s() == pytest.approx(1.0005)
    assert log.last_iteration == 15


def test_copy_is_byte_identical() -> None:
    raw = LOG.encode() + b"\xff\xfe not utf-8\r\nno newline at the end"
    sink = io.BytesIO()
    log = IterationLog()
    copy_and_parse(io.BytesIO(raw), sink, log)
    assert sink.getvalue() == raw
    assert log.count == 5


def test_run_measured_writes_the_report_and_keeps_the_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nsys.stdout.write(%r)\nsys.stderr.write('err line\\n')\nsys.exit(3)\n" % LOG)
    sink = io.BytesIO()
    code = run_measured([sys.executable, str(script)], str(tmp_path), 42, CFG, sink=sink)
    assert code == 3
    assert sink.getvalue() == LOG.encode()
    [path] = tmp_path.glob("42.*.json")  # one file per run, its name random (``report_name``)
    report = json.loads(path.read_text())
    assert report["job_id"] == 42 and report["iterations"] == 15 and report["samples"] == 3
    assert report["median_iter_s"] == pytest.approx(1.0005)
    assert ExecConfig(**report["config"]) == CFG
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)


def test_unwritable_folder_warns_and_the_job_still_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nsys.stdout.write(%r)\n" % LOG)
    code = run_measured([sys.executable, str(script)], str(tmp_path / "missing"), 42, CFG, sink=io.BytesIO())
    assert code == 0
    assert capsys.readouterr().err.count("cannot write the measured iteration time") == 1


def test_the_launcher_measures_when_the_site_names_a_folder(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``pipeswift-launch`` with PIPESWIFT_MEASURE_DIR set runs the command as a child (not
    exec), the job's stdout unchanged, and leaves the report named after the job."""
    from pipeswift_slurm.submit.launcher import launch

    script = tmp_path / "pretrain_gpt.py"
    script.write_text("import sys\nsys.stdout.write(%r)\n" % LOG)
    argv = ["--", sys.executable, str(script), "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads",
            "4", "--seq-length", "256", "--max-position-embeddings", "256", "--micro-batch-size", "1",
            "--global-batch-size", "8", "--train-iters", "100"]
    env = {"SLURM_JOB_ID": "77", "SLURM_GPUS_ON_NODE": "1", "PIPESWIFT_MEASURE_DIR": str(tmp_path)}
    code = launch(argv, env, run=lambda a: "", execvp=lambda *a: pytest.fail("exec'd: nothing measured"))
    assert code == 0
    assert capfd.readouterr().out == LOG
    [path] = tmp_path.glob("77.*.json")
    report = json.loads(path.read_text())
    assert report["job_id"] == 77 and ExecConfig(**report["config"]).gpus == 1


def test_the_launcher_outlives_slurms_signal_while_the_training_saves(tmp_path: Path) -> None:
    """scancel / the time limit send SIGTERM to every process of the step: the launcher must
    keep copying until the training has saved and exited, or its last lines break its pipe."""
    import signal
    import subprocess
    import time

    train = tmp_path / "train.py"
    train.write_text("import signal, sys, time\n"
                     "def bye(*a):\n    time.sleep(0.5)\n    print('saved checkpoint', flush=True)\n    sys.exit(0)\n"
                     "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(30)\n")
    code = ("import sys; from pipeswift_slurm.core.model import ExecConfig; "
            "from pipeswift_slurm.submit.iterlog import run_measured; "
            "sys.exit(run_measured([sys.executable, %r], %r, 5, ExecConfig(1, 1, 1, 1, 1)))" % (str(train), str(tmp_path)))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True,
                            env=dict(os.environ))
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGTERM)  # as slurmstepd does
    rest, _ = proc.communicate(timeout=20)
    assert rest == b"saved checkpoint\n" and proc.returncode == 0


# ---------------------------------------------------------------- found by fuzzing the launcher


def test_a_resumed_run_reports_the_iterations_it_made() -> None:
    """A run resumed from a checkpoint at 500 logs 510..1000: it made 500 iterations, and the
    controller checks iterations x time against Slurm's elapsed time (1,000 refused it)."""
    log = IterationLog()
    for i in range(510, 1001, 10):
        log.feed(b" iteration %d/ 1000 | elapsed time per iteration (ms): 1000.0 |" % i)
    assert log.iterations == 500
    fresh = IterationLog()
    for line in LOG.splitlines():
        fresh.feed(line.encode())
    assert fresh.iterations == 15


def test_numbers_past_megatrons_and_endless_lines_are_no_iteration_lines() -> None:
    assert parse_iteration(b" iteration %s/10 | elapsed time per iteration (ms): 1.0 |" % (b"9" * 5000)) is None
    assert parse_iteration(b" iteration 5/10 | elapsed time per iteration (ms): %s |" % (b"9" * 5000)) is None
    sink, log = io.BytesIO(), IterationLog()
    raw = b"x" * 3_000_000 + b"\n" + LOG.encode()  # a line of 3 MB: only its start is kept for the parser
    copy_and_parse(io.BytesIO(raw), sink, log)
    assert sink.getvalue() == raw and log.count == 5


class _FullDisk(io.BytesIO):
    def write(self, data):  # type: ignore[no-untyped-def, override]
        raise OSError(28, "No space left on device")


def test_a_log_that_cannot_be_written_costs_one_warning_and_the_training_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nfor _ in range(2000):\n    sys.stdout.write(%r)\nsys.exit(4)\n" % LOG)
    assert run_measured([sys.executable, str(script)], str(tmp_path), 42, CFG, sink=_FullDisk()) == 4
    assert capsys.readouterr().err.count("cannot copy the training's output") == 1
    [path] = tmp_path.glob("42.*.json")
    assert json.loads(path.read_text())["median_iter_s"] == pytest.approx(1.0, rel=0.01)


def test_a_process_left_running_in_the_background_does_not_hold_the_job(tmp_path: Path) -> None:
    """The training exits but a process it started still holds its stdout: reading to the
    end of the output waited for that process (here 60 s; a job's time limit in a real one)."""
    import subprocess

    script = tmp_path / "train.py"
    script.write_text("import subprocess, sys\nsubprocess.Popen(['sleep', '60'], stderr=subprocess.DEVNULL)\n"
                      "sys.stdout.write(%r)\n" % LOG)  # its stderr is this test's pipe: only stdout is held
    code = ("import sys; from pipeswift_slurm.core.model import ExecConfig; "
            "from pipeswift_slurm.submit.iterlog import run_measured; "
            "sys.exit(run_measured([sys.executable, %r], %r, 5, ExecConfig(1, 1, 1, 1, 1)))" % (str(script), str(tmp_path)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30, env=dict(os.environ))
    assert done.returncode == 0 and done.stdout == LOG.encode()
