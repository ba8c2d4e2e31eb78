"""The controller's history tables (SQLAlchemy 2.x declarative, typed ``Mapped[...]``).

This module owns table and column definitions, and the pure ``size_class`` rule whose result
is stored on each job. It holds no queries (``store.py`` does) and must not be imported by
the policy or by ``model.py``. ``sql/schema.sql`` is the hand-written reference DDL for
SQLite; ``tests/unit/test_schema_ddl.py`` proves the two agree column by column.

Conventions:
  * Times are epoch seconds stored as REAL (DOUBLE PRECISION in PostgreSQL), a float, so
    simulated time with fractions fits; real Slurm times are whole seconds and stay exact
    in a double. Durations are seconds (``*_s``), also REAL.
  * Strings are TEXT; booleans are BOOLEAN (0/1 in SQLite, false/true in PostgreSQL;
    server defaults are written so that both accept them).
  * Columns that a job may not have yet (``start_time`` of a pending job) are NULL, never 0.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from sqlalchemy import DOUBLE_PRECISION, REAL, Boolean, ForeignKey, Index, Integer, Text, false, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

log = logging.getLogger(__name__)

from pipeswift_slurm.core.sizeclass import MEDIUM_MAX_GPU_H, SIZE_CLASSES, SMALL_MAX_GPU_H, size_class  # noqa: F401 (re-exported)


# SQLite's REAL is a double; PostgreSQL's is a 4-byte float (epoch seconds would lose
# minutes), so there a float column is DOUBLE PRECISION.
FLOAT = REAL().with_variant(DOUBLE_PRECISION(), "postgresql")


# SQLite's two date functions, for PostgreSQL, so that the admin queries in sql/ are one
# file for both databases: strftime(format, t, 'unixepoch') with the conversions %Y %m %d
# %H %M %S (UTC; other text passes through to_char, so keep to digits and punctuation), and
# datetime(t, 'unixepoch'). Any other modifier gives NULL, as SQLite's do. The store
# creates them beside its tables (CREATE OR REPLACE: an upgrade rewrites them).
POSTGRESQL_DATE_FUNCTIONS = (
    # two controllers opening a new database at once: one replaces at a time
    "SELECT pg_advisory_xact_lock(hashtext('pipeswift: date functions'))",
    """CREATE OR REPLACE FUNCTION strftime(fmt TEXT, t DOUBLE PRECISION, modifier TEXT)
RETURNS TEXT LANGUAGE sql STABLE AS $$
SELECT CASE WHEN modifier = 'unixepoch' THEN to_char(to_timestamp(t) AT TIME ZONE 'UTC',
    replace(replace(replace(replace(replace(replace(fmt, '%Y', 'YYYY'), '%m', 'MM'), '%d', 'DD'),
                                    '%H', 'HH24'), '%M', 'MI'), '%S', 'SS')) END
$$""",
    """CREATE OR REPLACE FUNCTION datetime(t DOUBLE PRECISION, modifier TEXT)
