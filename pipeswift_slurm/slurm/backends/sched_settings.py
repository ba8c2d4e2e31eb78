"""The site's scheduling settings, as Slurm runs them: what the simulator's Slurm needs to
order and start jobs as the site's controller does (priority/multifactor weights,
sched/backfill parameters, the main scheduler's timing).

Read from ``scontrol show config`` output (``Key = value`` lines) or from a slurm.conf
(``Key=Value`` lines); :func:`read_scheduling_settings` tells them apart. Every field
left out takes Slurm's own default (slurm.conf(5), Slurm 22.05–24.11), listed on the
fields below, except ``PriorityType``: Slurm's default, priority/basic, has no SiteFactor,
which the controller needs, so a config that names none is read as priority/multifactor
with all weights 0 (the same order: by submission).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Optional

from pipeswift_slurm.core.files import open_nowait
from pipeswift_slurm.slurm.backends.slurm_parse import parse_duration_s


class SchedulingSettingsError(ValueError):
    """A settings file that cannot be read (one line: what, where, what to do)."""


@dataclass(frozen=True)
class SchedulingSettings:
    """Slurm's scheduling settings that decide when a pending job starts.

    Attributes (Slurm's default in brackets):
        scheduler: "backfill" (sched/backfill) or "builtin" (sched/builtin) [backfill].
        weight_age: PriorityWeightAge [0]; 0 as well when there is no slurmdbd (Slurm
            22.05 logs "PriorityWeightAge can only be used with SlurmDBD, ignoring").
        max_age_s: PriorityMaxAge [7-0].
        weight_job_size: PriorityWeightJobSize [0].
        favor_small: PriorityFavorSmall [No].
        weight_fairshare: PriorityWeightFairShare [0]; read and shown, not modelled (every
            user alike: a constant).
        weight_qos: PriorityWeightQOS [0]; a constant (one QOS, factor 1).
        weight_partition: PriorityWeightPartition [0]; a constant (one partition, factor 1).
        bf_interval_s: bf_interval: seconds between backfill passes [30]; 0 (the
            simulator only): a backfill pass right after every main pass.
        bf_resolution_s: bf_resolution: reservation start and end times are rounded down
            to it [60]; 0 (the simulator only): not rounded.
        bf_max_job_test: bf_max_job_test: blocked jobs a backfill pass tests [500].
        bf_window_s: bf_window: how far ahead reservations reach [1440 min].
        sched_interval_s: sched_interval: the periodic main pass [60].
        batch_sched_delay_s: batch_sched_delay: a submission's main pass runs this much
            later (about 2.8 s measured with the default) [3].
        launch_s: seconds from a job's start to its program running (slurmd, slurmstepd,
            the launcher): not a Slurm setting; about 1 s measured on the test cluster.
        requeue_delay_s: a requeued job pends this long on its begin time (Reason=BeginTime)
            before it may start again: AuthInfo's cred_expire + 1 s [121; measured on the
            test cluster: 121 s, and 31 s with cred_expire=30].

    ``IDEAL`` (all latencies and the rounding 0) is the idealised Slurm that starts every
    job the moment it could start (tests that work out schedules by hand).
    """

    scheduler: str = "backfill"
    weight_age: int = 0
    max_age_s: float = 7 * 86400.0
    weight_job_size: int = 0
    favor_small: bool = False
    weight_fairshare: int = 0
    weight_qos: int = 0
    weight_partition: int = 0
    bf_interval_s: float = 30.0
    bf_resolution_s: float = 60.0
    bf_max_job_test: int = 500
    bf_window_s: float = 1440 * 60.0
    sched_interval_s: float = 60.0
    batch_sched_delay_s: float = 3.0
    launch_s: float = 1.0
    requeue_delay_s: float = 121.0

    def as_dict(self) -> dict[str, object]:
        """The settings as a plain dict (JSON output)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


IDEAL = SchedulingSettings(bf_interval_s=0.0, bf_resolution_s=0.0, batch_sched_delay_s=0.0, launch_s=0.0,
                           requeue_delay_s=0.0)

