"""The lines ``pipeswift simulate`` prints after its table: the worst user's mean JCT
against slurm's per policy, the WARNING when a policy that keeps the wait bound did not, and
with ``--learn`` how far off the learned predictions were."""

from __future__ import annotations

from typing import Any, Optional

from pipeswift_slurm.core.fmt import duration, visible


def worst_users_line(comp: Any) -> Optional[str]:
    """'worst user's mean JCT / slurm's ...: POLICY RATIO (USER), ...'; None when slurm did
    not run or no user has ``MIN_USER_JOBS`` jobs."""
    from pipeswift_slurm.sim.metrics import MIN_USER_JOBS  # (not at import: the CLI starts without the simulator)

    worst = [(m["policy"], m["worst_user_vs_slurm"]) for m in comp.metrics if m.get("worst_user_vs_slurm")]
    if not worst:
        return None
    return "worst user's mean JCT / slurm's (users with >= %d jobs): %s" % (
        MIN_USER_JOBS, ", ".join("%s %.2f (%s)" % (p, w["jct_ratio"], visible(w["user"])) for p, w in worst))


def bound_warning(comp: Any) -> Optional[str]:
    """One WARNING line when a policy that keeps the wait bound (``keeps_wait_bound``) did
    not, with fifo's longest wait when fifo ran (past the bound too: no order could have
    kept it); None when every such policy kept it."""
    broke = [m for m in comp.metrics if m.get("keeps_wait_bound") and not m["bound_kept"]]
    if not broke:
        return None
    fifo = next((m for m in comp.metrics if m["policy"] == "fifo"), None)
    why = "" if fifo is None else "; fifo waited up to %s (%s)" % (duration(fifo["max_wait_s"]), (
        "it kept the bound" if fifo["bound_kept"] else "no order could have kept the bound"))
    return "WARNING: wait bound not kept: %s%s" % (", ".join("%s waited up to %s against its %s bound" % (
        m["policy"], duration(m["max_wait_s"]), duration(m["wait_bound_s"])) for m in broke), why)


def learn_line(m: dict[str, Any]) -> str:
    """``--learn``'s figure of one policy (``sim/learning.py``): median and p90 error of the
    predictions made once a class had 20 finished runs, learned and the cost model's."""
    def one(kind: str, e: Optional[dict[str, float]]) -> str:
        if not e:
            return "%s layouts: no job" % kind
        return "%s layouts (%d jobs) median %.1f %% (model %.1f %%), p90 %.1f %% (model %.1f %%)" % (
            kind, e["jobs"], 100 * e["median_learned"], 100 * e["median_model"], 100 * e["p90_learned"],
            100 * e["p90_model"])

    return "%s: after 20 runs of a class, |actual/predicted - 1|: %s; %s" % (
        m["policy"], one("unseen", m.get("unseen_layouts")), one("seen", m.get("seen_layouts")))
