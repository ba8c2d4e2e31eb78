"""``sql/schema.sql``: the history's tables as plain SQLite DDL, written from ``store.schema``
(types, NOT NULL, defaults, keys, indexes and the comments), so an admin can read the
tables, or create an empty history with ``sqlite3``, without a second copy to keep in step.
``pipeswift report sql schema`` prints it; ``tests/unit/test_schema_ddl.py`` checks that the
file is this output and that it makes the tables ``create_all`` makes."""

from __future__ import annotations

import textwrap
from typing import Any, Collection

from sqlalchemy import Column, Table
from sqlalchemy.dialects import sqlite

from pipeswift_slurm.store.schema import Base

WIDTH = 100  # characters a line, comments wrapped to it
HEADER = """\
-- pipeswift-slurm: reference DDL of the controller's history database (SQLite).
--
-- The controller creates these tables itself (pipeswift_slurm/store/schema.py, SQLAlchemy)
-- the first time it opens the database; this file says the same thing in plain SQL so an
-- admin can read it, query it with sqlite3, or create an empty database by hand:
--
--     sqlite3 /var/lib/pipeswift/pipeswift.sqlite < sql/schema.sql
--
-- Written by `pipeswift report sql schema` from schema.py, comments included (PostgreSQL
-- keeps them: \\d+ jobs in psql).
--
-- Conventions
--   * Times (*_time, *_at, at) are epoch seconds as REAL: whole seconds from Slurm,
--     fractions from the simulator. Convert with datetime(x, 'unixepoch').
--   * Durations (*_s) are seconds, REAL (time_limit_s: INTEGER, as Slurm gives it).
--   * BOOLEAN columns hold 0 or 1.
--   * NULL means "not known (yet)", never zero: a pending job has start_time NULL.

PRAGMA foreign_keys = ON;
"""


def _column(column: Column[Any], name_width: int) -> str:
    """One column's definition, without its comma or comment."""
    dialect = sqlite.dialect()
    parts = ["%-*s" % (name_width, column.name), "%-7s" % column.type.compile(dialect=dialect)]
    if not column.nullable:
        parts.append("NOT NULL")
    default = dialect.ddl_compiler(dialect, None).get_column_default_string(column)  # type: ignore[arg-type]
    if default is not None:
        parts.append("DEFAULT " + default)
    if column.primary_key:
        parts.append("PRIMARY KEY")
    parts += ["REFERENCES %s (%s)" % (fk.column.table.name, fk.column.name) for fk in column.foreign_keys]
    return "    " + " ".join(parts).rstrip()


def _table(table: Table, without: Collection[str]) -> str:
    """CREATE TABLE and its indexes; a column whose ``table.column`` is in ``without`` left out."""
    assert len(table.primary_key.columns) == 1, "a composite key is written as a table constraint"
    columns = [c for c in table.columns if "%s.%s" % (table.name, c.name) not in without]
    name_width = max(len(c.name) for c in columns)
    lines = [_column(c, name_width) + ("," if i < len(columns) - 1 else "") for i, c in enumerate(columns)]
    at = max([len(line) for line, c in zip(lines, columns) if c.comment] or [0]) + 2  # the comments' column
    out = ["-- " + line for line in textwrap.wrap(table.comment or "", WIDTH - 3)]
    out.append("CREATE TABLE IF NOT EXISTS %s (" % table.name)
    for line, column in zip(lines, columns):
        notes = textwrap.wrap(column.comment or "", WIDTH - at - 3)
        out.append(line + (" " * (at - len(line)) + "-- " + notes[0] if notes else ""))
        out += [" " * at + "-- " + more for more in notes[1:]]
    out.append(");")
    out += ["CREATE INDEX IF NOT EXISTS %s ON %s (%s);" % (index.name, table.name,
                                                           ", ".join(c.name for c in index.columns))
            for index in sorted(table.indexes, key=lambda index: str(index.name))]
    return "\n".join(out) + "\n"


def render(without: Collection[str] = ()) -> str:
    """The text of ``sql/schema.sql``: the tables in the order ``schema.py`` declares them.
    ``without`` names columns (``"jobs.ran_s"``) to leave out, as a history from a release
    before them has them (the upgrade's tests)."""
    return HEADER + "".join("\n" + _table(table, without) for table in Base.metadata.tables.values())