_WEIGHTS = {"priorityweightage": "weight_age", "priorityweightjobsize": "weight_job_size",
            "priorityweightfairshare": "weight_fairshare", "priorityweightqos": "weight_qos",
            "priorityweightpartition": "weight_partition"}
_BF = {"bf_interval": ("bf_interval_s", 1.0), "bf_resolution": ("bf_resolution_s", 1.0),
       "bf_max_job_test": ("bf_max_job_test", None), "bf_window": ("bf_window_s", 60.0),
       "sched_interval": ("sched_interval_s", 1.0), "batch_sched_delay": ("batch_sched_delay_s", 1.0)}
MAX_SETTINGS_BYTES = 8 << 20  # `scontrol show config` and slurm.conf are tens of kB
_SHOW_CONFIG_LINE = re.compile(r"^([A-Za-z_]\w*)\s+=\s?(.*)$")


# backfill settings Slurm takes only from 1 (a 0 or -1 there would make the simulator's
# backfill test nothing, or every job but the last); every other number from 0
_FROM_ONE = frozenset({"bf_interval", "bf_resolution", "bf_max_job_test", "bf_window"})


def _int(value: str, key: str, where: str) -> int:
    try:
        number = int(value.strip().split()[0])
    except (ValueError, IndexError):
        raise SchedulingSettingsError("%s: %s=%r is not a whole number; fix the value or leave the line out"
                                      % (where, key, value)) from None
    lowest = 1 if key in _FROM_ONE else 0
    if number < lowest:
        raise SchedulingSettingsError("%s: %s=%d is below %d, which the simulator does not model; fix the value or"
                                      " leave it out" % (where, key, number, lowest))
    return number


def settings_from_pairs(pairs: dict[str, str], where: str = "slurm config") -> SchedulingSettings:
    """The settings from ``key -> value`` pairs as Slurm names them (any case).

    Raises:
        SchedulingSettingsError: a value that is not what its key takes.
    """
    kv = {k.lower(): v.strip() for k, v in pairs.items()}
    names = {k.lower(): k for k in pairs}  # as the file spells them, for messages
    out: dict[str, object] = {}
    sched = kv.get("schedulertype", "sched/backfill")
    if sched not in ("sched/backfill", "sched/builtin"):
        raise SchedulingSettingsError("%s: SchedulerType=%s is not modelled; the simulator knows sched/backfill"
                                      " and sched/builtin" % (where, sched))
    out["scheduler"] = sched.split("/")[1]
    for key, name in _WEIGHTS.items():
        if kv.get(key) not in (None, "", "(null)"):
            out[name] = _int(kv[key], names[key], where)
    if kv.get("prioritymaxage"):
        age = parse_duration_s(kv["prioritymaxage"])
        if age is None:
            shown = kv["prioritymaxage"] if len(kv["prioritymaxage"]) <= 40 else kv["prioritymaxage"][:40] + "..."
            raise SchedulingSettingsError("%s: PriorityMaxAge=%r is not a Slurm duration (e.g. 7-0)" % (where, shown))
        out["max_age_s"] = float(age)
    out["favor_small"] = kv.get("priorityfavorsmall", "no").lower() in ("yes", "1", "true")
    if "slurmdbd" not in kv.get("accountingstoragetype", ""):
        out["weight_age"] = 0  # Slurm ignores the age factor without slurmdbd
    for item in kv.get("schedulerparameters", "").split(","):
        key, _, value = item.strip().partition("=")
        if key in _BF and value:
            name, unit = _BF[key]
            out[name] = _int(value, key, where) if unit is None else _int(value, key, where) * unit
    for item in kv.get("authinfo", "").split(","):
        key, _, value = item.strip().partition("=")
        if key.lower() == "cred_expire" and value:
            out["requeue_delay_s"] = float(_int(value, "AuthInfo cred_expire", where) + 1)
    if kv.get("prioritytype", "priority/multifactor") != "priority/multifactor":
        for name in _WEIGHTS.values():
            out[name] = 0
    return replace(SchedulingSettings(), **out)  # type: ignore[arg-type]


