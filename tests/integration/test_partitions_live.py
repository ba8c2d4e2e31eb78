"""Mixed GPU partitions on the real Slurm (issue 26 item 3): a cluster of this module's own
with two partitions of typed fake GPUs (``GPU_PARTITIONS="a100:2 h100:2"``: a100 = 2 nodes x 8
``gpu:a100``, h100 = 2 nodes x 8 ``gpu:h100``). With a100 full (a blocker) and h100 free, a
psbatch Megatron job submitted ``-p a100 --pipeswift-partitions a100,h100`` (running
``pipeswift-launch --emulate``) is moved by one ``pipeswift controller tick`` to h100 and
starts there, on an h100 node; a job submitted without the option is never moved; and a
config whose ``[slurm.partition_gpu_types]`` calls h100 "A100-80GB" leaves partition h100
unplanned with a WARNING (the GRES check, ``slurm.partition_check``). The backends' move
itself (one ``scontrol update``; pyslurm where it is built) is checked without the
controller too. Ports:
PIPESWIFT_PART_CTLD_PORT (7861), PIPESWIFT_PART_SLURMD_PORT_BASE (27301)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from pipeswift_slurm.core import token
from pipeswift_slurm.core.model import Decision, ExecConfig
from pipeswift_slurm.slurm.backends.slurm_cli import SlurmCliBackend, SubprocessRunner
from pipeswift_slurm.slurm.backends.slurm_parse import expand_hostlist, parse_kv_line
from test_backend_pyslurm_live import _skip_reason, in_child  # noqa: E402 (same folder)
from test_controller import MEGATRON, Site  # noqa: E402 (same folder)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from testbed_env import ClusterDown, gpus_per_node_tres, own_cluster  # noqa: E402  (tests/slurm/testbed_env.py)

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[2]
GPU_TYPES = {"a100": "A100-80GB", "h100": "H100-80GB"}
H100_NODES = ("node3", "node4")


@pytest.fixture(scope="module")
def mixed_env() -> Iterator[dict[str, str]]:
    """The two-partition cluster, fresh, taken down at the end."""
    try:
        with own_cluster("pspart-", "a two-partition test cluster", GPU_PARTITIONS="a100:2 h100:2",
                         CTLD_PORT=os.environ.get("PIPESWIFT_PART_CTLD_PORT", "7861"),
                         SLURMD_PORT_BASE=os.environ.get("PIPESWIFT_PART_SLURMD_PORT_BASE", "27301")) as env:
            yield env
    except ClusterDown as exc:
        pytest.skip(str(exc))


@pytest.fixture
def mixed(mixed_env: dict[str, str]) -> Iterator[tuple[SubprocessRunner, list[int]]]:
    slurm = SubprocessRunner(timeout_s=30, env=mixed_env)
    ids: list[int] = []
    yield slurm, ids
    if ids:
        subprocess.run(["scancel", *map(str, ids)], env=mixed_env, capture_output=True, timeout=30)
        time.sleep(1)


def fields(slurm: SubprocessRunner, job_id: int) -> dict[str, str]:
    return parse_kv_line(slurm(["scontrol", "-o", "show", "job", str(job_id)]).splitlines()[0])


def site_with(tmp_path: Path, env: dict[str, str], gpu_types: dict[str, str]) -> Site:
    """A controller site whose config names each partition's GPU type."""
    site = Site(tmp_path, dict(env, PYTHONPATH=os.environ.get("PYTHONPATH", str(ROOT))))
    with site.config.open("a") as fh:
        fh.write("[slurm.partition_gpu_types]\n" + "".join('%s = "%s"\n' % kv for kv in gpu_types.items()))
    return site


def fill_a100(slurm: SubprocessRunner, ids: list[int]) -> int:
    out = slurm(["sbatch", "--parsable", "-o", "/dev/null", "-D", "/tmp", "-p", "a100", "-N2", "--exclusive",
                 "--gpus-per-node=8", "-J", "blocker", "--wrap", "sleep 300"])
    ids.append(int(out.strip().split(";")[0]))
    deadline = time.monotonic() + 30
    while fields(slurm, ids[-1]).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, "the a100 blocker did not start"
        time.sleep(0.3)
    return ids[-1]


