"""Issue 23, the site's limits hold: partition MaxTime/MaxNodes, QOS and association MaxWall
and MaxTRES (gres/gpu, node) are read once per snapshot and set on each opted-in job; the
controller plans within them and never applies a size, TimeLimit or SiteFactor past them."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import pytest

from pipeswift_slurm.core.model import Decision, ExecConfig, Job, SiteCaps
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.slurm.backends import BackendError
from pipeswift_slurm.slurm.backends import site_limits as sl
from pipeswift_slurm.slurm.controller import Controller
from pipeswift_slurm.slurm.limits import gpu_cap, within_site_limits
from test_controller_loop import KeepingBackend, estimator, pending  # noqa: E402 (same folder)

# recorded on the Slurm 22.05 test cluster with slurmdbd (sacctmgr -nP ...; scontrol -o show partition)
QOS = "normal||\ncap8|02:00:00|gres/gpu=8\nnodes1|1-00:00:00|node=1,gres/gpu:a100=16\n"
ASSOC = ("root|||||\nroot|root||||\nacc1|||||root\nacc1|root|||gres/gpu=16|\n"
         "team|||04:00:00|node=3|acc1\nteam|alice||03:00:00||\n")
PARTS = ("PartitionName=gpu AllowGroups=ALL Default=YES QoS=N/A DefaultTime=01:00:00 MaxNodes=UNLIMITED "
         "MaxTime=UNLIMITED Nodes=node[1-2] TRES=cpu=128,gres/gpu=16\n"
         "PartitionName=short QoS=cap8 MaxNodes=2 MaxTime=00:30:00 Nodes=node1\n")


def limits() -> sl.SiteLimits:
    parts, part_qos = sl.parse_partitions(PARTS)
    return sl.SiteLimits(parts, part_qos, sl.parse_qos(QOS), sl.parse_assocs(ASSOC))


def job(partition: str = "gpu", qos: str = "", account: str = "", user: str = "root") -> Job:
    return Job(job_id=1, state="PENDING", submit_time=0.0, partition=partition, qos=qos, account=account,
               user=user, opted_in=True)


@pytest.mark.parametrize("kw, caps", [
    ({}, SiteCaps()),
    ({"qos": "normal", "account": "root"}, SiteCaps()),
    ({"qos": "cap8", "account": "acc1"}, SiteCaps(7200, 8, None)),
    ({"qos": "nodes1"}, SiteCaps(86400, 16, 1)),
    ({"account": "acc1"}, SiteCaps(None, 16, None)),
    ({"account": "team", "user": "alice"}, SiteCaps(3 * 3600, None, 3)),       # user row, account, parents
    ({"partition": "short"}, SiteCaps(1800, 8, 2)),                           # partition and its QOS
    ({"partition": "gpu,short", "qos": "nodes1"}, SiteCaps(1800, 8, 1)),      # every partition it may run in
])
def test_caps_for_a_job_are_the_least_that_apply(kw: dict[str, str], caps: SiteCaps) -> None:
    assert limits().caps_for(job(**kw)) == caps


class Run:
    def __init__(self, sacctmgr: object) -> None:
        self.sacctmgr = sacctmgr

    def __call__(self, argv: list[str]) -> str:
        if argv[0] == "sacctmgr":
            if isinstance(self.sacctmgr, Exception):
                raise self.sacctmgr
            return QOS if "qos" in argv else ASSOC
        return PARTS


def test_reader_without_accounting_reads_partitions_only_and_without_slurmdbd_fails_closed() -> None:
    off = sl.LimitsReader(Run(BackendError("sacctmgr failed (exit 1): You are not running a supported "
                                           "accounting_storage plugin")))
    assert off.read().qos == {} and off.read().partitions["short"].max_time_s == 1800
    run = Run(BackendError("sacctmgr failed (exit 1): Problem talking to the database: Connection refused"))
    with pytest.raises(BackendError, match="nothing is changed"):
        sl.LimitsReader(run).read()
    reader = sl.LimitsReader(Run(None))
    assert reader.read().qos["cap8"].max_gpus == 8
    reader._run = run  # slurmdbd gone later: the last limits read are kept
    assert reader.read().qos["cap8"].max_gpus == 8


CFG16 = ExecConfig(tp=1, pp=1, dp=16, micro_batch_size=1, num_micro_batches=4, num_nodes=2, gpus_per_node=8)
CFG8 = ExecConfig(tp=1, pp=1, dp=8, micro_batch_size=1, num_micro_batches=8, num_nodes=1, gpus_per_node=8)


@pytest.mark.parametrize("decision, caps, want", [
    (Decision(1, config=CFG16, time_limit_s=3600), SiteCaps(7200, 8), Decision(1)),
    (Decision(1, config=CFG16), SiteCaps(max_nodes=1), Decision(1)),
    (Decision(1, config=CFG8, time_limit_s=9000), SiteCaps(7200, 8), Decision(1)),
    (Decision(1, config=CFG8, time_limit_s=7200), SiteCaps(7200, 8), Decision(1, config=CFG8, time_limit_s=7200)),
    (Decision(1, time_limit_s=9000), SiteCaps(7200), Decision(1, time_limit_s=7200)),
    (Decision(1, site_factor=66_666_667_333), SiteCaps(), Decision(1, site_factor=2_147_483_647)),
    (Decision(1, site_factor=-(10 ** 12)), SiteCaps(), Decision(1, site_factor=-2_147_483_647)),
])
def test_decisions_are_kept_within_the_caps(decision: Decision, caps: SiteCaps, want: Decision) -> None:
    kept, why = within_site_limits(decision, replace(job(), caps=caps))
    assert kept == want and (why != "") == (kept != decision)


@pytest.mark.parametrize("caps, cluster, want", [
    (SiteCaps(), 64, 64), (SiteCaps(max_gpus=8), 64, 8), (SiteCaps(max_nodes=1), 64, 8),
    (SiteCaps(max_gpus=12, max_nodes=1), 64, 8), (SiteCaps(max_gpus=100), 64, 64)])
def test_gpu_cap(caps: SiteCaps, cluster: int, want: int) -> None:
    assert gpu_cap(replace(job(), caps=caps), 8, cluster) == want


def biggest_config(caps: Optional[SiteCaps]) -> int:
    """A 1-GPU job allowing 1-16 GPUs, alone on 4 x 8 free GPUs: how wide the tick makes it
    (every lent GPU allowed: the caps are what is tested, not ``lend_efficiency``)."""
    one = pending(1) if caps is None else replace(pending(1), caps=caps)
    backend = KeepingBackend(4, 8, [one])
    Controller(backend, get_policy("pipeswift", lend_efficiency=0.0), estimator()).tick()
    return max((d.config.gpus for d in backend.applied if d.config is not None), default=1)


def test_the_controller_plans_within_the_gpu_and_node_caps() -> None:
    assert biggest_config(None) > 8  # (without caps it grows past 8)
    assert biggest_config(SiteCaps(max_gpus=8)) == 8
    assert biggest_config(SiteCaps(max_gpus=4)) == 4
    assert biggest_config(SiteCaps(max_nodes=1)) <= 8


def test_a_site_factor_past_slurms_range_is_never_applied() -> None:
    class Huge:
        name, site_factor_max = "huge", None

        def decide(self, view: object, profiles: dict[int, object], est: object) -> list[Decision]:
            return [Decision(job_id, site_factor=66_666_667_333) for job_id in profiles]

    backend = KeepingBackend(4, 8, [pending(1)])
    Controller(backend, Huge(), estimator()).tick()  # type: ignore[arg-type]
    assert [d.site_factor for d in backend.applied] == [2_147_483_647]