def parse_show_config(text: str, where: str = "scontrol show config") -> SchedulingSettings:
    """The settings in ``scontrol show config`` output (Slurm 22.05 and 24.11)."""
    pairs = {}
    for line in text.splitlines():
        match = _SHOW_CONFIG_LINE.match(line.strip())
        if match:
            pairs.setdefault(match.group(1), match.group(2))
    return settings_from_pairs(pairs, where)


def parse_slurm_conf(text: str, where: str = "slurm.conf") -> SchedulingSettings:
    """The settings in a slurm.conf (comments, node and partition lines ignored; a key
    given twice: the last wins, as slurmctld does)."""
    pairs: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        key, eq, value = line.partition("=")
        if eq and " " not in key.strip() and key.strip().lower() not in ("nodename", "partitionname"):
            pairs[key.strip()] = value.split()[0] if value.split() else ""
    return settings_from_pairs(pairs, where)


def is_show_config(text: str) -> bool:
    """Whether ``text`` is ``scontrol show config`` output rather than a slurm.conf."""
    return "Configuration data as of" in text or sum(
        1 for line in text.splitlines()[:50] if _SHOW_CONFIG_LINE.match(line.strip()) and " = " in line) >= 3


def read_scheduling_settings(path: str) -> SchedulingSettings:
    """The settings in ``path``: ``scontrol show config`` output or a slurm.conf (detected).

    Raises:
        SchedulingSettingsError: unreadable file or a bad value.
    """
    try:
        with open_nowait(path) as fh:  # <(scontrol show config) reads as it comes; a FIFO nobody writes, empty
            text = fh.read(MAX_SETTINGS_BYTES).decode("utf-8", "replace")
    except OSError as exc:
        raise SchedulingSettingsError("%s: cannot read it (%s); give `scontrol show config` output or a"
                                      " slurm.conf" % (path, exc.strerror or exc)) from None
    if "\0" in text:  # a binary file, or UTF-16 text (a Windows editor's): read, it would be all defaults
        raise SchedulingSettingsError("%s: not a text file (it holds NUL bytes: binary, or UTF-16); give"
                                      " `scontrol show config` output or a slurm.conf as UTF-8 text" % path)
    if is_show_config(text):
        return parse_show_config(text, path)
    if not any("=" in line for line in text.splitlines()):
        raise SchedulingSettingsError("%s: neither `scontrol show config` output nor a slurm.conf (no Key=Value"
                                      " line)" % path)
    return parse_slurm_conf(text, path)


def job_size_factor(nodes: int, cpus: int, cluster_nodes: int, cluster_cpus: int,
                    favor_small: bool) -> float:
    """Slurm's job size factor (priority/multifactor without SMALL_RELATIVE_TO_TIME): the
    mean of the job's share of the cluster's nodes and of its CPUs; with
    PriorityFavorSmall, the mean of one minus each share."""
    node_share = nodes / cluster_nodes if cluster_nodes else 0.0
    cpu_share = cpus / cluster_cpus if cluster_cpus else 0.0
    if favor_small:
        return ((1.0 - node_share) + (1.0 - cpu_share)) / 2.0
    return (node_share + cpu_share) / 2.0


def priority(settings: SchedulingSettings, age_s: float, size_factor: float, site_factor: int = 0,
             fairshare_factor: Optional[float] = None) -> float:
    """The multifactor priority: the weighted factors (each in [0, 1]) plus SiteFactor.
    Partition and QOS factors are 1 (one of each); fairshare is 1 unless given."""
    age = min(1.0, max(0.0, age_s) / settings.max_age_s) if settings.max_age_s else 1.0
    return (settings.weight_age * age + settings.weight_job_size * size_factor
            + settings.weight_fairshare * (1.0 if fairshare_factor is None else fairshare_factor)
            + settings.weight_qos + settings.weight_partition + site_factor)
