"""``pipeswift simulate`` and ``pipeswift demo`` through CliRunner: bad input (one stderr
line, exit 2), oversized jobs, JSON keys, the PNG plot, the SQLite history, and the demo's
table and "where the gains come from" lines (on a smaller workload)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from pipeswift_slurm.cli.main import pipeswift

DATA = Path(__file__).resolve().parents[1] / "data" / "sim"
POLICY_KEYS = {"policy", "mean_jct_s", "median_jct_s", "p95_jct_s", "p99_jct_s", "mean_jct_s_by_class",
               "p99_jct_s_large", "mean_queue_s", "queue_ratio", "max_wait_s", "jobs_over_wait_bound",
               "gpu_utilisation", "makespan_s", "reconfigured_jobs", "decide_ms_mean", "decide_ms_max"}
SMALL = ["--gpus", "16", "--gpus-per-node", "8"]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def invoke(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(pipeswift, list(args), catch_exceptions=False)


def assert_one_error_line(result: Result, *words: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pipeswift: error: ")
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def test_malformed_row_names_file_line_and_column(runner: CliRunner) -> None:
    path = DATA / "bad-duration.csv"
    result = invoke(runner, "simulate", "--workload", str(path), *SMALL, "--policy", "fifo")
    line = assert_one_error_line(result, "bad-duration.csv:3", "duration_s", "'abc'")
    assert result.stdout == ""
    assert "not a number" in line


def test_oversized_job_is_reported_and_can_be_dropped(runner: CliRunner) -> None:
    path = DATA / "tiny-trace.csv"
    result = invoke(runner, "simulate", "--workload", str(path), *SMALL, "--policy", "fifo")
    assert_one_error_line(result, "huge", "32 GPUs", "--drop-oversized")
    result = invoke(runner, "simulate", "--workload", str(path), *SMALL, "--policy", "fifo,pipeswift",
                    "--drop-oversized", "--json", "-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["workload"]["dropped_oversized"] == 1 and data["workload"]["jobs"] == 5
    assert [p["policy"] for p in data["policies"]] == ["fifo", "pipeswift"]


def test_unplaceable_node_shape_is_bad_input_not_a_traceback(runner: CliRunner) -> None:
    """BUG (reported): on nodes of 3 GPUs the workload conversion raises
    MegatronArgError (tp 2 does not fit inside a node of 3 GPUs) through the command."""
    result = runner.invoke(pipeswift, ["simulate", "--gpus", "12", "--gpus-per-node", "3", "--jobs", "40",
                                       "--policy", "fifo"])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 2), result.output


def test_json_to_stdout_has_the_documented_keys(runner: CliRunner) -> None:
    result = invoke(runner, "simulate", *SMALL, "--jobs", "25", "--policy", "fifo,slurm,sjf,tiresias,pipeswift",
                    "--json", "-", "--seed", "3")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # nothing but the JSON on stdout
    assert set(data) == {"spec", "workload", "policies"}
    assert data["spec"]["gpus"] == 16 and data["spec"]["seed"] == 3 and data["spec"]["workload"] == "synthetic"
    assert [p["policy"] for p in data["policies"]] == ["fifo", "slurm", "sjf", "tiresias", "pipeswift"]
    for metrics in data["policies"]:
        assert POLICY_KEYS <= set(metrics), POLICY_KEYS - set(metrics)
        assert metrics["jobs"] == 25 == data["workload"]["jobs"]
        assert set(metrics["mean_jct_s_by_class"]) == {"small", "medium", "large"}
        assert metrics["mean_jct_s"] >= metrics["mean_queue_s"] >= 0
        assert 0 < metrics["gpu_utilisation"] <= 1
    again = invoke(runner, "simulate", *SMALL, "--jobs", "25", "--policy", "fifo,slurm,sjf,tiresias,pipeswift",
                   "--json", "-", "--seed", "3")
    strip = [{k: v for k, v in m.items() if not k.startswith(("decide_ms", "wall_s"))}
             for m in json.loads(again.stdout)["policies"]]
    assert strip == [{k: v for k, v in m.items() if not k.startswith(("decide_ms", "wall_s"))}
                     for m in data["policies"]]


def test_text_table_plot_and_db(runner: CliRunner, tmp_path: Path) -> None:
    png, db = tmp_path / "cdf.png", tmp_path / "hist.sqlite"
    result = invoke(runner, "simulate", "--workload", str(DATA / "tiny-trace.csv"), *SMALL, "--drop-oversized",
                    "--policy", "pipeswift", "--plot", str(png), "--db", str(db))
    assert result.exit_code == 0, result.output
    assert "workload:" in result.stdout and "mean JCT" in result.stdout and "pipeswift" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT job_id, state, opted_in FROM jobs ORDER BY job_id").fetchall()
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5]
    assert all(r[1] == "COMPLETED" for r in rows), rows
    assert all(r[2] for r in rows)


def test_db_per_policy_when_several(runner: CliRunner, tmp_path: Path) -> None:
    """pipeswift's history is the file given (so the README's next command, ``report --db``
    with the same path, reads it); the others lie beside it, as the output says."""
    db = tmp_path / "h.sqlite"
    result = invoke(runner, "simulate", "--workload", str(DATA / "tiny-trace.csv"), *SMALL, "--drop-oversized",
                    "--policy", "fifo,pipeswift", "--db", str(db))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.glob("*.sqlite")) == ["h.fifo.sqlite", "h.sqlite"]
    assert "pipeswift in %s" % db in result.stderr and "fifo in %s" % (tmp_path / "h.fifo.sqlite") in result.stderr
    for name, policy in (("h.fifo.sqlite", "fifo"), ("h.sqlite", "pipeswift")):
        with sqlite3.connect(tmp_path / name) as conn:
            assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 5
            assert conn.execute("SELECT DISTINCT policy FROM ticks").fetchall() == [(policy,)]
    report = invoke(runner, "report", "all", "--db", str(db))
    assert report.exit_code == 0, report.output
    # handed over in the rollback-journal mode: reading it leaves nothing beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.fifo.sqlite", "h.sqlite"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_unknown_policy_and_bad_truth_bias(runner: CliRunner) -> None:
    assert_one_error_line(invoke(runner, "simulate", *SMALL, "--policy", "fifo,lottery"), "lottery", "known:")
    assert_one_error_line(invoke(runner, "simulate", *SMALL, "--policy", "fifo", "--truth-bias", "gpt"),
                          "--truth-bias")
    assert_one_error_line(invoke(runner, "simulate", "--gpus", "12", "--gpus-per-node", "8", "--policy", "fifo"),
                          "--gpus 12", "--gpus-per-node 8")


def _metrics(result: Result) -> dict[str, dict]:
    assert result.exit_code == 0, result.output
    return {m["policy"]: {k: v for k, v in m.items() if not k.startswith(("decide_ms", "wall_s", "policy"))}
            for m in json.loads(result.stdout)["policies"]}


def test_presets_and_knobs_reach_the_policy(runner: CliRunner) -> None:
    """pipeswift:order is a preset (the users' configs); --knob sets the same knob on any
    label, with the same schedule; without it the label is plain pipeswift."""
    got = _metrics(invoke(runner, "simulate", *SMALL, "--jobs", "30", "--json", "-",
                          "--policy", "pipeswift,pipeswift:order,pipeswift:mine,pipeswift:plain",
                          "--knob", "pipeswift:mine.reconfigure=false"))
    assert got["pipeswift:order"] == got["pipeswift:mine"] != got["pipeswift"] == got["pipeswift:plain"]
    assert got["pipeswift:order"]["reconfigured_jobs"] == 0 < got["pipeswift"]["reconfigured_jobs"]
    bound = _metrics(invoke(runner, "simulate", *SMALL, "--jobs", "30", "--json", "-", "--policy",
                            "pipeswift", "--knob", "pipeswift.wait_bound_s=60",
                            "--knob", "pipeswift.promote_fraction=0"))
    assert bound["pipeswift"] != got["pipeswift"]  # every job promoted at once: submit order
    queues = _metrics(invoke(runner, "simulate", *SMALL, "--jobs", "30", "--json", "-", "--policy",
                             "tiresias,tiresias:one", "--knob", "tiresias:one.queue_limits_gpu_s=1e12"))
    assert queues["tiresias"] != queues["tiresias:one"]  # one queue: least attained service throughout


@pytest.mark.parametrize("knob, words", [
    ("pipeswift", ["expected POLICY.NAME=VALUE"]),
    ("sjf.aging=1", ["sjf is not one of --policy"]),
    ("pipeswift.colour=red", ["pipeswift has no knob colour", "preempt_margin"]),
    ("pipeswift.preempt=maybe", ["bad value for preempt", "true or false"]),
    ("pipeswift.plan_depth=1.5", ["bad value for plan_depth"]),
])
def test_bad_knobs_are_one_error_line(runner: CliRunner, knob: str, words: list[str]) -> None:
    result = invoke(runner, "simulate", *SMALL, "--policy", "fifo,pipeswift", "--knob", knob)
    assert_one_error_line(result, *words)


SITE = """[slurm]
gpu_type = "H100-80GB"
gpus_per_node = 4
[policy]
name = "pipeswift"
[policy.knobs]
preempt = true
reshape_running = true
[controller]
allow_requeue = %s
"""


def test_config_runs_the_controllers_policy_as_the_site_set_it(runner: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    runs = {}
    for allow in ("true", "false"):
        config.write_text(SITE % allow)
        result = invoke(runner, "simulate", "--gpus", "32", "--jobs", "60", "--policy", "slurm,pipeswift",
                        "--config", str(config), "--json", "-")
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["spec"]["gpu_type"] == "H100-80GB" and data["spec"]["gpus_per_node"] == 4
        runs[allow] = {m["policy"]: m for m in data["policies"]}
        assert list(runs[allow]) == ["slurm", "pipeswift", "pipeswift:site"]
    assert runs["true"]["pipeswift:site"]["restarts"] > 0 == runs["true"]["pipeswift"]["restarts"]
    assert runs["false"]["pipeswift:site"]["restarts"] == 0  # the site does not allow requeue
    # the command line still wins over the config
    result = invoke(runner, "simulate", "--gpus", "32", "--jobs", "20", "--policy", "slurm", "--gpu-type",
                    "A100-80GB", "--gpus-per-node", "8", "--config", str(config), "--json", "-")
    assert json.loads(result.stdout)["spec"]["gpu_type"] == "A100-80GB"


def test_bad_config_is_one_error_line(runner: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[policy.knobs]\ncolour = 1\n")
    result = invoke(runner, "simulate", *SMALL, "--config", str(config))
    assert_one_error_line(result, str(config), "[policy.knobs] pipeswift has no knob colour")
    config.write_text("[slurm]\ngpu_type = \"Z80\"\n")
    assert_one_error_line(invoke(runner, "simulate", *SMALL, "--config", str(config)), "[slurm] gpu_type", "Z80")


def test_window_selection_and_load(runner: CliRunner) -> None:
    path = DATA / "tiny-trace.csv"
    result = invoke(runner, "simulate", "--workload", str(path), *SMALL, "--drop-oversized", "--policy", "fifo",
                    "--start-day", "1", "--window-days", "1", "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["workload"]["jobs"] == 2
    result = invoke(runner, "simulate", "--workload", str(path), *SMALL, "--drop-oversized", "--policy", "fifo",
                    "--start-day", "9", "--json", "-")
    assert_one_error_line(result, "no job in the selected window")
    result = invoke(runner, "simulate", "--workload", str(path), *SMALL, "--drop-oversized", "--policy", "fifo",
                    "--load", "0.5", "--json", "-")
    assert json.loads(result.stdout)["workload"]["offered_load"] == pytest.approx(0.5)


def test_demo_prints_the_table_and_where_the_gains_come_from(runner: CliRunner, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ``demo`` command on 40 instead of 300 synthetic jobs (same code path)."""
    from pipeswift_slurm.sim import runner as sim_runner

    real = sim_runner.RunSpec

    def small_spec(*args: Any, **kw: Any) -> Any:
        return replace(real(*args, **kw), synthetic_jobs=40)

    monkeypatch.setattr(sim_runner, "RunSpec", small_spec)
    db = tmp_path / "demo.sqlite"
    result = invoke(runner, "demo", "--db", str(db))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "workload: synthetic, 40 jobs" in out
    for name in ("fifo", "slurm", "sjf", "tiresias", "pipeswift", "pipeswift:order", "pipeswift:config"):
        assert "\n%s " % name in out, name
    assert "where the gains come from (mean JCT relative to slurm):" in out
    for label in ("queue order + waiting bound only", "+ best pipeline config", "+ resizing pending jobs",
                  "lower bound"):
        assert label in out
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 40


def _table(out: str) -> tuple[list[str], list[list[str]]]:
    """The comparison table of ``out``: headers (split on 2+ spaces) and rows."""
    import re

    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("policy "))
    headers = re.split(r"\s{2,}", lines[start].strip())
    rows = []
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("columns:"):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return headers, rows


