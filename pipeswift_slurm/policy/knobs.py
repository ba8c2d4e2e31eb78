"""Policy knobs: one frozen dataclass per policy, with defaults and the range of each knob.

The knobs of a policy are the fields of its dataclass (``PipeSwiftKnobs`` ...); each
field's metadata holds its range (``lo``/``hi``, inclusive, ``above``: exclusive lower
bound). ``make_knobs`` and ``parse_knob`` are the one place knob values are checked:
the controller's config file, ``pipeswift simulate --knob``, the presets and the benches
all go through them, so a wrong type or an out-of-range value is refused before any
policy runs. Pure; imports nothing outside the standard library.
"""

from dataclasses import dataclass, field, fields
import math
from typing import Any, Mapping, Optional, get_type_hints

from pipeswift_slurm.core.switch import switch

# Slurm keeps SiteFactor in a signed 32-bit integer.
SITE_FACTOR_LIMIT = 2_147_483_647


class KnobError(ValueError):
    """A knob name a policy does not have, or a value of the wrong type or range."""


def knob(default: Any, lo: Optional[float] = None, hi: Optional[float] = None,
         above: Optional[float] = None) -> Any:
    """A knob field with its default and range (``lo`` <= value <= ``hi``, value > ``above``)."""
    return field(default=default, metadata={"lo": lo, "hi": hi, "above": above})


@dataclass(frozen=True)
class NoKnobs:
    """Knobs of a policy that has none (``fifo``, ``slurm``)."""


@dataclass(frozen=True)
class SjfKnobs:
    """``sjf``: the SiteFactor of the first job in its order."""

    site_factor_max: int = knob(100_000_000, lo=0, hi=SITE_FACTOR_LIMIT)


@dataclass(frozen=True)
class TiresiasKnobs:
    """``tiresias`` (see ``policy/tiresias.py`` for each knob's role)."""

    queue_limits_gpu_s: tuple[float, ...] = knob((36000.0, 360000.0), lo=0)
    promote_factor: float = knob(8.0, lo=0)
    min_wait_s: float = knob(3600.0, lo=0)
    min_run_s: float = knob(1800.0, lo=0)
    preempt: bool = knob(True)
    site_factor_max: int = knob(100_000_000, lo=0, hi=SITE_FACTOR_LIMIT)


@dataclass(frozen=True)
class PipeSwiftKnobs:
    """``pipeswift`` (see ``policy/pipeswift.py`` for each knob's role)."""

    wait_bound_s: float = knob(48 * 3600.0, above=0)
    promote_fraction: float = knob(0.9, lo=0, hi=1)
    aging: float = knob(0.0, lo=0)
    start_margin: float = knob(0.1, lo=0)
    plan_depth: int = knob(64, lo=1)
    site_factor_max: int = knob(100_000_000, lo=0, hi=SITE_FACTOR_LIMIT)
    reshape_running: bool = knob(False)
    reshape_margin: float = knob(0.2, lo=0)
    resize: bool = knob(True)
    reconfigure: bool = knob(True)
    expand_reserve_fraction: float = knob(0.1, lo=0, hi=1)
    reservations: int = knob(64, lo=0)
    short_lane_fraction: float = knob(0.125, lo=0, hi=1)
    short_lane_max_s: float = knob(2 * 3600.0, lo=0)
    preempt: bool = knob(False)
    preempt_margin: float = knob(0.2, lo=0)
    preempt_ratio: float = knob(1.5, above=0)
    preempt_min_run_s: float = knob(1800.0, lo=0)
    preempt_per_tick: int = knob(8, lo=0)
    preempt_max_restarts: int = knob(12, lo=0)
    preempt_wait_share: float = knob(0.75, lo=0, hi=1)
    reshape_waiting: bool = knob(True)
    risk_fraction: float = knob(0.75, lo=0, hi=1)
    starve_share: float = knob(0.5, lo=0, hi=1)
    borrow_share: float = knob(0.25, lo=0, hi=1)
    lend_efficiency: float = knob(0.6, lo=0, hi=1)
    move_partitions: bool = knob(True)

    @property
    def promote_s(self) -> float:
        """Queue time from which a job starves by age (goes first; never a multi-node
        preemption victim)."""
        return self.promote_fraction * self.wait_bound_s


