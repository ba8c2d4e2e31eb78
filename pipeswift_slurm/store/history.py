"""The controller's history: jobs, profiles, state changes, ticks, decisions, calibration.

``Store`` owns every read and write of the database and speaks only domain types
(``model.py``) and the small frozen dataclasses of ``store.queries``; ORM rows never leave
the store modules. This module owns the engine (SQLite tuning), ``Store`` and
``StoreBusy``; the domain queries live in ``store.queries``, the reports' reads in
``store.reads``, one tick's writes in ``store.tick`` (``TickTx``) over the rows and
statements of ``store.rows``. One tick is one transaction
(``with store.tick(now, policy, dry_run) as tx:``): if its body raises, nothing of it
remains, the tick row included. Writes are bulk (one statement per table per tick) so the
simulator can record ~100k ticks.

SQLite (the default) is tuned on every connection: ``foreign_keys=ON``, ``busy_timeout``,
and for files a journal mode with ``synchronous=NORMAL``. The controller's history uses
the rollback journal (``journal_mode=DELETE``): any user who may read the file can read
the database (``pipeswift report``, ``sqlite3 -readonly``), while a WAL database can only
be read by someone who may create its ``-shm`` file beside it, i.e. write to the
controller's folder (and a user who can put a ``-wal`` file there could feed rows to the
next root checkpoint). A reader holds its lock for one query; the tick's commit waits for
it up to ``busy_timeout``. A simulation writing its own file asks for WAL (fewer syncs).
Readers open the file read-only (``make_engine(..., readonly=True)``: ``mode=ro``, no
pragma that writes). A tick starts with ``BEGIN IMMEDIATE`` so two writers (an
overlapping cron tick, a manual ``pipeswift controller tick``) queue on the write lock
for up to ``busy_timeout_s`` and then fail with ``StoreBusy``, instead of deadlocking on a
read-to-write upgrade. Other SQLAlchemy URLs work with their own defaults; PostgreSQL
(``postgresql+psycopg://``, the ``postgres`` extra) is tested like SQLite. A URL whose
driver is not installed, or that SQLAlchemy cannot read, raises ``StoreUnavailable`` with
one line that says what to install or fix.

Vanished jobs: a job the DB believes active (PENDING, RUNNING, ...) but absent from the
snapshot is reported by ``save_snapshot``; the caller may look it up (sacct) and save it,
or call ``mark_vanished``, which records ``end_time = now`` (an upper bound, one tick late at most)
and state ``COMPLETED?`` if it had started, else ``CANCELLED?``; a later real one wins.

This module must not be imported by the policy; it imports nothing from Slurm backends.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

from sqlalchemy import Engine, and_, bindparam, create_engine, event, insert, inspect, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool
from sqlalchemy.schema import CreateColumn

from pipeswift_slurm.core.files import sqlite_read_only, starts_as_sqlite
from pipeswift_slurm.core.model import Decision, Job
from pipeswift_slurm.store.lease import LEASE_TTL_S, LeaseState, release_lease, take_lease
from pipeswift_slurm.store.schema import Base, DecisionRow, TickRow, missing_date_functions
from pipeswift_slurm.store.queries import CalibrationEntry, Queries, T, chunks
from pipeswift_slurm.store.queries import (ACTIVE_STATES, CALIBRATION_STATES, CONFIG_FIELDS,  # noqa: F401
                            VANISHED_STARTED, VANISHED_UNSTARTED, FinishedJob, RecordedDecision, SnapshotSummary)
from pipeswift_slurm.store.rows import SELECT_IDS, MeasurementWrites, history_fields, inserted_id, save_calibration
from pipeswift_slurm.store.tick import TickTx

log = logging.getLogger(__name__)

SET_OUTCOMES = (update(DecisionRow.__table__)
                .where(and_(DecisionRow.__table__.c.tick_id == bindparam("b_tick_id"),
                            DecisionRow.__table__.c.job_id == bindparam("b_job_id")))
                .values(applied=bindparam("b_applied"), error=bindparam("b_error"),
                        awaiting_outcome=bindparam("b_awaiting")))


def _missing(conn: Any) -> tuple[set[str], list[tuple[Any, Any]]]:
    """The tables the database has, and the (table, column) pairs the models have and an
    existing table lacks."""
    found = inspect(conn)
    have_tables = set(found.get_table_names())
    missing = []
    for table in Base.metadata.sorted_tables:
        if table.name in have_tables:
            have = {c["name"] for c in found.get_columns(table.name)}
            missing += [(table, column) for column in table.columns if column.name not in have]
    return have_tables, missing


class StoreError(RuntimeError):
    """The database could not be written (full disk, read-only file, lost server...)."""


class StoreBusy(StoreError):
    """Another writer held the database longer than ``busy_timeout_s``."""


class StoreUnavailable(RuntimeError):
    """The history URL cannot be used: its driver is not installed, or it is not a URL
    SQLAlchemy knows. The message is one line that says what to do."""


# the Python module a URL's driver needs -> what to install (the extras in setup.cfg)
DRIVER_INSTALL = {
    "psycopg": "pip install 'pipeswift-slurm[postgres]' (the psycopg driver)",
    "psycopg2": "pip install 'pipeswift-slurm[postgres]' and write the URL as postgresql+psycopg://...",
}


def shown_url(url: str) -> str:
    """``url`` as it may be printed: any password replaced by ``***``."""
    if "://" not in url:
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # not a URL SQLAlchemy reads: hide what may be a password
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def sqlite_path(url: str) -> Optional[Path]:
    """The SQLite file a history URL names (a bare path or ``sqlite:///path``); None for
    any other URL (a database server, or SQLite in memory)."""
    if "://" not in url:
        return Path(url)
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        return Path(url.removeprefix("sqlite:///"))
    return None


def _driver_missing(url: str, exc: ImportError) -> StoreUnavailable:
    module = (exc.name or "").split(".")[0]
    install = DRIVER_INSTALL.get(module, "install the package that provides it")
    return StoreUnavailable("the history at %s needs the Python module %s, which is not installed: %s"
                            % (shown_url(url), module or "of its driver", install))


@contextmanager
def _store_errors(what: str) -> Iterator[None]:
    """Turn the driver's OperationalError into StoreBusy (locked) or StoreError (any other)."""
    try:
        yield
    except OperationalError as exc:
        if _is_locked(exc):
            log.warning("%s: database busy: %s", what, exc.orig)
            raise StoreBusy("store is locked by another writer: %s" % exc.orig) from exc
        raise StoreError("%s: %s" % (what, str(exc.orig).splitlines()[0] if exc.orig else exc)) from exc


HISTORY_TABLES = frozenset({"ticks", "decisions", "jobs"})


def not_a_history(path: Path) -> str:
    """Why the file at ``path`` is not a pipeswift history ('' when it is one, or when
    nothing is there): a SQLite file with the history's tables, read without writing."""
    if not path.exists() and not path.is_symlink():
        return ""
    try:
        if not starts_as_sqlite(path):
            return "the file exists and is not a pipeswift history (not a SQLite database)"
        conn = sqlite_read_only(path)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except (OSError, sqlite3.Error) as exc:
        return "cannot read it (%s)" % exc
    if not HISTORY_TABLES <= tables:
        return "the file exists and is not a pipeswift history (no %s table)" % ", ".join(sorted(HISTORY_TABLES - tables))
    return ""


def same_action(a: Optional[Decision], b: Optional[Decision]) -> bool:
    """True when two decisions move the same levers to the same values.

    Reason and predicted times are ignored: they change every tick, the action does not.
    """
    if a is None or b is None:
        return a is b
    return (a.job_id, a.config, a.site_factor, a.time_limit_s, a.requeue) == (
        b.job_id, b.config, b.site_factor, b.time_limit_s, b.requeue)


JOURNAL_MODES = ("DELETE", "WAL")


def make_engine(url: str, busy_timeout_s: float = 30.0, *, readonly: bool = False,
                journal_mode: str = "DELETE") -> Engine:
    """Create an engine for ``url`` (``sqlite:////var/lib/pipeswift/pipeswift.sqlite``,
    ``postgresql://...``, or a plain file path: SQLite, its folder made if missing, not for a
    reader). SQLite connections wait ``busy_timeout_s`` for a lock. ``readonly``: a SQLite
    file opens with ``mode=ro`` (nothing created or written: a user who may only read can),
    a PostgreSQL transaction is READ ONLY. ``journal_mode``: "DELETE" (the controller's
    history, readable by any reader) or "WAL" (a private file written fast: a simulation).
    A URL or path that cannot be opened raises StoreUnavailable (one line to show)."""
    if journal_mode not in JOURNAL_MODES:
        raise ValueError("journal_mode must be one of %s (got %r)" % (", ".join(JOURNAL_MODES), journal_mode))
    if "://" not in url:
        url = "sqlite:///" + url
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() != "sqlite":
            engine = create_engine(url)
            # a reader's transactions are READ ONLY on PostgreSQL (no accidental write)
            return engine.execution_options(postgresql_readonly=True) if readonly else engine
    except ImportError as exc:
        raise _driver_missing(url, exc) from None
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:  # ValueError: a port that is no number
        raise StoreUnavailable("%s is not a history URL SQLAlchemy can open (%s): give a SQLite file path"
                               " or a URL such as postgresql+psycopg://user@host/db"
                               % (shown_url(url), exc)) from None
    database = parsed.database or ""
    in_memory = database in ("", ":memory:")
    kwargs: dict[str, Any] = {}
    target: Any = url
    try:
        if in_memory:
            kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
        elif readonly and not database.startswith("file:"):
            path = str(Path(database).expanduser().resolve())
            target = parsed.set(database="file:%s" % quote(path), query={**parsed.query, "mode": "ro", "uri": "true"})
        elif not database.startswith("file:"):
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(target, **kwargs)
    except ImportError as exc:  # sqlite+DRIVER whose module is not installed
        raise _driver_missing(url, exc) from None
    except (OSError, ValueError) as exc:  # a folder that cannot be made; a NUL in the path
        raise StoreUnavailable("cannot open the history %s: %s" % (shown_url(url), exc)) from None
    _tune_sqlite(engine, busy_timeout_s, None if in_memory or readonly else journal_mode)
    return engine


def _tune_sqlite(engine: Engine, busy_timeout_s: float, journal_mode: Optional[str]) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # the driver's implicit BEGIN is replaced below
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=%d" % int(busy_timeout_s * 1000))
        if journal_mode:
            _set_journal_mode(cursor, journal_mode)
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql("BEGIN " + mode)


def _set_journal_mode(cursor: Any, journal_mode: str) -> None:
    """Switch the file's journal mode when it differs; a switch that a reader of the old
    WAL file keeps from happening is tried again on the next connection."""
    if cursor.execute("PRAGMA journal_mode").fetchone()[0].upper() == journal_mode:
        return
    try:
        cursor.execute("PRAGMA journal_mode=%s" % journal_mode)
    except sqlite3.OperationalError as exc:
        log.warning("cannot switch the history to journal_mode %s yet (%s); trying again next time", journal_mode, exc)


def _is_locked(exc: OperationalError) -> bool:
    return "locked" in str(exc.orig).lower() or "busy" in str(exc.orig).lower()


# ---------------------------------------------------------------- the store

class Store(Queries, MeasurementWrites):
    """History of jobs and decisions over SQLAlchemy (SQLite by default).

    Use ``Store.from_url(path_or_url)`` in the controller, ``Store.in_memory()`` in the
    simulator and tests. Queries return domain objects and frozen dataclasses.
    """

    def __init__(self, engine: Engine, create: bool = True) -> None:
        """Wrap ``engine`` (use ``make_engine`` for SQLite tuning); create missing tables."""
        self.engine = engine
        self._write_engine = engine.execution_options(sqlite_begin="IMMEDIATE")
        if create:
            self._create_missing_tables()

    def _create_missing_tables(self) -> None:
        """Create missing tables, and add the columns a newer release added to existing
        ones (each has a default, so old rows stay valid)."""
        with self.engine.connect() as conn:
            have, missing = _missing(conn)
            functions = missing_date_functions(conn)  # PostgreSQL: SQLite's, for sql/*.sql
        if set(Base.metadata.tables) <= have and not missing and not functions:
            return
        # Under the write lock, so two processes opening a new file do not race.
        with self._write_engine.begin() as conn:
            Base.metadata.create_all(conn)
            for table, column in _missing(conn)[1]:
                conn.execute(text("ALTER TABLE %s ADD COLUMN %s" % (
                    table.name, CreateColumn(column).compile(dialect=conn.dialect))))
                log.info("added column %s.%s", table.name, column.name)
            for ddl in functions:
                conn.execute(text(ddl))
        if not set(Base.metadata.tables) <= have:
            log.info("created tables %s", ", ".join(sorted(set(Base.metadata.tables) - have)))

    def history_fields(self, now: float, jobs: Iterable[Job]) -> dict[int, dict[str, Any]]:
        """The fields each job's view takes from its stored row where live Slurm forgot them
        (a requeued job's first times and earlier runs, a restarted eligible time: ``rows.history_fields``)."""
        wanted = {j.job_id: j for j in jobs}
        if not wanted:
            return {}
        rows = self._read(lambda s: {r[0]: dict(r._mapping) for c in chunks(list(wanted)) for r in s.execute(
            SELECT_IDS, {"ids": list(c)})})
        return {i: history_fields(rows.get(i), job, now) for i, job in wanted.items()}

    @classmethod
    def from_url(cls, url: str, busy_timeout_s: float = 30.0, journal_mode: str = "DELETE") -> "Store":
        """Open (and create if missing) the store at a SQLAlchemy URL or SQLite file path
        (``journal_mode``: see ``make_engine``)."""
        return cls(make_engine(url, busy_timeout_s, journal_mode=journal_mode))

    @classmethod
    def reader(cls, url: str) -> "Store":
        """The store at ``url`` opened read-only (creates nothing; see ``make_engine``)."""
        return cls(make_engine(url, readonly=True), create=False)

    @classmethod
    def in_memory(cls) -> "Store":
        """A private in-memory SQLite store (one persistent connection)."""
        return cls(make_engine("sqlite://"))

    def _read(self, fn: Callable[..., T], *args: Any) -> T:
        with Session(self.engine) as s, s.begin():
            return fn(s, *args)

    @contextmanager
    def tick(self, now: float, policy: str, dry_run: bool = False) -> Iterator[TickTx]:
        """One tick's transaction: everything written through the yielded TickTx commits
        together at the end of the ``with`` block, or not at all if the body raises.

        Args:
            now: the tick's clock (epoch or simulated seconds).
            policy: name of the policy run.
            dry_run: decisions are recorded but not applied.

        Raises:
            StoreBusy: another writer held the database past ``busy_timeout_s``.
        """
        with _store_errors("tick at %.0f" % now):
            with Session(self._write_engine) as session, session.begin():
                tx = TickTx(session, now, policy, dry_run)
                yield tx
                if not tx.finished:
                    tx.finish()

    def record_outcomes(self, tick_id: int, outcomes: Mapping[int, tuple[Optional[bool], Optional[str], bool]],
                        status: str, error: Optional[str], duration_s: float) -> None:
        """Record what became of a tick's intents (written by ``TickTx.record_decisions``
        with ``awaiting_outcome``) once Slurm was changed, and close the tick row.

        Args:
            tick_id: the tick (its row says 'acting' until now).
            outcomes: map from job_id to (applied, error text, still awaiting: Slurm did not
                say, e.g. a batch that timed out; the next tick settles it).
            status: the tick's final status ('ok' or 'failed'); error: why it failed.
            duration_s: wall seconds of the whole tick.

        Raises:
            StoreBusy, StoreError: the database could not be written (the intents stay,
                and the next tick settles them from Slurm's state).
        """
        rows = [{"b_tick_id": tick_id, "b_job_id": job_id, "b_applied": None if awaiting else applied,
                 "b_error": error_text, "b_awaiting": awaiting}
                for job_id, (applied, error_text, awaiting) in outcomes.items()]
        with _store_errors("outcomes of tick %d" % tick_id):
            with Session(self._write_engine) as s, s.begin():
                if rows:
                    s.execute(SET_OUTCOMES, rows)
                s.execute(update(TickRow).where(TickRow.tick_id == tick_id).values(
                    status=status, error=error, duration_s=duration_s,
                    finished_at=TickRow.started_at + duration_s,
                    n_applied=sum(1 for r in rows if r["b_applied"] is True),
                    n_errors=sum(1 for r in rows if r["b_applied"] is False)))

    def take_lease(self, holder: str, now: float, ttl_s: float = LEASE_TTL_S) -> LeaseState:
        """Take the controller lease (``store.lease.take_lease``).

        Raises:
            StoreBusy, StoreError: the database could not be written.
        """
        with _store_errors("controller lease"):
            return take_lease(self._write_engine, holder, now, ttl_s)

    def release_lease(self, holder: str) -> None:
        """Give the controller lease back (a failure is logged: it expires anyway)."""
        try:
            with _store_errors("controller lease"):
                release_lease(self._write_engine, holder)
        except StoreError as exc:
            log.warning("could not give the controller lease back (it expires by itself): %s", exc)

    def record_failed_tick(self, now: float, policy: str, dry_run: bool, error: str) -> int:
        """Record a tick whose transaction was rolled back (its own small transaction).

        Returns:
            The failed tick's id.
        """
        with _store_errors("failed tick"), Session(self._write_engine) as s, s.begin():
            result = s.execute(insert(TickRow).values(
                started_at=now, finished_at=now, duration_s=0.0, policy=policy,
                dry_run=dry_run, status="failed", error=error[:10000]))
            return inserted_id(result)

    def save_calibration(self, rows: Iterable[CalibrationEntry]) -> None:
        """Replace the calibration of the job classes in ``rows`` (others are kept)."""
        with Session(self._write_engine) as s, s.begin():
            save_calibration(s, list(rows))
