"""The values of ``pipeswift simulate``'s options that click's types cannot check alone:
policy names and labels, knobs, NAME=RATIO items and the start date. Each refuses a bad
value with one line (``fail``, exit 2)."""

from __future__ import annotations

import calendar
import math
import re
from datetime import datetime
from typing import Any, Optional

from pipeswift_slurm.cli.common import fail


def policies_option(text: str) -> tuple[str, ...]:
    from pipeswift_slurm.policy import policy_names

    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [n for n in names if n.split(":")[0] not in policy_names()]
    if unknown or not names:
        fail("--policy: unknown policy %s; known: %s" % (", ".join(unknown) or "''", ", ".join(policy_names())))
    for name in names:  # a label names the run's history file and its --knob: letters, digits, - _ .
        if ":" in name and not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", name.split(":", 1)[1]):
            fail("--policy %s: a label after ':' is 1-40 letters, digits, '-', '_' or '.', e.g. pipeswift:mine"
                 % name[:60])
    if len(set(names)) < len(names):
        fail("--policy: %s is given twice; give each policy once, or label one, e.g. pipeswift:b"
             % next(n for n in names if names.count(n) > 1))
    return names


def knobs_option(items: tuple[str, ...], policies: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``--knob LABEL.NAME=VALUE`` items as knobs per policy label of ``--policy``, each
    parsed and checked by the policy registry (the same check as the config file's)."""
    from pipeswift_slurm.policy import KnobError, knob_defaults, parse_policy_knob

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        target, eq, text = item.partition("=")
        label, dot, name = target.rpartition(".")
        if not (eq and dot and label and name):
            fail("--knob %r: expected POLICY.NAME=VALUE, e.g. pipeswift.preempt=true" % item)
        if label not in policies:
            fail("--knob %r: %s is not one of --policy (%s)" % (item, label, ",".join(policies)))
        known = knob_defaults(label.split(":")[0])
        if name not in known:
            fail("--knob %r: %s has no knob %s; %s" % (item, label.split(":")[0], name,
                                                       "its knobs: " + ", ".join(known) if known else "it has none"))
        try:
            out.setdefault(label, {})[name] = parse_policy_knob(label.split(":")[0], name, text)
        except KnobError as exc:
            fail("--knob %r: bad value for %s (%s)" % (item, name, exc))
    return out


def ratios_option(items: tuple[str, ...], option: str = "--truth-bias") -> tuple[tuple[str, float], ...]:
    """NAME=RATIO items (``--truth-bias``: a job class prefix; ``--truth-partition-factor``:
    a partition), each RATIO from 0.01 to 100 (a job 100 x slower than predicted is no error model)."""
    out = []
    for item in items:
        prefix, _, value = item.partition("=")
        try:
            ratio = float(value)
        except ValueError:
            ratio = math.nan
        if not prefix or not 0.01 <= ratio <= 100:  # nan fails too
            fail("%s %r: expected %s=RATIO with RATIO from 0.01 to 100, e.g. %s=1.3"
                 % (option, item, *(("CLASS_PREFIX", "gpt-swiglu") if option == "--truth-bias" else ("NAME", "h100"))))
        out.append((prefix, ratio))
    return tuple(out)


def start_option(text: Optional[str]) -> Optional[float]:
    """``--start YYYY-MM-DD`` as the epoch second of that UTC midnight (None when not given)."""
    if text is None:
        return None
    try:
        day = datetime.strptime(text, "%Y-%m-%d")
    except ValueError:
        fail("--start %r: expected a date YYYY-MM-DD, e.g. 2024-05-01" % text)
    if not 1970 <= day.year <= 2999:  # a history's times must stay dates the reports can print
        fail("--start %s: give a date from 1970-01-01 to 2999-12-31" % text)
    return float(calendar.timegm(day.timetuple()))
