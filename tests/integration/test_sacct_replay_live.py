"""What-if on a live cluster's own history (issue 26, item 1): on a 2 x 8-GPU test cluster
with MariaDB + slurmdbd that this module brings up itself, a few short GPU jobs run, two
of them with a psbatch profile token in their Comment; ``sacct --json`` exports them and
``pipeswift simulate --sacct`` replays every one (the two as flexible Megatron jobs, the
others as they ran) with sane numbers. Skips with one reason where slurmdbd or MariaDB is
not installed or cannot start. Ports: PIPESWIFT_SACCT_CTLD_PORT (7841),
PIPESWIFT_SACCT_SLURMD_PORT_BASE (27101), PIPESWIFT_SACCT_DBD_PORT (7849)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from pipeswift_slurm.core import token
from test_controller import MEGATRON  # noqa: E402 (same folder)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from testbed_env import NoAccounting, dbd_cluster  # noqa: E402  (tests/slurm/testbed_env.py)

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[2]
ARGV = ("pretrain_gpt.py", *MEGATRON)
# (sbatch options, comment, seconds): two jobs with a profile, three plain ones
JOBS = [(["-N1", "--gres=gpu:4"], token.encode_profile(token.ProfileRequest(ARGV, gpus=(2, 8), world_size=4)), 3),
        (["-N1", "--gres=gpu:8"], token.encode_profile(token.ProfileRequest(ARGV, world_size=8)), 2),
        (["-N1", "--gres=gpu:2"], "", 2),
        (["-N2", "--gres=gpu:8"], "", 3),
        (["-N1", "--gres=gpu:1"], "just a comment", 1)]


@pytest.fixture(scope="module")
def dbd_env() -> Iterator[dict[str, str]]:
    try:
        with dbd_cluster("pssacct-", os.environ.get("PIPESWIFT_SACCT_CTLD_PORT", "7841"),
                         os.environ.get("PIPESWIFT_SACCT_SLURMD_PORT_BASE", "27101"),
                         os.environ.get("PIPESWIFT_SACCT_DBD_PORT", "7849")) as env:
            yield env
    except NoAccounting as exc:
        pytest.skip(str(exc))


def sacct_jobs(env: dict[str, str], ids: list[int]) -> dict:
    out = subprocess.run(["sacct", "--json", "-a", "-j", ",".join(map(str, ids))], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_simulate_sacct_replays_every_job_of_the_live_history(dbd_env: dict[str, str], tmp_path: Path) -> None:
    ids = []
    for args, comment, sleep_s in JOBS:
        extra = ["--comment", comment] if comment else []
        out = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "-D", "/tmp", "-t", "5", *args, *extra,
                              "--wrap", "sleep %d" % sleep_s], env=dbd_env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        ids.append(int(out.stdout.strip().split(";")[0]))
    deadline = time.monotonic() + 120
    while True:  # every job ended, and its end reached the accounting database
        data = sacct_jobs(dbd_env, ids)
        ended = [j for j in data["jobs"] if (j.get("time") or {}).get("end")]
        if len(ended) == len(ids):
            break
        assert time.monotonic() < deadline, "sacct shows %d of %d jobs ended" % (len(ended), len(ids))
        time.sleep(1)
    assert sum(1 for j in data["jobs"] if "pswift1;" in str(j.get("comment"))) == 2  # AccountingStoreFlags=job_comment
    export = tmp_path / "sacct.json"
    export.write_text(json.dumps(data))
    metrics = tmp_path / "m.json"
    env = dict(dbd_env, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-m", "pipeswift_slurm.cli", "simulate", "--sacct", str(export), "--gpus",
                          "16", "--gpus-per-node", "8", "--json", str(metrics)], env=env, capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "what would have changed" in run.stdout
    facts = json.loads(metrics.read_text())
    workload, changed = facts["workload"], facts["what_changed"]
    assert (workload["jobs"], workload["flexible_jobs"], workload["replayed_as_ran"]) == (5, 1, 3)
    assert workload["skipped"] == {}
    assert all(m["jobs"] == 5 for m in facts["policies"])
    real = [j["time"]["end"] - j["time"]["submission"] for j in data["jobs"]]
    assert changed["as_ran_mean_jct_s"] == pytest.approx(sum(real) / len(real))
    assert 1 <= changed["as_ran_mean_jct_s"] < 120
    for policy, mean in changed["mean_jct_s"].items():
        # the replayed jobs run as long as they did; only waits may differ (none here is
        # longer than the whole history)
        assert 1 <= mean <= max(real) + sum(s for _, _, s in JOBS), policy
    assert [g["user"] for g in changed["by_user"]] == [data["jobs"][0]["user"]]