RETURNS TEXT LANGUAGE sql STABLE AS $$ SELECT strftime('%Y-%m-%d %H:%M:%S', t, modifier) $$""",
)
# Present when both exist (to_regprocedure follows the search_path, as the queries do).
POSTGRESQL_HAS_DATE_FUNCTIONS = ("SELECT to_regprocedure('strftime(text, double precision, text)') IS NOT NULL"
                                 " AND to_regprocedure('datetime(double precision, text)') IS NOT NULL")


def missing_date_functions(conn: Any) -> tuple[str, ...]:
    """The DDL still needed to give this database SQLite's date functions: none on SQLite
    (it has them), nor on a PostgreSQL database that has them already."""
    if conn.dialect.name != "postgresql" or conn.execute(text(POSTGRESQL_HAS_DATE_FUNCTIONS)).scalar():
        return ()
    return POSTGRESQL_DATE_FUNCTIONS


class Base(DeclarativeBase):
    """Declarative base: Python float -> REAL (DOUBLE PRECISION in PostgreSQL), str -> TEXT."""

    type_annotation_map = {float: FLOAT, str: Text, int: Integer, bool: Boolean}


class JobRow(Base):
    """One Slurm job as last observed, plus what we derived from its times.

    ``gpus`` is the current request (pending) or allocation (running); ``requested_gpus``
    is ``gpus`` when the job was first seen (what the user asked before any resize).
    ``queue_s`` = start_time - (eligible_time or submit_time) - ran_s, set once a start is
    seen: start_time - ``wait_origin_time`` (``rows.wait_origin``; a pending job has waited
    now - wait_origin_time so far); ``run_s`` = end_time - start_time, set once an end is seen. ``ran_s`` and
    ``attained_gpu_s`` add up the runs before its latest requeue, as seen: from its start
    to the first tick that saw it pending again (live Slurm does not report them; the
    policy plans a requeued job on the work it has left). A requeued job keeps its first
    ``submit_time`` and ``eligible_time`` (live Slurm moves them to the requeue), so
    end_time - submit_time is its whole JCT. ``eligible_time`` also stays put where Slurm
    restarts it at the release of an admin's or the controller's hold, or at the end of
    psbatch's first look (``rows.eligible_since``): those waits are queue time. ``state`` ends in ``?``
    when the job vanished from the queue and its end is an estimate (see Store).
    ``run_config`` is the config the job ran with (``ExecConfig.short()``) when the
    controller knows it, and ``predicted_run_s`` the cost model's run time for that
    config; ``calibration_skip`` says why a job must not feed calibration (the launcher
    chose a config the controller cannot see, or an emulated run): NULL means it may.
    """

    __tablename__ = "jobs"

    job_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    cluster: Mapped[str] = mapped_column(server_default="")
    user: Mapped[Optional[str]]
    name: Mapped[Optional[str]]
    partition: Mapped[Optional[str]]
    submit_time: Mapped[Optional[float]]
    eligible_time: Mapped[Optional[float]]
    start_time: Mapped[Optional[float]]
    end_time: Mapped[Optional[float]]
    state: Mapped[str]
    state_reason: Mapped[Optional[str]]
    num_nodes: Mapped[Optional[int]]
    gpus: Mapped[Optional[int]]
    requested_gpus: Mapped[Optional[int]]
    opted_in: Mapped[bool] = mapped_column(server_default=false())  # 0 in SQLite, false in PostgreSQL
    job_class: Mapped[Optional[str]]
    size_class: Mapped[Optional[str]]
    queue_s: Mapped[Optional[float]]
    run_s: Mapped[Optional[float]]
    predicted_run_s: Mapped[Optional[float]]
    run_config: Mapped[Optional[str]]
    calibration_skip: Mapped[Optional[str]]
    first_seen_tick: Mapped[Optional[int]]
    last_seen_tick: Mapped[Optional[int]]
    restarts: Mapped[int] = mapped_column(server_default=text("0"))
    ran_s: Mapped[float] = mapped_column(server_default=text("0"))
    attained_gpu_s: Mapped[float] = mapped_column(server_default=text("0"))
    wait_origin_time: Mapped[Optional[float]]

    __table_args__ = (
        Index("ix_jobs_state", "state"),
        Index("ix_jobs_end_time", "end_time"),
    )


class ProfileRow(Base):
    """The psbatch profile token of a job: raw request text and what parsing made of it.

    ``raw_text`` is user-editable (the job's Comment): a request, never trusted. Parsed
    fields are NULL when parsing failed; ``parse_error`` then says why.
    """

    __tablename__ = "profiles"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.job_id"), primary_key=True,
                                        autoincrement=False)
    raw_text: Mapped[str]
    job_class: Mapped[Optional[str]]
    num_layers: Mapped[Optional[int]]
    hidden_size: Mapped[Optional[int]]
    seq_length: Mapped[Optional[int]]
    global_batch_size: Mapped[Optional[int]]
    train_iters: Mapped[Optional[int]]
    min_gpus: Mapped[Optional[int]]
    max_gpus: Mapped[Optional[int]]
    requested_config: Mapped[Optional[str]]
    parse_error: Mapped[Optional[str]]
    created_at: Mapped[float]
    updated_at: Mapped[float]


class TickRow(Base):
    """One controller tick. ``started_at`` is the tick's clock (epoch or simulated s);
    ``duration_s`` is wall-clock seconds spent in the tick; ``finished_at`` =
    started_at + duration_s unless the caller says otherwise."""

    __tablename__ = "ticks"

    tick_id: Mapped[int] = mapped_column(primary_key=True)
    started_at: Mapped[float]
    finished_at: Mapped[Optional[float]]
    duration_s: Mapped[Optional[float]]
    policy: Mapped[str]
    dry_run: Mapped[bool]
    n_pending: Mapped[int] = mapped_column(server_default=text("0"))
    n_running: Mapped[int] = mapped_column(server_default=text("0"))
    n_decisions: Mapped[int] = mapped_column(server_default=text("0"))
    n_applied: Mapped[int] = mapped_column(server_default=text("0"))
    n_errors: Mapped[int] = mapped_column(server_default=text("0"))
    status: Mapped[str]
    error: Mapped[Optional[str]]


class StateTransitionRow(Base):
    """A job's state change as the controller saw it (first sight: from_state NULL)."""

    __tablename__ = "state_transitions"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.job_id"))
    tick_id: Mapped[int] = mapped_column(ForeignKey("ticks.tick_id"))
    at: Mapped[float]
    from_state: Mapped[Optional[str]]
    to_state: Mapped[str]
    reason: Mapped[Optional[str]]

    __table_args__ = (Index("ix_state_transitions_job_id", "job_id"),)


class DecisionRow(Base):
    """One policy decision for one job in one tick, and what became of it.

    ``kind`` summarises the levers moved ("resize+site_factor", "none", ...); ``config`` is
    ``ExecConfig.short()``; the config's fields are stored one per column so the Decision
    can be rebuilt exactly. ``intended`` is True when the decision moves any lever;
    ``applied`` is True (applied), False (failed: see ``error``) or NULL (not attempted:
    dry run, or identical to the last applied decision). A live tick writes its decisions
    before it changes Slurm, with ``awaiting_outcome`` set (an intent), and clears it once
    the outcome is known; an intent whose tick died (or whose outcome Slurm did not say) is
    settled by the next tick from what Slurm shows (``error`` then says so).
    """

    __tablename__ = "decisions"

    id: Mapped[int] = mapped_column(primary_key=True)
    tick_id: Mapped[int] = mapped_column(ForeignKey("ticks.tick_id"))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.job_id"))
    at: Mapped[float]
    kind: Mapped[str]
    config: Mapped[Optional[str]]
    tp: Mapped[Optional[int]]
    pp: Mapped[Optional[int]]
    dp: Mapped[Optional[int]]
    cp: Mapped[Optional[int]]
    vp: Mapped[Optional[int]]
    micro_batch_size: Mapped[Optional[int]]
    num_micro_batches: Mapped[Optional[int]]
    num_nodes: Mapped[Optional[int]]
    gpus_per_node: Mapped[Optional[int]]
    decoder_first_pipeline_num_layers: Mapped[Optional[int]]
    decoder_last_pipeline_num_layers: Mapped[Optional[int]]
    gpus: Mapped[Optional[int]]
    site_factor: Mapped[Optional[int]]
    time_limit_s: Mapped[Optional[int]]
    requeue: Mapped[bool]
    hold: Mapped[Optional[bool]]
    partition: Mapped[Optional[str]]
    reason: Mapped[Optional[str]]
    predicted_start_s: Mapped[Optional[float]]
    predicted_end_s: Mapped[Optional[float]]
    intended: Mapped[bool]
    applied: Mapped[Optional[bool]]
    error: Mapped[Optional[str]]
    awaiting_outcome: Mapped[bool] = mapped_column(server_default=false())

    __table_args__ = (
        Index("ix_decisions_job_id", "job_id"),
        Index("ix_decisions_tick_id", "tick_id"),
    )


class CalibrationRow(Base):
    """Estimator bias per job class: ``log_ratio`` is a robust mean of
    log(actual run_s / predicted run_s) over ``n_jobs`` finished jobs; ``ratio`` = exp."""

    __tablename__ = "calibration"

    job_class: Mapped[str] = mapped_column(primary_key=True)
    n_jobs: Mapped[int]
    log_ratio: Mapped[float]
    ratio: Mapped[float]
    updated_at: Mapped[float]


class MeasurementRow(Base):
    """What the launcher measured of a job (``submit/iterlog.py``), as the controller
    accepted it (``slurm/measured.py``): the median seconds per iteration after warm-up of
    the layout that ran, beside the cost model's uncalibrated prediction for that layout.
    A claim about this job only; ``status`` is 'ok' or why it is not learned from."""

    __tablename__ = "measurements"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.job_id"), primary_key=True, autoincrement=False)
    user: Mapped[Optional[str]]
    job_class: Mapped[Optional[str]]
    config: Mapped[Optional[str]]
    tp: Mapped[Optional[int]]
    pp: Mapped[Optional[int]]
    micro_batch_size: Mapped[Optional[int]]
    vp: Mapped[Optional[int]]
    iter_s: Mapped[Optional[float]]
    predicted_iter_s: Mapped[Optional[float]]
    iterations: Mapped[Optional[int]]
    status: Mapped[str]
    reported_at: Mapped[float]
    own_layout: Mapped[Optional[int]]  # 1: the user's own layout, 0: another (NULL: recorded before)


class TickSnapshotRow(Base):
    """Cluster occupancy seen by one tick, for utilisation over time.

    ``total_gpus`` counts usable nodes only; ``busy_gpus`` = total - free;
    ``pending_gpus`` is the GPUs pending jobs ask for (demand)."""

    __tablename__ = "tick_snapshots"

    tick_id: Mapped[int] = mapped_column(ForeignKey("ticks.tick_id"), primary_key=True,
                                         autoincrement=False)
    at: Mapped[float]
    n_nodes: Mapped[int]
    total_gpus: Mapped[int]
    free_gpus: Mapped[int]
    busy_gpus: Mapped[int]
    pending_gpus: Mapped[int]
    n_pending: Mapped[int]
    n_running: Mapped[int]


class ControllerLeaseRow(Base):
    """Which controller may act (one row, ``id`` 1): taken at the start of every live tick
    with a conditional UPDATE, so two controllers sharing the history (two hosts, or two
    lock files) never act in the same tick. ``holder`` is ``host pid N``; NULL when free;
    a lease past ``expires_at`` (epoch s) is free too."""

    __tablename__ = "controller_lease"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    holder: Mapped[Optional[str]]
    taken_at: Mapped[Optional[float]]
    expires_at: Mapped[float] = mapped_column(server_default=text("0"))
