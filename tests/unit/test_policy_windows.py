"""bench/policy_windows.py (issue 24, item 1): its windows and cluster rule, its JSON on a
tiny trace of one window, and ratios and goals computed by hand. No timed assertions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench_script import load_bench
from pipeswift_slurm.sim.workload import TraceRow, WorkloadError

DAY = 86400.0


pw = load_bench("policy_windows.py")


def tiny_trace(path: Path) -> Path:
    """12 jobs of VC 'vc1' in days 7..9 (one window), and 3 of VC 'vc2' (skipped: too few)."""
    lines = ["job_id,submit_time_s,duration_s,num_gpus,user,status,queue_time_s,job_name_or_model,cluster"]
    gpus = (1, 2, 8, 1, 4, 16, 1, 2, 8, 1, 4, 1)
    for i, g in enumerate(gpus):
        lines.append("j%d,%d,%d,%d,,,,,vc1" % (i, 7 * DAY + i * 3 * 3600, 1800 + 2400 * (i % 5), g))
    lines += ["k%d,%d,3600,1,,,,,vc2" % (i, 8 * DAY + i * 600) for i in range(3)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_windows_and_the_cluster_rule() -> None:
    rows = [TraceRow("a", 0.5 * DAY, 40 * DAY, 48, category="x"), TraceRow("b", 10 * DAY, 3600, 1, category="x")]
    # busy GPUs 48 x 40 days / 9.5 days = 202 -> 256
    assert pw.cluster_gpus(rows) == 256
    assert pw.cluster_gpus([TraceRow("c", 0, 60, 1), TraceRow("d", DAY, 60, 1)]) == 32  # at least 32
    assert pw.cluster_gpus([TraceRow("c", 0, 60, 64), TraceRow("d", DAY, 60, 1)]) == 64  # its largest job
    run, skipped = pw.windows(rows, min_jobs=1)
    assert [(w["start_day"], w["jobs"]) for w in run] == [(0.0, 1), (7.0, 1)] and not skipped
    run, skipped = pw.windows(rows, min_jobs=2)
    assert not run and len(skipped) == 2
    rows.append(TraceRow("e", 11 * DAY, 60, 1, category="x"))  # week 1 now has 2 jobs
    run, skipped = pw.windows(rows, min_jobs=1, max_jobs=1)
    assert [w["start_day"] for w in run] == [0.0] and [(w["start_day"], w["jobs"]) for w in skipped] == [(7.0, 2)]
    with pytest.raises(WorkloadError, match="--vc nope.*known: x"):
        pw.windows(rows, ["nope"])


def test_quick_subset_is_two_windows_per_vc_near_the_median() -> None:
    wins = [{"vc": "a", "start_day": 7.0 * k, "jobs": n, "gpus": 32} for k, n in enumerate((5, 50, 20, 30, 500))]
    assert [w["start_day"] for w in pw.quick_subset(wins)] == [14.0, 21.0]  # 20 and 30 jobs


def test_the_bench_on_a_tiny_trace_of_one_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tiny_trace(tmp_path / "t.csv")
    out = tmp_path / "o.json"
    assert pw.main(["--workload", str(trace), "--loads", "0.9", "--flex", "1.0", "--layouts", "user,expert",
                    "--workers", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    table = capsys.readouterr().out
    assert "over all groups:" in table and "pipeswift <= 1.0 x min(sjf, tiresias, slurm)" in table
    assert set(data) == {"settings", "groups", "goals", "runs"}
    assert data["settings"]["windows"] == [["vc1", 7.0, 12]]
    assert data["settings"]["cluster_gpus"] == {"vc1": 32}
    assert [(w["vc"], w["jobs"]) for w in data["settings"]["skipped_windows"]] == [("vc2", 3)]
    assert [(g["load"], g["flex"], g["layouts"]) for g in data["groups"]] == [(0.9, 1.0, "expert"),
                                                                           (0.9, 1.0, "user")]
    for run in data["runs"]:
        assert set(run["policies"]) == set(pw.POLICIES) and run["jobs"] == 12 and run["wall_s"] > 0
    group = data["groups"][1]
    assert set(group) >= {"windows", "jobs", "window_wall_s", "goals", *pw.CANDIDATES}
    block = group["pipeswift"]
    assert set(block["vs"]) == {"fifo", "slurm", "sjf", "tiresias", "min(sjf,tiresias,slurm)", "min(sjf,tiresias)"}
    run = next(r for r in data["runs"] if r["layouts"] == "user")["policies"]
    expected = run["pipeswift"]["mean_jct_s"] / min(run[b]["mean_jct_s"] for b in ("sjf", "tiresias", "slurm"))
    assert block["vs"]["min(sjf,tiresias,slurm)"]["worst"] == pytest.approx(expected)
    assert block["vs"]["min(sjf,tiresias,slurm)"]["median"] == pytest.approx(expected)
    assert {"bound_h", "worst_h", "windows_over_bound", "failing"} <= set(block["max_wait"])
    assert [g["goal"] for g in data["goals"]][-2:] == [
        "all of the above with expert layouts and with the truth errors", "decide() cold latency"]
    # every run was also kept as it ended; a grid stopped early is summarized from that file
    partial = tmp_path / "o.json.partial.jsonl"
    assert len(partial.read_text().splitlines()) == 2
    again = tmp_path / "again.json"
    assert pw.main(["--from-partial", str(partial), "--out", str(again)]) == 0
    assert json.loads(again.read_text())["groups"] == data["groups"]


@pytest.mark.parametrize("dated, epoch", [(False, 0.0), (True, None)])
def test_dated_runs_each_window_at_the_traces_own_dates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       dated: bool, epoch: Any) -> None:
    """``--dated`` runs a window as ``pipeswift simulate`` does (time 0 at the trace's own
    dates: ``start_epoch_s`` None), the default from time 0; the setting is recorded."""
    seen: list[Any] = []
    real = pw.run_comparison

    def spy(spec: Any) -> Any:
        seen.append(spec.start_epoch_s)
        return real(spec)

    monkeypatch.setattr(pw, "run_comparison", spy)
    out = tmp_path / "o.json"
    argv = ["--workload", str(tiny_trace(tmp_path / "t.csv")), "--loads", "0.9", "--flex", "1.0", "--layouts", "user",
            "--workers", "1", "--out", str(out)] + (["--dated"] if dated else [])
    assert pw.main(argv) == 0
    assert seen == [epoch] and json.loads(out.read_text())["settings"]["dated"] is dated


def _run(vc: str, day: float, jct: dict[str, float], small: dict[str, float], wait_h: dict[str, float]) -> dict:
    return {"vc": vc, "start_day": day, "load": 0.9, "flex": 1.0, "layouts": "user", "gpus": 32, "jobs": 10,
            "wall_s": 1.0, "policies": {p: {"mean_jct_s": jct[p], "small_mean_jct_s": small.get(p),
                                            "max_wait_s": wait_h.get(p, 0.0) * 3600, "restarts": 0, "wall_s": 0.1,
                                            "worst_user_vs_slurm": None} for p in jct}}


def test_ratios_and_goals_by_hand() -> None:
    runs = [
        # pipeswift 2 h against sjf 3, tiresias 5, slurm 4: 2/3 of the best; 0.5 of slurm
        _run("a", 0.0, {"fifo": 8, "slurm": 4, "sjf": 3, "tiresias": 5, "pipeswift": 2, "pipeswift:order": 3.3,
                        "pipeswift:preempt": 1.5}, {"slurm": 1.0, "pipeswift": 1.2},
             {"fifo": 60, "pipeswift": 50}),
        # behind: 4.4 against the best, tiresias 4 -> 1.1
        _run("b", 7.0, {"fifo": 9, "slurm": 6, "sjf": 5, "tiresias": 4, "pipeswift": 4.4, "pipeswift:order": 4,
                        "pipeswift:preempt": 2}, {"slurm": 2.0, "pipeswift": 1.0},
             {"fifo": 30, "pipeswift": 49}),
    ]
    [group] = pw.summarize(runs)
    best = group["pipeswift"]["vs"]["min(sjf,tiresias,slurm)"]
    assert best["worst"] == pytest.approx(1.1) and best["median"] == pytest.approx((2 / 3 + 1.1) / 2)
    assert best["behind"] == [{"vc": "b", "start_day": 7.0, "ratio": pytest.approx(1.1)}]
    assert group["pipeswift"]["vs"]["slurm"]["median"] == pytest.approx((0.5 + 4.4 / 6) / 2)
    assert group["pipeswift"]["small_jobs_vs_slurm"]["worst"] == pytest.approx(1.2)
    # day 0: fifo past the bound, pipeswift 50 h <= fifo's 60 h: kept; day 7: fifo kept it, pipeswift did not
    wait = group["pipeswift"]["max_wait"]
    assert [(w["vc"], w["ok"]) for w in wait["windows_over_bound"]] == [("a", True), ("b", False)]
    assert [w["vc"] for w in wait["failing"]] == ["b"]
    order = group["pipeswift:order"]["vs"]["sjf"]
    assert order["worst"] == pytest.approx(1.1) and [w["vc"] for w in order["behind"]] == ["a"]
    verdicts = {row["goal"]: row["pass"] for row in group["goals"]}
    assert verdicts["pipeswift <= 1.0 x min(sjf, tiresias, slurm) on every window"] is False
    assert verdicts["pipeswift median <= 0.5 x slurm"] is False  # 0.62
    assert verdicts["pipeswift:preempt median <= 0.6 x min(sjf, tiresias)"] is True  # 0.5 and 0.5
    assert verdicts["worst user's mean JCT <= 1.2 x slurm's"] is None  # not measured
    total = {row["goal"]: row for row in pw.overall([group], truth_errors=False)}
    assert total["pipeswift median <= 0.5 x slurm"]["failing_groups"] == ["load 0.9 flex 1 user"]
    assert total["all of the above with expert layouts and with the truth errors"]["pass"] is None