def psbatch_job(site: Site, ids: list[int], *options: str) -> int:
    """A psbatch Megatron job of 1 node x 8 GPUs whose training runs ``pipeswift-launch --emulate``."""
    bindir = site.dir / "bin"
    bindir.mkdir(exist_ok=True)
    launcher = bindir / "pipeswift-launch"
    launcher.write_text("#!/bin/sh\nPYTHONPATH=%s exec %s -m pipeswift_slurm.submit.launcher \"$@\"\n"
                        % (site.env["PYTHONPATH"], sys.executable))
    launcher.chmod(0o755)
    script = site.dir / ("train-%d.sh" % len(ids))
    script.write_text("#!/bin/bash\n#SBATCH -N1\n#SBATCH --gpus-per-node=8\n#SBATCH -o /dev/null\n"
                      "export PIPESWIFT_EMULATE_SCALE=0.0001\nsleep 5\n"
                      "%s --emulate -- torchrun --nproc_per_node 8 pretrain_gpt.py %s\n" % (launcher, " ".join(MEGATRON)))
    out = subprocess.run([sys.executable, "-m", "pipeswift_slurm.submit.psbatch", "--parsable", *options, str(script)],
                         env=site.env, capture_output=True, text=True, timeout=60, cwd=site.dir)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    ids.append(int(out.stdout.strip().split(";")[0]))
    return ids[-1]


def tick(site: Site) -> str:
    done = site.tick()
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_job_is_moved_to_the_partition_where_it_finishes_first_and_starts_there(
        tmp_path: Path, mixed_env: dict[str, str], mixed: tuple[SubprocessRunner, list[int]]) -> None:
    slurm, ids = mixed
    site = site_with(tmp_path, mixed_env, GPU_TYPES)
    fill_a100(slurm, ids)
    movable = psbatch_job(site, ids, "-p", "a100", "--pipeswift-partitions", "a100,h100")
    stays = psbatch_job(site, ids, "-p", "a100")
    assert "parts=a100,h100" in fields(slurm, movable)["Comment"]
    assert "parts=" not in fields(slurm, stays)["Comment"]
    assert fields(slurm, movable)["Partition"] == fields(slurm, stays)["Partition"] == "a100"
    stderr = tick(site)
    assert "not planned" not in stderr, stderr
    assert fields(slurm, movable)["Partition"] == "h100", stderr  # moved by the tick itself
    assert fields(slurm, stays)["Partition"] == "a100", stderr
    deadline = time.monotonic() + 60
    now = fields(slurm, movable)
    while now["JobState"] == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.5)
        now = fields(slurm, movable)
    assert now["Partition"] == "h100" and now["JobState"] in ("RUNNING", "COMPLETING", "COMPLETED"), now
    assert set(expand_hostlist(now["NodeList"])) <= set(H100_NODES) and now["NodeList"], now
    squeue = slurm(["squeue", "-h", "-j", str(movable), "-t", "all", "-o", "%P %N"]).split()
    assert squeue[0] == "h100" and set(expand_hostlist(squeue[1])) <= set(H100_NODES), squeue
    tick(site)  # a later tick never moves the job that did not allow it
    assert (fields(slurm, stays)["Partition"], fields(slurm, stays)["JobState"]) == ("a100", "PENDING")


