"""Text for people and their tools: tables for the terminal, CSV cells, strict JSON, and
whole numbers read back. No I/O: returns strings."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any, Sequence


def digits(text: str) -> bool:
    """Whether ``text`` is a whole number as people and Slurm write one: ASCII digits only.
    ``str.isdigit()`` alone also takes "²", which ``int()`` refuses."""
    return text.isascii() and text.isdigit()


def visible(text: str) -> str:
    """``text`` with every character a terminal would act on (ESC, BEL, a newline, any
    other that is not printable) written as its escape (``\\x1b``, ``\\n``): job names,
    users and reasons come from users and from a history anyone may have edited."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def json_text(data: Any, **dumps_args: Any) -> str:
    """``data`` as strict JSON: a number that is not finite (from a damaged history, or a sum
    that overflowed) is written ``null``, never ``NaN`` or ``Infinity``, which JSON has not
    and its readers refuse."""
    return json.dumps(_finite(data), allow_nan=False, **dumps_args)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def utc_datetime(epoch_s: float) -> datetime:
    """``epoch_s`` as a UTC datetime, for showing a time.

    Raises:
        ValueError: not a time between the years 1 and 9999 (nan, inf, 2**63: from a
            damaged or edited history; the C library's own error otherwise).
    """
    try:
        return datetime.fromtimestamp(float(epoch_s), tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise ValueError("%r s is not a time between the years 1 and 9999" % (epoch_s,)) from None


def csv_text(text: str) -> str:
    """A text cell for CSV an admin may open in a spreadsheet: ``visible``, and led by a
    quote where it starts as a formula would (``=``, ``+``, ``-``, ``@``), so that a name a
    user chose is shown, never run as a formula."""
    shown = visible(text)
    return "'" + shown if shown[:1] in ("=", "+", "-", "@") else shown


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return "{:,.0f}".format(value)
        if abs(value) >= 10:
            return "%.1f" % value
        return "%.3g" % value
    return visible(str(value))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Right-aligned columns (left for the first), one header line and a rule."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(items: Sequence[str]) -> str:
        return "  ".join(s.ljust(w) if i == 0 else s.rjust(w) for i, (s, w) in enumerate(zip(items, widths)))

    out = [line(list(headers)), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def duration(seconds: float | None) -> str:
    """Human duration: 45s, 12.5m, 3.2h, 4.1d."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return "%.0fs" % seconds
    if seconds < 7200:
        return "%.1fm" % (seconds / 60)
    if seconds < 172800:
        return "%.1fh" % (seconds / 3600)
    return "%.1fd" % (seconds / 86400)


# (unit, seconds per unit, largest value in seconds shown in that unit)
DURATION_UNITS = (("s", 1.0, 120.0), ("min", 60.0, 7200.0), ("h", 3600.0, 172800.0), ("d", 86400.0, float("inf")))


def duration_unit(seconds: Sequence[float | None]) -> tuple[str, float]:
    """One unit for a column of durations, chosen by its largest value (as ``duration``
    would show that value): (unit name, seconds per unit)."""
    largest = max((s for s in seconds if s is not None), default=0.0)
    for name, per_unit, limit in DURATION_UNITS:
        if largest < limit:
            return name, per_unit
    return DURATION_UNITS[-1][0], DURATION_UNITS[-1][1]


def duration_column(seconds: Sequence[float | None]) -> tuple[str, list[str]]:
    """A column of durations in one unit: (unit name, cells with one decimal, '-' for None)."""
    name, per_unit = duration_unit(seconds)
    return name, ["-" if s is None else "%.1f" % (s / per_unit) for s in seconds]
