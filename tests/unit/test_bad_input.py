"""Issue 23: every bad input it lists ("Bad input that still gives a traceback or hangs",
"Accepted silently although wrong") gives exactly one line on stderr and exit 2, quickly:
never a traceback, a hang or a silent success. Each case runs ``python -m
pipeswift_slurm.cli`` as a user would (a subprocess: stderr as the user sees it, and a
timeout that turns a hang into a failure)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

SHAPE = ["--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024"]
TRACE_HEADER = "job_id,submit_time_s,duration_s,num_gpus,user,cluster\n"
TIMEOUT_S = 60


def trace(tmp: Path, rows: str) -> str:
    path = tmp / "trace.csv"
    path.write_text(TRACE_HEADER + rows)
    return str(path)


def config(tmp: Path, text: str) -> str:
    path = tmp / "config.toml"
    path.write_text(text)
    return str(path)


def a_file(tmp: Path) -> Path:
    """A plain file: a path under it cannot be written, by root either (NotADirectory)."""
    path = tmp / "plain-file"
    path.write_text("x")
    return path


def read_only_folder(tmp: Path) -> Path:
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder (the path-under-a-file case covers root)")
    folder = tmp / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def history(tmp: Path) -> str:
    """An empty history database (the schema, no ticks)."""
    from pipeswift_slurm.store.history import Store

    path = tmp / "h.sqlite"
    Store.from_url("sqlite:///%s" % path)
    return str(path)


SIM = ["simulate", "--policy", "fifo", "--jobs", "5", "--gpus", "16"]
CASES: dict[str, Callable[[Path], list[str]]] = {
    # Bad input that gave a traceback or hung
    "estimate --train-iters 10^400": lambda t: ["estimate", "--", *SHAPE, "--train-iters", "1" + "0" * 400],
    "simulate inf duration": lambda t: ["simulate", "--policy", "fifo", "--gpus", "16", "--workload",
                                        trace(t, "j1,0,inf,8,alice,vc1\nj2,10,100,8,bob,vc1\n")],
    "simulate nan duration": lambda t: ["simulate", "--policy", "fifo", "--gpus", "16", "--workload",
                                        trace(t, "j1,0,nan,8,alice,vc1\n")],
    "simulate --truth-bias gpt=nan": lambda t: [*SIM, "--truth-bias", "gpt=nan"],
    "simulate --truth-bias gpt=inf": lambda t: [*SIM, "--truth-bias", "gpt=inf"],
    "simulate --truth-bias gpt=0": lambda t: [*SIM, "--truth-bias", "gpt=0"],
    # found by a fuzzing pass (release notes: "hostile input, one line each")
    "simulate --truth-bias gpt=1e308": lambda t: [*SIM, "--truth-bias", "gpt=1e308"],
    "simulate --wait-bound-h 1e308": lambda t: [*SIM, "--wait-bound-h", "1e308"],
    "simulate --policy label with a slash": lambda t: [*SIM[:1], "--policy", "fifo,pipeswift:x/y", *SIM[3:],
                                                        "--db", str(t / "h.sqlite")],
    "simulate --policy empty label": lambda t: [*SIM[:1], "--policy", "pipeswift:", *SIM[3:]],
    "simulate --policy twice": lambda t: [*SIM[:1], "--policy", "fifo,fifo", *SIM[3:]],
    "simulate --knob of a policy without knobs": lambda t: [*SIM, "--knob", "fifo.x=1"],
    "simulate --jobs 10^20": lambda t: [*SIM, "--jobs", "1" + "0" * 20],
    # an empty value wrote nothing and exited 0, as if the option were not given
    "simulate --json ''": lambda t: [*SIM, "--json", ""],
    "simulate --db ''": lambda t: [*SIM, "--db", ""],
    "simulate --plot ''": lambda t: [*SIM, "--plot", ""],
    "report --html=": lambda t: ["report", "jct", "--db", history(t), "--html="],
    "demo --plot ''": lambda t: ["demo", "--plot", "", "--db", str(t / "d.sqlite")],
    # its history then had times no report could print
    "simulate --start 9999-12-31": lambda t: [*SIM, "--start", "9999-12-31", "--db", str(t / "y.sqlite")],
    # a gzip file of one 2-GB line took 4 GB of memory to refuse: a line is bounded now
    "simulate a line of 100,000 characters": lambda t: ["simulate", "--policy", "fifo", "--gpus", "16", "--workload",
                                                       trace(t, "1" * 100_000 + "\n")],
    "profile --out in no folder": lambda t: ["profile", "--out", str(t / "no" / "p.toml"), "--", *SHAPE],
    "profile --micro-batch-sizes 99999999": lambda t: ["profile", "--micro-batch-sizes", "99999999", "--", *SHAPE],
    "simulate --load nan": lambda t: [*SIM, "--load", "nan"],
    "simulate --load inf": lambda t: [*SIM, "--load", "inf"],
    "simulate --own-layout-first without --learn": lambda t: [*SIM, "--own-layout-first"],
    "simulate --load 1e308": lambda t: [*SIM, "--load", "1e308"],
    # found by fuzzing: sigma 1000 overflowed (a traceback), sigma 10 never ended
    "simulate --truth-noise 1000": lambda t: [*SIM, "--truth-noise", "1000"],
    "simulate --truth-noise 10": lambda t: [*SIM, "--truth-noise", "10"],
    "simulate --truth-shape-noise 1e300": lambda t: [*SIM, "--policy", "fifo,pipeswift", "--truth-shape-noise", "1e300"],
    "simulate --flex nan": lambda t: [*SIM, "--flex", "nan"],
    "simulate --tick-interval inf": lambda t: [*SIM, "--tick-interval", "inf"],
    "simulate --gpus 1000000007": lambda t: ["simulate", "--policy", "fifo", "--jobs", "5", "--gpus", "1000000007"],
    "simulate --drop-oversized dropping every job": lambda t: [
        "simulate", "--policy", "fifo", "--gpus", "16", "--drop-oversized", "--workload",
        trace(t, "j1,0,100,800,alice,vc1\nj2,5,100,64,bob,vc1\n")],
    "postgresql URL without its driver": lambda t: [
        "controller", "tick", "--config", config(t, '[store]\nurl = "postgresql+nosuchdriver://u@h/db"\n')],
    "lock file in a folder that cannot be made": lambda t: [
        "controller", "tick", "--config", config(t, '[store]\nurl = "%s"\n[controller]\nlock_file = "%s"\n'
                                                 % (t / "h.sqlite", a_file(t) / "sub" / "lock"))],
    "simulate --db under a file": lambda t: [*SIM, "--db", str(a_file(t) / "h.sqlite")],
    "simulate --json under a file": lambda t: [*SIM, "--json", str(a_file(t) / "m.json")],
    "simulate --db in a missing folder": lambda t: [*SIM, "--db", str(t / "missing" / "h.sqlite")],
    "simulate --db in a read-only folder": lambda t: [*SIM, "--db", str(read_only_folder(t) / "h.sqlite")],
    "simulate --json in a read-only folder": lambda t: [*SIM, "--json", str(read_only_folder(t) / "m.json")],
    "estimate --num-gpus 1000000007": lambda t: ["estimate", "--num-gpus", "1000000007", "--", *SHAPE],
    "plan --gpus 1-100000000": lambda t: ["plan", "--gpus", "1-100000000", "--", *SHAPE],
    "plan --gpus 1-10^5000": lambda t: ["plan", "--gpus", "1-1" + "0" * 5000, "--", *SHAPE],
    "plan global batch 10^15": lambda t: ["plan", "--gpus", "8", "--", *SHAPE, "--global-batch-size", "1" + "0" * 15],
    "explain job id 10^23": lambda t: ["explain", "9" * 23, "--db", history(t)],
    "report decisions --job 10^23": lambda t: ["report", "decisions", "--job", "9" * 23, "--db", history(t)],
    "report --since 1e400": lambda t: ["report", "jct", "--since", "1e400", "--db", history(t)],
    "report --html in a missing folder": lambda t: ["report", "jct", "--html", str(t / "missing" / "r.html"),
                                                    "--db", history(t)],
    "report --plot under a file": lambda t: ["report", "jct", "--plot", str(a_file(t) / "sub"), "--db", history(t)],
    # Accepted silently although wrong
    "estimate Arabic digits": lambda t: ["estimate", "--", *SHAPE, "--num-layers", "\u0662\u0664"],
    "estimate fullwidth digits": lambda t: ["estimate", "--", *SHAPE, "--num-layers", "\uff12\uff14"],
    "estimate 1_024": lambda t: ["estimate", "--", *SHAPE, "--hidden-size", "1_024"],
    "plan --gpus Arabic digits": lambda t: ["plan", "--gpus", "\u0668", "--", *SHAPE],
    "plan --gpus 1_6": lambda t: ["plan", "--gpus", "1_6", "--", *SHAPE],
    "config plan_depth=-1": lambda t: [*SIM, "--config", config(t, '[policy]\nname = "pipeswift"\n'
                                                               '[policy.knobs]\nplan_depth = -1\n')],
    "config aging=nan": lambda t: [*SIM, "--config", config(t, '[policy]\nname = "pipeswift"\n'
                                                           '[policy.knobs]\naging = nan\n')],
    "config wait_bound_s='long'": lambda t: [*SIM, "--config", config(t, '[policy]\nname = "pipeswift"\n'
                                                                    '[policy.knobs]\nwait_bound_s = "long"\n')],
    "simulate --partition without a shape": lambda t: [*SIM, "--partition", "a100=A100-80GB"],
    "simulate --partition unknown GPU type": lambda t: [*SIM, "--partition", "a=B300:2x8"],
    "simulate --partition twice the same name": lambda t: [*SIM, "--partition", "a=A100-80GB:1x8",
                                                           "--partition", "a=H100-80GB:1x8"],
    "simulate --truth-partition-factor unknown partition": lambda t: [
        *SIM, "--partition", "a=A100-80GB:2x8", "--truth-partition-factor", "b=1.2"],
    "simulate --truth-partition-factor a=nan": lambda t: [
        *SIM, "--partition", "a=A100-80GB:2x8", "--truth-partition-factor", "a=nan"],
    "config partition GPU type unknown": lambda t: [*SIM, "--config", config(
        t, '[slurm.partition_gpu_types]\nh100 = "H900"\n')],
    "controller tick with wait_bound_s='long'": lambda t: [
        "controller", "tick", "--config", config(t, '[store]\nurl = "%s"\n[policy]\nname = "pipeswift"\n'
                                                 '[policy.knobs]\nwait_bound_s = "long"\n' % (t / "h.sqlite"))],
    # found by fuzzing the admin's side (tracebacks, or a daemon that ticks back to back or never)
    "controller run --interval nan": lambda t: ["controller", "run", "--dry-run", "--interval", "nan"],
    "controller run --interval inf": lambda t: ["controller", "run", "--dry-run", "--interval", "inf"],
    "report queue-ratio --threshold nan": lambda t: ["report", "queue-ratio", "--threshold", "nan",
                                                     "--db", history(t)],
    "report waits --wait-bound-h nan": lambda t: ["report", "waits", "--wait-bound-h", "nan", "--db", history(t)],
    "explain --gpus-per-node 99999999": lambda t: ["explain", "5", "--gpus-per-node", "99999999", "--db", history(t)],
    "report jct on a damaged history": lambda t: ["report", "jct", "--db", damaged_history(t)],
    "report all on a damaged history": lambda t: ["report", "all", "--db", damaged_history(t)],
    "explain on a damaged history": lambda t: ["explain", "5", "--db", damaged_history(t)],
    # found by fuzzing the reports: bytes where a name belongs (--json), a time of 2**63
    "explain --json with bytes in a job's name": lambda t: ["explain", "5", "--json", "--db", edited_history(
        t, "UPDATE jobs SET name = X'ff00' WHERE job_id = 5")],
    "report queue-ratio with a submit time of 2**63": lambda t: ["report", "queue-ratio", "--db", edited_history(
        t, "UPDATE jobs SET submit_time = 9223372036854775807 WHERE job_id = 5")],
    "report --db with a port that is no number": lambda t: ["report", "jct", "--db", "postgresql://u@db:x/p"],
    "report --db sqlite driver not installed": lambda t: ["report", "jct", "--db",
                                                          "sqlite+pysqlcipher:///%s" % history(t)],
    "config nested too deeply": lambda t: ["controller", "tick", "--dry-run", "--config",
                                           config(t, "x = " + "[" * 5000 + "]" * 5000 + "\n")],
    "config knob an int past 1e308": lambda t: ["controller", "tick", "--dry-run", "--config", config(
        t, '[policy]\nname = "pipeswift"\n[policy.knobs]\nwait_bound_s = %s\n' % ("9" * 400))],
    "config NUL in a path": lambda t: ["controller", "tick", "--dry-run", "--config",
                                       config(t, '[controller]\nlock_file = "/tmp/a\\u0000b"\n')],
    # an empty --config was a config-less dry run for the controller, and ignored by simulate
    "controller tick --config ''": lambda t: ["controller", "tick", "--config", ""],
    "simulate --config ''": lambda t: [*SIM, "--config", ""],
    "simulate PriorityMaxAge superscript": lambda t: [*SIM, "--slurm-config",
                                                      slurm_conf(t, "PriorityMaxAge=\u00b2\n")],
    "simulate --slurm-config in UTF-16": lambda t: [*SIM, "--slurm-config", slurm_conf(
        t, "PriorityWeightAge=1000\nPriorityMaxAge=1-0\n", "utf-16")],
    "simulate PriorityMaxAge 400 digits": lambda t: [*SIM, "--slurm-config",
                                                     slurm_conf(t, "PriorityMaxAge=%s\n" % ("9" * 400))],
}


def damaged_history(tmp: Path) -> str:
    """A history with text where a tick's time belongs (SQLite keeps it: it does not enforce
    a column's type) and a job whose times are past any date."""
    return edited_history(tmp, "UPDATE ticks SET started_at = 's', finished_at = 's'",
                          "UPDATE jobs SET submit_time = 1e308, start_time = 1e308, end_time = 1e308")


def edited_history(tmp: Path, *edits: str) -> str:
    """A history of one tick and one finished job (5), then ``edits`` (SQL, as a user who
    may write the file could make them)."""
    import sqlite3

    path = history(tmp)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO ticks (tick_id, started_at, finished_at, policy, dry_run, status)"
                   " VALUES (1, 1.7e9, 1.7e9, 'pipeswift', 0, 'ok')")
        db.execute("INSERT INTO jobs (job_id, name, state, submit_time, start_time, end_time, queue_s, run_s, gpus)"
                   " VALUES (5, 'train', 'COMPLETED', 1.7e9, 1.7e9 + 60, 1.7e9 + 600, 60, 540, 1)")
        for sql in edits:
            db.execute(sql)
    return path


def slurm_conf(tmp: Path, text: str, encoding: str = "utf-8") -> str:
    path = tmp / "slurm.conf"
    path.write_text(text, encoding=encoding)
    return str(path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    argv = CASES[case](tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("PIPESWIFT_CONFIG", None)
    env.pop("PIPESWIFT_DB", None)
    done = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli", *argv], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=env, cwd=tmp_path, check=False)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and lines[0].startswith("pipeswift: error: ")
    assert not (tmp_path / "plain-file" / "sub").exists()