def test_table_has_one_unit_per_column_named_in_its_header_and_a_legend(runner: CliRunner) -> None:
    result = invoke(runner, "simulate", *SMALL, "--jobs", "30", "--policy", "fifo,pipeswift", "--seed", "2")
    assert result.exit_code == 0, result.output
    headers, rows = _table(result.stdout)
    durations = [i for i, h in enumerate(headers) if h.endswith(("(s)", "(min)", "(h)", "(d)"))]
    assert [headers[i].rsplit(" (", 1)[0] for i in durations] == ["mean JCT", "median", "P99", "P99 large",
                                                                  "mean queue", "max wait"]
    for row in rows:
        assert len(row) == len(headers)
        for i in durations:
            float(row[i])  # a bare number: the unit is the header's, never a suffix of the cell
    for name in ("queue ratio", "P99 large", "resized", "decide ms", "vs fifo", "GPU util", "restarts"):
        assert any(line.startswith("  " + name.split()[0]) for line in result.stdout.splitlines()
                   if line.startswith("  ")), name


def test_duration_column_picks_one_unit_by_the_largest_value() -> None:
    from pipeswift_slurm.core.fmt import duration_column

    assert duration_column([6018.0, 16920.0]) == ("h", ["1.7", "4.7"])  # not 100.3m beside 4.7h
    assert duration_column([30.0, 90.0, None]) == ("s", ["30.0", "90.0", "-"])
    assert duration_column([600.0]) == ("min", ["10.0"])
    assert duration_column([3 * 86400.0, 3600.0]) == ("d", ["3.0", "0.0"])


