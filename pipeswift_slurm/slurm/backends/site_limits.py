"""The site's per-job limits, read from Slurm once per snapshot: partitions' MaxTime and
MaxNodes (``scontrol -o show partition``), QOS MaxWall and MaxTRES (``sacctmgr show qos``)
and associations' MaxWall and MaxTRES, inherited down the account tree (``sacctmgr show
assoc``). Slurm exempts values an admin sets (a TimeLimit, a node or GPU count) from these
checks; the controller runs as an admin, so it keeps within them itself (``SiteCaps`` on
each job, applied by the controller).

Owns: parsing that admin-written text (QOS, account, partition names and limits; no user
writes any of it) and choosing the limits that hold for one job: the least of all that
apply. A job that may run in several partitions gets the least of them all. Without
accounting (no slurmdbd) there are no QOS or association limits to read; when slurmdbd
does not answer, the last limits read are kept (a daemon) or the snapshot fails (a cron
tick): the controller never acts without knowing the limits. Must not import subprocess.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Optional

from pipeswift_slurm.core.fmt import digits
from pipeswift_slurm.core.model import Job, SiteCaps
from pipeswift_slurm.slurm.backends import BackendError
from pipeswift_slurm.slurm.backends.slurm_parse import parse_duration_s, parse_kv_line

log = logging.getLogger(__name__)

PARTITIONS_ARGV = ["scontrol", "-o", "show", "partition"]
QOS_ARGV = ["sacctmgr", "-nP", "show", "qos", "format=Name,MaxWall,MaxTRES"]
ASSOC_ARGV = ["sacctmgr", "-nP", "show", "assoc", "format=Account,User,Partition,MaxWall,MaxTRES,ParentName"]

# sacctmgr's answers when the cluster keeps no accounting: no QOS or association limit exists
_NO_ACCOUNTING = ("not running a supported accounting_storage plugin", "accounting storage is disabled")


def _count(text: str) -> Optional[int]:
    text = text.strip()
    return int(text) if digits(text) else None  # UNLIMITED, N/A, ""


def _wall_s(text: str) -> Optional[int]:
    text = text.strip()
    return parse_duration_s(text) if text and text.upper() not in ("UNLIMITED", "INFINITE", "N/A") else None


def parse_tres_caps(tres: str, wall: str = "") -> SiteCaps:
    """SiteCaps from a MaxTRES spec (``gres/gpu=8,node=2``; a typed ``gres/gpu:a100=4``
    counts when no untyped one is given) and a MaxWall (``02:00:00``, ``1-00:00:00``)."""
    gpus: Optional[int] = None
    typed: list[int] = []
    nodes: Optional[int] = None
    for item in tres.split(","):
        key, _, value = item.strip().partition("=")
        if key == "gres/gpu":
            gpus = _count(value)
        elif key.startswith("gres/gpu:") and _count(value) is not None:
            typed.append(int(value))
        elif key == "node":
            nodes = _count(value)
    if gpus is None and typed:
        gpus = min(typed)
    return SiteCaps(max_time_s=_wall_s(wall), max_gpus=gpus, max_nodes=nodes)


@dataclass(frozen=True)
class _Assoc:
    account: str
    user: str
    partition: str
    caps: SiteCaps
    parent: str


@dataclass
class SiteLimits:
    """Everything read: limits by partition, by QOS, and the associations."""

    partitions: dict[str, SiteCaps] = field(default_factory=dict)
    partition_qos: dict[str, str] = field(default_factory=dict)
    qos: dict[str, SiteCaps] = field(default_factory=dict)
    assocs: list[_Assoc] = field(default_factory=list)

    def caps_for(self, job: Job) -> SiteCaps:
        """The limits that hold for ``job``: the least of its partitions' (and their QOS's),
        its QOS's and its association's (user, then its account and the accounts above)."""
        caps = SiteCaps()
        for part in (p for p in job.partition.split(",") if p):
            caps = caps.tighter(self.partitions.get(part, SiteCaps()))
            if self.partition_qos.get(part):
                caps = caps.tighter(self.qos.get(self.partition_qos[part], SiteCaps()))
        for name in (q for q in job.qos.split(",") if q):
            caps = caps.tighter(self.qos.get(name, SiteCaps()))
        return caps.tighter(self._assoc_caps(job))

    def _assoc_caps(self, job: Job) -> SiteCaps:
        if not self.assocs or not job.account:
            return SiteCaps()
        parts = set(job.partition.split(",")) | {""}
        caps = SiteCaps()
        for a in self.assocs:
            if a.account == job.account and a.user == job.user and a.partition in parts:
                caps = caps.tighter(a.caps)
        account, seen = job.account, set()
        while account and account not in seen:  # the account and the ones above it
            seen.add(account)
            rows = [a for a in self.assocs if a.account == account and not a.user]
            for a in rows:
                caps = caps.tighter(a.caps)
            account = rows[0].parent if rows else ""
        return caps


def parse_partitions(text: str) -> tuple[dict[str, SiteCaps], dict[str, str]]:
    """``scontrol -o show partition`` -> (caps by partition, partition QOS by partition)."""
    caps: dict[str, SiteCaps] = {}
    qos: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("PartitionName="):
            continue
        kv = parse_kv_line(line)
        name = kv["PartitionName"]
        caps[name] = SiteCaps(max_time_s=_wall_s(kv.get("MaxTime", "")), max_nodes=_count(kv.get("MaxNodes", "")))
        if kv.get("QoS", "N/A") not in ("N/A", "", "(null)"):
            qos[name] = kv["QoS"]
    return caps, qos


def parse_qos(text: str) -> dict[str, SiteCaps]:
    """``sacctmgr -nP show qos format=Name,MaxWall,MaxTRES`` -> caps by QOS name."""
    out: dict[str, SiteCaps] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[0]:
            out[parts[0]] = parse_tres_caps(parts[2], parts[1])
    return out


def parse_assocs(text: str) -> list[_Assoc]:
    """``sacctmgr -nP show assoc format=Account,User,Partition,MaxWall,MaxTRES,ParentName``."""
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 6 and parts[0]:
            out.append(_Assoc(parts[0], parts[1], parts[2], parse_tres_caps(parts[4], parts[3]), parts[5]))
    return out


class LimitsReader:
    """Reads SiteLimits with three commands; keeps the last good accounting read.

    Args:
        run: runs one argv and returns stdout, raising BackendError with one line.
    """

    def __init__(self, run: Callable[[list[str]], str]) -> None:
        self._run = run
        self._last_accounting: Optional[tuple[dict[str, SiteCaps], list[_Assoc]]] = None

    def read(self) -> SiteLimits:
        """This snapshot's limits.

        Raises:
            BackendError: the partitions cannot be read, or slurmdbd does not answer and
                no earlier read is at hand (acting without the limits could break them).
        """
        partitions, partition_qos = parse_partitions(self._run(list(PARTITIONS_ARGV)))
        try:
            qos = parse_qos(self._run(list(QOS_ARGV)))
            assocs = parse_assocs(self._run(list(ASSOC_ARGV)))
            self._last_accounting = (qos, assocs)
        except BackendError as exc:
            if any(p in str(exc).lower() for p in _NO_ACCOUNTING):
                qos, assocs = {}, []
            elif self._last_accounting is not None:
                log.warning("QOS and association limits not read (%s); keeping the last ones read", exc)
                qos, assocs = self._last_accounting
            else:
                raise BackendError("cannot read the QOS and association limits, so nothing is changed: %s"
                                   % exc) from None
        return SiteLimits(partitions, partition_qos, qos, assocs)


def with_caps(jobs: Iterable[Job], limits: SiteLimits) -> list[Job]:
    """``jobs`` with the site's caps set on every opted-in job (the only ones changed)."""
    return [replace(j, caps=limits.caps_for(j)) if j.opted_in else j for j in jobs]

