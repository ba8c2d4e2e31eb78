"""Learning from the site's runs on the real test cluster (issue 25 item 5): an emulated
Megatron (a small script that prints Megatron's iteration lines) runs under the launcher
with ``PIPESWIFT_MEASURE_DIR`` set; its output reaches the job's log unchanged, its
measured iteration time reaches the history through a ``pipeswift controller tick``, and
the calibration the tick saves changes the next prediction for that class and layout; the
tick publishes it (``[calibration] publish_file``), and a job that Slurm starts before any
tick decides for it is planned by its launcher with what the site learned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from pipeswift_slurm.core import site_model, token
from pipeswift_slurm.core.calibration import lookup_bias
from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.slurm.backends.slurm_cli import SubprocessRunner
from pipeswift_slurm.slurm.measured import report_config
from pipeswift_slurm.submit.launcher import Allocation, job_profile
from test_controller import MEGATRON, Site  # noqa: E402 (same folder)
from test_live_loop import fields, submit, tick_ok, wait_for  # noqa: E402

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[2]
LINES = 6  # iteration lines the emulated Megatron prints, one per emulated second-ish

FAKE_MEGATRON = '''import os, sys, time
ms = float(os.environ["FAKE_ITER_MS"])
print("using world size: 1, data-parallel size: 1, tensor-model-parallel size: 1", flush=True)
for k in range(1, %d + 1):
    time.sleep(ms / 1000.0)
    print(" [2026-01-05 10:00:%%02d] iteration %%8d/%%8d | consumed samples: %%12d |"
          " elapsed time per iteration (ms): %%.1f | learning rate: 1.000000E-04 | lm loss: 1.0E+01 |"
          %% (k, k, 1000, 64 * k, ms * (3 if k == 1 else 1)), flush=True)
print("[after training is done] datetime: 2026-01-05 10:01:00", flush=True)
''' % LINES


@pytest.fixture
def ids(slurm_env: dict[str, str]) -> Iterator[list[int]]:
    submitted: list[int] = []
    yield submitted
    if submitted:
        SubprocessRunner(timeout_s=30, env=slurm_env)(["scancel", *map(str, submitted)])


def test_measured_iteration_times_reach_the_history_and_change_the_next_prediction(
        tmp_path: Path, slurm_env: dict[str, str], slurm: SubprocessRunner, ids: list[int]) -> None:
    measure = tmp_path / "measure"
    measure.mkdir()
    measure.chmod(0o1777)
    site = Site(tmp_path, slurm_env)
    published = tmp_path / "site-model.json"
    site.config.write_text(site.config.read_text() + '[calibration]\nmeasure_dir = "%s"\npublish_file = "%s"\n'
                           % (measure, published))
    script = tmp_path / "pretrain_gpt.py"
    script.write_text(FAKE_MEGATRON)
    profile = job_profile(MEGATRON, token.ProfileRequest(tuple(MEGATRON), gpus=(1, 1)), Allocation(1, 1))
    estimator = Estimator(CostModel(get_gpu_type("A100-80GB")), 8)
    best = estimator.best(profile, 1)
    assert best is not None
    iter_ms = 1500.0 * best.iter_time_s  # the layout really runs 1.5x slower than predicted
    launcher = "%s -m pipeswift_slurm.submit.launcher" % sys.executable
    wrap = ("FAKE_ITER_MS=%.1f PIPESWIFT_MEASURE_DIR=%s PYTHONPATH=%s %s -- %s %s %s"
            % (iter_ms, measure, os.environ.get("PYTHONPATH", str(ROOT)), launcher, sys.executable, script,
               " ".join(MEGATRON)))
    nodes = int(slurm(["sinfo", "-h", "-o", "%D"]).split()[0])
    blocker = submit(slurm, ids, "-N%d" % nodes, "--exclusive", "--gpus-per-node=8")
    wait_for(slurm, blocker, "RUNNING", 30)
    out = tmp_path / "job.out"
    one = token.encode_profile(token.ProfileRequest(tuple(MEGATRON), gpus=(1, 1)))
    job = int(slurm(["sbatch", "--parsable", "-o", str(out), "-e", str(tmp_path / "job.err"), "-D", str(tmp_path),
                     "-N1", "--gpus-per-node=1", "--comment", one, "--wrap", wrap]).strip().split(";")[0])
    ids.append(job)
    tick_ok(site)  # the decision: the job will run a config the history knows
    assert "pswift-decision1;" in fields(slurm, job).get("AdminComment", "")
    slurm(["scancel", str(blocker)])
    wait_for(slurm, job, "RUNNING", 60)
    tick_ok(site)  # records the run: its config and prediction
    wait_for(slurm, job, "COMPLETED", 120)
    time.sleep(0.5)
    stderr = tick_ok(site)  # the finished job, its report, and the refit

    [m] = site.rows("SELECT * FROM measurements")
    assert m["job_id"] == job and m["status"] == "ok", (dict(m), stderr)
    assert m["iter_s"] == pytest.approx(iter_ms / 1000.0, rel=1e-3)
    assert m["iter_s"] / m["predicted_iter_s"] == pytest.approx(1.5, rel=0.05)
    alone = subprocess.run([sys.executable, str(script)], env=dict(os.environ, FAKE_ITER_MS="%.1f" % iter_ms),
                           capture_output=True, timeout=60, check=True).stdout
    assert out.read_bytes() == alone  # the job's log is byte for byte what Megatron printed
    assert alone.count(b"elapsed time per iteration (ms)") == LINES
    bias = {r["job_class"]: r["ratio"] for r in site.rows("SELECT job_class, ratio FROM calibration")}
    layout_keys = [k for k in bias if " tp=" in k]
    assert layout_keys, bias
    [ran] = site.rows("SELECT run_config, job_class FROM jobs WHERE job_id = ?", job)
    assert ran["run_config"] == m["config"], (dict(ran), dict(m))
    [written] = measure.glob("%d.*.json" % job)  # the launcher's name has a random part
    cfg = report_config(json.loads(written.read_text()))
    assert cfg is not None and cfg.short() == m["config"]
    before = estimator.run_time_s(profile, cfg)
    after = estimator.with_bias(bias).run_time_s(profile, cfg)
    assert after > 1.1 * before  # the next prediction for this class and layout is longer
    assert lookup_bias(bias, ran["job_class"], cfg) > lookup_bias(bias, ran["job_class"])  # by its layout terms

    # the refit was published for the jobs' side: a job Slurm starts before a tick decides
    # for it is planned by its launcher with the site's bias map
    model = site_model.read(str(published))
    assert dict(model.bias) == pytest.approx(bias) and model.gpu_type == "A100-80GB"
    err = tmp_path / "undecided.err"
    undecided = int(slurm(["sbatch", "--parsable", "-o", str(tmp_path / "undecided.out"), "-e", str(err),
                           "-D", str(tmp_path), "-N1", "--gpus-per-node=1", "--comment", one, "--wrap",
                           "PIPESWIFT_SITE_MODEL=%s PYTHONPATH=%s %s --emulate -- %s %s %s"
                           % (published, os.environ.get("PYTHONPATH", str(ROOT)), launcher, sys.executable,
                              script, " ".join(MEGATRON))]).strip().split(";")[0])
    ids.append(undecided)
    wait_for(slurm, undecided, "COMPLETED", 120)
    assert "pswift-decision1;" not in fields(slurm, undecided).get("AdminComment", "")
    said = [ln for ln in err.read_text().splitlines() if ln.startswith("pipeswift-launch: running ")]
    assert said and "(no decision: best for the allocation by the site model of " in said[0], err.read_text()