def test_no_progress_bar_without_a_terminal(runner: CliRunner) -> None:
    result = invoke(runner, "simulate", *SMALL, "--jobs", "20", "--policy", "fifo")
    assert result.exit_code == 0 and result.stderr == ""
    assert "simulating" not in result.output


def test_progress_bar_on_a_terminal_goes_to_stderr() -> None:
    """Under a pseudo-terminal the bar is drawn (label, percentage) and still ends before the table."""
    import os
    import pty
    import subprocess
    import sys

    primary, secondary = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-m", "pipeswift_slurm.cli", "simulate", "--jobs", "20", "--gpus",
                             "16", "--policy", "fifo"], stdin=secondary, stdout=secondary, stderr=secondary,
                            env=env)
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(primary)
    assert proc.wait(timeout=120) == 0
    text = b"".join(chunks).decode(errors="replace")
    assert "simulating fifo" in text and "100%" in text
    assert text.index("100%") < text.index("policy ")


def _report_dates(db: Path) -> set[str]:
    """The dates of ``pipeswift report queue-ratio --by day`` on ``db``."""
    result = invoke(CliRunner(), "report", "queue-ratio", "--by", "day", "--db", str(db))
    assert result.exit_code == 0, result.output
    return {line.split()[0] for line in result.stdout.splitlines() if line[:2] in ("19", "20")}


