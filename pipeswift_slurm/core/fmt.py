"""Plain-text tables for the terminal. No I/O: returns strings."""

from __future__ import annotations

from typing import Any, Sequence


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
    return str(value)


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