def knob_fields(cls: type) -> dict[str, Any]:
    """Name -> dataclass field of each knob of ``cls``."""
    return {f.name: f for f in fields(cls)}


def _num(value: float) -> str:
    return "%d" % value if float(value).is_integer() else "%g" % value


def _range_text(meta: Mapping[str, Any]) -> str:
    lo, hi, above = meta.get("lo"), meta.get("hi"), meta.get("above")
    if lo is not None and hi is not None:
        return " in [%s, %s]" % (_num(lo), _num(hi))
    if above is not None:
        return " > %s" % _num(above)
    return " >= %s" % _num(lo) if lo is not None else ""


def _in_range(value: float, meta: Mapping[str, Any]) -> bool:
    lo, hi, above = meta.get("lo"), meta.get("hi"), meta.get("above")
    return (lo is None or value >= lo) and (hi is None or value <= hi) and (above is None or value > above)


def _is_number(value: Any) -> bool:
    """A finite int or float, and one a float knob can take (not an int past 1e308)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return math.isfinite(value) if isinstance(value, float) else abs(value) < 2 ** 1023


def check_knob(cls: type, name: str, value: Any) -> Any:
    """``value`` as knob ``name`` of ``cls`` takes it (lists become tuples, integers of a
    float knob floats).

    Raises:
        KnobError: no such knob, or a value of the wrong type or out of range (the
            message names the knob and what it takes; no colon, so callers can prefix it).
    """
    known = knob_fields(cls)
    if name not in known:
        raise KnobError("has no knob %s; its knobs are %s" % (name, ", ".join(known) or "(none)"))
    kind, meta = get_type_hints(cls)[name], known[name].metadata
    if kind is bool:
        if not isinstance(value, bool):
            raise KnobError("%s must be true or false (got %r)" % (name, value))
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int) or not _in_range(value, meta):
            raise KnobError("%s must be an integer%s (got %r)" % (name, _range_text(meta), value))
        return value
    if kind is float:
        if not _is_number(value) or not _in_range(value, meta):
            raise KnobError("%s must be a finite number%s (got %r)" % (name, _range_text(meta), value))
        return float(value)
    items = value if isinstance(value, (list, tuple)) else None
    if not items or not all(_is_number(v) and _in_range(v, meta) for v in items) or list(items) != sorted(items):
        raise KnobError("%s must be a non-empty ascending list of finite numbers%s (got %r)"
                        % (name, _range_text(meta), value))
    return tuple(float(v) for v in items)


def make_knobs(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance of knob class ``cls`` with ``values`` over its defaults, each checked.

    Raises:
        KnobError: see ``check_knob``.
    """
    return cls(**{name: check_knob(cls, name, value) for name, value in values.items()})


def parse_knob(cls: type, name: str, text: str) -> Any:
    """Knob ``name`` of ``cls`` from command-line text (``true``, ``3``, ``0.5``, ``1,2``), checked.

    Raises:
        KnobError: see ``check_knob``; also text that is not of the knob's type.
    """
    known = knob_fields(cls)
    if name not in known:
        check_knob(cls, name, None)
    kind = get_type_hints(cls)[name]
    words = text.strip().lower()
    if kind is bool:
        on = switch(words)
        if on is None:
            raise KnobError("expected true or false")
        return check_knob(cls, name, on)
    try:
        if kind is int:
            value: Any = int(words)
        elif kind is float:
            value = float(words)
        else:
            value = tuple(float(item) for item in words.split(","))
    except ValueError:
        raise KnobError("expected %s" % ("an integer" if kind is int else "a number")) from None
    return check_knob(cls, name, value)