def test_simulated_history_has_real_dates_never_1970(runner: CliRunner, tmp_path: Path) -> None:
    import time

    db = tmp_path / "h.sqlite"
    result = invoke(runner, "simulate", *SMALL, "--jobs", "20", "--policy", "fifo", "--db", str(db))
    assert result.exit_code == 0, result.output
    dates = _report_dates(db)
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert dates and not any(d.startswith("1970") for d in dates)
    assert min(dates) == today  # no trace dates: the simulation starts today
    assert "from %s," % today in result.stdout
    db2 = tmp_path / "h2.sqlite"
    result = invoke(runner, "simulate", *SMALL, "--jobs", "20", "--policy", "fifo", "--db", str(db2),
                    "--start", "2024-05-01", "--json", "-")
    assert json.loads(result.stdout)["spec"]["start"] == "2024-05-01"
    assert min(_report_dates(db2)) == "2024-05-01"


def test_a_dated_trace_keeps_its_own_dates(runner: CliRunner, tmp_path: Path) -> None:
    trace = tmp_path / "dated.csv"
    t0 = 1714564800  # 2024-05-01 12:00:00 UTC
    trace.write_text("job_id,submit_time_s,duration_s,num_gpus\n"
                     + "".join("j%d,%d,3600,8\n" % (i, t0 + 3600 * i) for i in range(4)))
    db = tmp_path / "h.sqlite"
    result = invoke(runner, "simulate", "--workload", str(trace), *SMALL, "--policy", "fifo", "--db", str(db),
                    "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["spec"]["start"] == "2024-05-01 12:00:00"
    assert _report_dates(db) == {"2024-05-01"}


def test_bad_start_date_is_one_error_line(runner: CliRunner) -> None:
    assert_one_error_line(invoke(runner, "simulate", *SMALL, "--start", "May 1"), "--start", "YYYY-MM-DD")


@pytest.mark.parametrize("option", [["--start-day", "3"], ["--window-days", "2"], ["--vc", "11cb48"]])
def test_trace_selection_without_a_trace_is_one_error_line(runner: CliRunner, option: list[str]) -> None:
    # the synthetic workload has no days or virtual clusters to select: refused, not ignored
    assert_one_error_line(invoke(runner, "simulate", *SMALL, *option), option[0], "--workload")


def test_flex_sets_the_share_of_flexible_jobs(runner: CliRunner, tmp_path: Path) -> None:
    """docs/results.md: ``--flex 0.5`` makes about half the jobs flexible (seeded)."""
    counts = {}
    for flex in ("0", "0.5", "1"):
        out = tmp_path / ("f%s.json" % flex)
        result = invoke(runner, "simulate", *SMALL, "--jobs", "40", "--policy", "fifo", "--flex", flex,
                        "--json", str(out))
        assert result.exit_code == 0, result.output
        data = json.loads(out.read_text())
        assert data["spec"]["flex"] == float(flex)
        counts[flex] = data["workload"]["flexible_jobs"]
    assert counts["0"] == 0 and counts["1"] == 40 and 0 < counts["0.5"] < 40


@pytest.mark.parametrize("vc", ["", "nosuch"])
def test_a_cluster_the_trace_does_not_have_is_named(runner: CliRunner, vc: str) -> None:
    """``--vc ''`` used to mean no filter at all, and an unknown name 'no job in the window'."""
    result = invoke(runner, "simulate", "--workload", str(DATA / "tiny-trace.csv"), *SMALL, "--vc", vc)
    assert_one_error_line(result, "no job of cluster %r (--vc); the trace's clusters: vc1, vc2" % vc)


def test_cron_ticks_run_the_controller_on_its_own_clock(runner: CliRunner) -> None:
    """``--cron-ticks`` (with psbatch's first look unless ``--first-look 0``): the JSON says
    so, slurm does not move, and the run differs from the default (a controller that sees
    each arrival)."""
    runs = {}
    for flag in ((), ("--cron-ticks",), ("--cron-ticks", "--first-look", "0")):
        result = invoke(runner, "simulate", *SMALL, "--jobs", "40", "--policy", "slurm,pipeswift", "--json", "-", *flag)
        assert result.exit_code == 0, result.output
        runs[len(flag)] = json.loads(result.stdout)
    without = runs.pop(3)
    assert without["spec"]["first_look_s"] == 0.0 and without["spec"]["ticks_on_events"] is False
    runs = {bool(n): data for n, data in runs.items()}
    assert runs[False]["spec"]["ticks_on_events"] is True and runs[True]["spec"]["ticks_on_events"] is False
    assert runs[True]["spec"]["first_look_s"] == 60.0
    jct = {cron: {p["policy"]: p["mean_jct_s"] for p in data["policies"]} for cron, data in runs.items()}
    assert jct[True]["slurm"] == jct[False]["slurm"]  # it decides nothing: its clock changes nothing
    assert jct[True]["pipeswift"] != jct[False]["pipeswift"]
