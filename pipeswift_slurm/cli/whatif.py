"""``pipeswift simulate --sacct FILE`` and ``--history DB``: the site's own history as the
workload (sim/sacct.py, sim/replay.py), and what each policy would have changed for each
user and job class, beside the usual comparison."""

from __future__ import annotations

from typing import Any, Optional

import click

from pipeswift_slurm.cli.common import fail

TOP_GROUPS = 15  # rows per "what would have changed" table in the text output (JSON has all)


def load_history(sacct: Optional[str], history_db: Optional[str], **trace_only: Any) -> Any:
    """The History of ``--sacct FILE`` or ``--history DB``; one line, exit 2, when unusable
    or when an option of trace workloads (``trace_only``: option name -> value) is given."""
    from pipeswift_slurm.sim.replay import history_from_rows
    from pipeswift_slurm.sim.sacct import read_sacct
    from pipeswift_slurm.sim.workload import WorkloadError

    if sacct and history_db:
        fail("--sacct and --history: give one history to replay, not both")
    given = [name for name, value in trace_only.items() if value is not None]
    if given:
        fail("--%s: a history replay keeps its own times and jobs; leave it out (--start-day and --window-days"
             " select a part of the history)" % given[0].replace("_", "-"))
    if sacct:
        try:
            return read_sacct(sacct)
        except WorkloadError as exc:
            fail(str(exc))
    from pipeswift_slurm.cli.history_db import open_history, readable_values
    from pipeswift_slurm.store.history import shown_url
    from pipeswift_slurm.store.reads import ran_job_rows

    assert history_db is not None
    store = open_history(history_db)
    try:
        with readable_values(history_db):  # text that is not UTF-8: one line
            return history_from_rows(ran_job_rows(store.engine), shown_url(history_db))
    finally:
        store.engine.dispose()


def skipped_note(facts: dict[str, Any]) -> Optional[str]:
    """One line: how many jobs of the history were left out of the replay, and why."""
    skipped = facts.get("skipped") or {}
    if not skipped:
        return None
    return "history: %d job(s) left out or replayed as they ran: %s" % (
        sum(skipped.values()), ", ".join("%d %s" % (n, why) for why, n in skipped.items()))


def _table(groups: list[dict[str, Any]], key: str, policies: list[str]) -> str:
    from pipeswift_slurm.core.fmt import duration_unit, table

    shown = groups[:TOP_GROUPS]
    values = [g["as_ran_mean_jct_s"] for g in shown] + [g["mean_jct_s"][p] for g in shown for p in policies]
    unit, per_unit = duration_unit(values)
    rows = []
    for g in shown:
        rows.append([g[key], g["jobs"], "-" if g["as_ran_mean_jct_s"] is None else "%.1f" % (g["as_ran_mean_jct_s"]
                                                                                            / per_unit)]
                    + ["-" if g["mean_jct_s"][p] is None else "%.1f (%.2f)" % (g["mean_jct_s"][p] / per_unit,
                                                                               g["vs_as_ran"][p] or 0)
                       for p in policies])
    more = "\n  (%d more in --json)" % (len(groups) - len(shown)) if len(groups) > len(shown) else ""
    return table([key.replace("_", " "), "jobs", "as ran (%s)" % unit] + ["%s (%s)" % (p, unit) for p in policies],
                 rows) + more


def fidelity_line(fidelity: dict[str, Any]) -> str:
    """One line: how close the ``slurm`` replay came to the history as it ran."""
    def ratio(value: Optional[float]) -> str:
        return "-" if value is None else "%.2fx" % value

    return ("slurm replay vs as it ran: mean JCT %s, mean wait %s (%d jobs; near 1.00x: the replay reproduces"
            " what Slurm did, and the comparison above can be trusted as far as that)"
            % (ratio(fidelity["mean_jct_ratio"]), ratio(fidelity["mean_wait_ratio"]), fidelity["jobs"]))


def load_slurm_settings(path: Optional[str]) -> Any:
    """The SchedulingSettings of ``--slurm-config FILE`` (Slurm's defaults without one);
    one line, exit 2, when the file cannot be read."""
    from pipeswift_slurm.slurm.backends.sched_settings import SchedulingSettings, SchedulingSettingsError, \
        read_scheduling_settings

    if path is None:
        return SchedulingSettings()
    try:
        return read_scheduling_settings(path)
    except SchedulingSettingsError as exc:
        fail(str(exc))


def print_what_changed(comp: Any) -> None:
    """The per-user and per-class mean JCT as it ran and under each policy."""
    from pipeswift_slurm.core.fmt import duration

    changed = comp.changed
    policies = [m["policy"] for m in comp.metrics]
    click.echo("\nwhat would have changed: mean JCT as it ran %s; %s" % (
        duration(changed["as_ran_mean_jct_s"]), ", ".join(
            "%s %s (%.2f x)" % (p, duration(changed["mean_jct_s"][p]), changed["vs_as_ran"][p] or 0)
            for p in policies)))
    fidelity = changed.get("slurm_replay_vs_as_ran")
    if fidelity:
        click.echo(fidelity_line(fidelity))
    click.echo(_table(changed["by_user"], "user", policies))
    click.echo()
    click.echo(_table(changed["by_class"], "job_class", policies))
    click.echo("cells: mean JCT under the policy (its ratio to the mean JCT as it ran; below 1 is faster);"
               " job class %r: jobs without a Megatron profile, replayed as they ran" % "(as it ran)")