def test_a_partition_whose_gres_type_is_not_the_configured_one_is_left_unplanned(
        tmp_path: Path, mixed_env: dict[str, str], mixed: tuple[SubprocessRunner, list[int]]) -> None:
    slurm, ids = mixed
    site = site_with(tmp_path, mixed_env, {"a100": "A100-80GB", "h100": "A100-80GB"})
    fill_a100(slurm, ids)
    job = psbatch_job(site, ids, "-p", "a100", "--pipeswift-partitions=a100,h100")
    stderr = tick(site)
    warnings = [line for line in stderr.splitlines() if "WARNING" in line and "partition h100" in line]
    assert len(warnings) == 1, stderr
    assert all(word in warnings[0] for word in ("node node3", "type h100", "A100-80GB")), warnings
    time.sleep(2)
    assert (fields(slurm, job)["Partition"], fields(slurm, job)["JobState"]) == ("a100", "PENDING")


def test_the_backends_move_pending_jobs_in_one_update_and_they_start_there(
        mixed_env: dict[str, str], mixed: tuple[SubprocessRunner, list[int]]) -> None:
    """Without the controller: the CLI backend moves an untyped job with a resize in one
    update and refuses to move a ``gpu:a100`` job to h100; pyslurm (where it is built) moves
    a third job. Slurm 24.11 refuses some partition changes at random as "Resource
    temporarily unavailable", which the backends send again. Both moved jobs start on h100
    nodes; the typed one still pends in a100."""
    slurm, ids = mixed
    fill_a100(slurm, ids)
    comment = "--comment=" + token.PROFILE_PREFIX + "args=W10="
    for gres in ("--gpus-per-node=2", "--gres=gpu:a100:4", "--gpus-per-node=4"):
        ids.append(int(slurm(["sbatch", "--parsable", "-o", "/dev/null", "-D", "/tmp", "-p", "a100", "-N1", gres,
                              comment, "--wrap", "sleep 300"]).strip().split(";")[0]))
    untyped, typed, third = ids[-3:]
    ids.append(int(slurm(["sbatch", "--parsable", "-o", "/dev/null", "-H", "-p", "a100,h100", "--gpus=1",
                          "--wrap", "true"]).strip().split(";")[0]))
    backend = SlurmCliBackend(run=slurm, read_site_factors=False, read_limits=False)
    jobs = {j.job_id: j for j in backend.snapshot().jobs}
    assert jobs[typed].gpu_request.gpu_type == "a100" and jobs[untyped].opted_in
    assert jobs[ids[-1]].partition == "a100,h100"
    if not _skip_reason(dict(mixed_env)):  # pyslurm reads a job pending in two partitions alike
        view, _ = in_child(mixed_env, "snapshot")
        assert {j.job_id: j.partition for j in view.jobs} == {j.job_id: j.partition for j in jobs.values()}
    grow = ExecConfig(tp=1, pp=1, dp=4, micro_batch_size=1, num_micro_batches=16, num_nodes=1, gpus_per_node=4)
    out = backend.apply_many([(Decision(untyped, partition="h100", config=grow), jobs[untyped]),
                              (Decision(typed, partition="h100"), jobs[typed])])
    assert out[0] is None and "not moved" in str(out[1]), out
    moved = fields(slurm, untyped)
    assert moved["Partition"] == "h100" and moved["TresPerNode"] in gpus_per_node_tres(4), moved
    assert fields(slurm, typed)["Partition"] == "a100"
    if _skip_reason(dict(mixed_env)):  # pyslurm is built in the Slurm 24.11 leg only
        backend.apply(Decision(third, partition="h100"), jobs[third])
    else:
        _, log = in_child(mixed_env, "apply", (Decision(third, partition="h100"), jobs[third]))
        assert "a move to another partition" in log, log
    deadline = time.monotonic() + 60
    while not all(fields(slurm, j)["JobState"] == "RUNNING" for j in (untyped, third)):
        assert time.monotonic() < deadline, [(j, fields(slurm, j)["JobState"], fields(slurm, j)["Reason"])
                                             for j in (untyped, third)]
        time.sleep(0.5)
    for job_id in (untyped, third):
        now = fields(slurm, job_id)
        assert now["Partition"] == "h100" and set(expand_hostlist(now["NodeList"])) <= set(H100_NODES), now
    assert (fields(slurm, typed)["Partition"], fields(slurm, typed)["JobState"]) == ("a100", "PENDING")
