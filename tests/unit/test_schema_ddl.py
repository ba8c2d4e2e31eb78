"""sql/schema.sql is written from schema.py (``store.schema_sql``, ``pipeswift report sql
schema``), and the two create the same tables: columns with types, NOT NULL, defaults and
primary keys, foreign keys and indexes, compared through PRAGMA on two in-memory SQLite
databases (SQLAlchemy's own DDL against the file's)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from pipeswift_slurm.store.schema import Base, size_class

SCHEMA_SQL = Path(__file__).resolve().parents[2] / "sql" / "schema.sql"


def _describe(conn: sqlite3.Connection) -> dict[str, dict[str, object]]:
    """Map from table name to its columns, foreign keys and (named) indexes."""
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
    out: dict[str, dict[str, object]] = {}
    for table in tables:
        columns = [(name, ctype.upper(), notnull, default, pk) for _cid, name, ctype, notnull,
                   default, pk in conn.execute("PRAGMA table_info(%s)" % table)]
        fks = sorted((r[2], r[3], r[4]) for r in conn.execute("PRAGMA foreign_key_list(%s)" % table))
        indexes = {}
        for _seq, name, unique, origin, _partial in conn.execute("PRAGMA index_list(%s)" % table):
            if origin == "c":  # created by CREATE INDEX, not implied by PK/UNIQUE
                cols = [r[2] for r in conn.execute("PRAGMA index_info(%s)" % name)]
                indexes[name] = (unique, cols)
        out[table] = {"columns": columns, "foreign_keys": fks, "indexes": indexes}
    return out


@pytest.fixture(scope="module")
def from_orm() -> dict[str, dict[str, object]]:
    engine = create_engine("sqlite://", poolclass=StaticPool)
    Base.metadata.create_all(engine)
    raw = engine.raw_connection()
    try:
        return _describe(raw.driver_connection)
    finally:
        raw.close()


@pytest.fixture(scope="module")
def from_ddl() -> dict[str, dict[str, object]]:
    conn = sqlite3.connect(":memory:")
    conn.executescript(SCHEMA_SQL.read_text())
    return _describe(conn)


def test_same_tables(from_orm, from_ddl):
    assert sorted(from_ddl) == sorted(from_orm)
    assert {"jobs", "profiles", "state_transitions", "ticks", "decisions", "calibration",
            "tick_snapshots"} <= set(from_orm)


@pytest.mark.parametrize("table", sorted(t.name for t in Base.metadata.sorted_tables))
def test_same_columns(table, from_orm, from_ddl):
    # (name, type, notnull, default, pk) in declaration order
    assert from_ddl[table]["columns"] == from_orm[table]["columns"]


@pytest.mark.parametrize("table", sorted(t.name for t in Base.metadata.sorted_tables))
def test_same_keys_and_indexes(table, from_orm, from_ddl):
    assert from_ddl[table]["foreign_keys"] == from_orm[table]["foreign_keys"]
    assert from_ddl[table]["indexes"] == from_orm[table]["indexes"]


def test_the_file_is_written_from_schema_py():
    """One definition of the tables: the file is ``pipeswift report sql schema``, and every
    table and column comment in it comes from schema.py."""
    from click.testing import CliRunner

    from pipeswift_slurm.cli.main import pipeswift
    from pipeswift_slurm.store import schema_sql

    printed = CliRunner().invoke(pipeswift, ["report", "sql", "schema"])
    assert printed.exit_code == 0, printed.output
    assert printed.output == schema_sql.render()
    assert SCHEMA_SQL.read_text() == printed.output, (
        "sql/schema.sql is out of date: pipeswift report sql schema > sql/schema.sql")
    flat = " ".join(line.strip().lstrip("- ") for line in printed.output.splitlines())
    for table in Base.metadata.sorted_tables:
        assert table.comment and " ".join(table.comment.split()) in flat, table.name
        for column in table.columns:
            if column.comment:
                assert " ".join(column.comment.split()) in flat, (table.name, column.name)
    assert max(len(line) for line in printed.output.splitlines()) <= schema_sql.WIDTH


def test_a_column_left_out_leaves_valid_ddl():
    """``render(without=...)`` is how the upgrade tests make a history of an older release:
    the last column of a table left out still gives valid SQL."""
    from pipeswift_slurm.store import schema_sql

    last = "jobs." + list(Base.metadata.tables["jobs"].columns)[-1].name
    conn = sqlite3.connect(":memory:")
    conn.executescript(schema_sql.render(without={last, "measurements.own_layout"}))
    described = _describe(conn)
    assert last.split(".")[1] not in [c[0] for c in described["jobs"]["columns"]]
    assert "own_layout" not in [c[0] for c in described["measurements"]["columns"]]
    assert len(described["jobs"]["columns"]) == len(Base.metadata.tables["jobs"].columns) - 1


def test_ddl_is_idempotent():
    conn = sqlite3.connect(":memory:")
    conn.executescript(SCHEMA_SQL.read_text())
    conn.executescript(SCHEMA_SQL.read_text())  # IF NOT EXISTS everywhere


def test_store_opens_a_database_made_from_the_ddl(tmp_path):
    from pipeswift_slurm.store.history import Store

    path = tmp_path / "admin.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_SQL.read_text())
    conn.close()
    store = Store.from_url(str(path))
    with store.tick(10.0, "fifo"):
        pass
    assert store.tick_count() == 1


@pytest.mark.parametrize("gpus, run_s, expected", [
    (2, 3600.0, "small"),        # 2 GPU-h
    (4, 3599.0, "small"),        # just under 4 GPU-h
    (4, 3600.0, "medium"),       # 4 GPU-h
    (8, 2 * 3600.0, "medium"),   # 16 GPU-h
    (8, 4 * 3600.0, "large"),    # 32 GPU-h
    (64, 1800.0, "large"),       # 32 GPU-h
    (None, 3600.0, None),
    (8, None, None),
])
def test_size_class_thresholds(gpus, run_s, expected):
    assert size_class(gpus, run_s) == expected


def test_postgresql_gets_the_same_tables(from_ddl, new_database, tmp_path):
    """schema.py on PostgreSQL: the tables, columns (order, NOT NULL, primary keys) and
    indexes of sql/schema.sql; floats are DOUBLE PRECISION there (REAL is 4 bytes),
    every server default is accepted (a boolean's default once was not), and the tables and
    columns carry their comments."""
    from sqlalchemy import inspect

    from pipeswift_slurm.store.history import Store

    with new_database("postgresql", tmp_path, "ddl") as url:
        engine = Store.from_url(url).engine
        try:
            found = inspect(engine)
            assert sorted(found.get_table_names()) == sorted(from_ddl)
            for table, want in from_ddl.items():
                cols = found.get_columns(table)
                pk = set(found.get_pk_constraint(table)["constrained_columns"])
                got = [(c["name"], not c["nullable"] or c["name"] in pk, c["name"] in pk) for c in cols]
                assert got == [(name, bool(notnull) or bool(is_pk), bool(is_pk))
                               for name, _t, notnull, _d, is_pk in want["columns"]]
                for c, (_n, ctype, *_rest) in zip(cols, want["columns"]):
                    is_double = str(c["type"]) == "DOUBLE PRECISION"
                    assert is_double == (ctype == "REAL"), (table, c["name"], c["type"])
                assert {i["name"] for i in found.get_indexes(table)} == set(want["indexes"])
                ours = Base.metadata.tables[table]
                assert found.get_table_comment(table)["text"] == ours.comment  # psql: \dt+, \d+
                assert {c["name"]: c.get("comment") for c in cols} == {c.name: c.comment for c in ours.columns}
        finally:
            engine.dispose()
