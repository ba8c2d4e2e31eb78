"""The controller's history tables (SQLAlchemy 2.x declarative, typed ``Mapped[...]``).

This module owns table and column definitions, and the pure ``size_class`` rule whose result
is stored on each job. It holds no queries (``store.py`` does) and must not be imported by
the policy or by ``model.py``. Each table and column says what it holds in its comment
(PostgreSQL keeps them); ``sql/schema.sql``, the reference DDL for SQLite, is written from
these definitions, comments included (``store.schema_sql``).

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


def about(table_comment: str, *args: Any) -> tuple[Any, ...]:
    """``__table_args__`` with the table's comment (``sql/schema.sql``; PostgreSQL keeps it)."""
    return (*args, {"comment": table_comment})


def note(comment: str, **kwargs: Any) -> Any:
    """A column with its comment (``sql/schema.sql``; PostgreSQL keeps it: ``\\d+``)."""
    return mapped_column(comment=comment, **kwargs)


class JobRow(Base):
    """One Slurm job as last observed, plus what we derived from its times (``store.rows``).

    A requeued job keeps its first ``submit_time`` and ``eligible_time`` (live Slurm moves
    them to the requeue), so end_time - submit_time is its whole JCT; ``ran_s`` and
    ``attained_gpu_s`` add up its runs before the latest requeue, from its start to the
    first tick that saw it pending again (live Slurm does not report them; the policy plans
    a requeued job on the work it has left). ``eligible_time`` also stays put where Slurm
    restarts it at the release of an admin's or the controller's hold, or at the end of
    psbatch's first look (``rows.eligible_since``): those waits are queue time.
    """

    __tablename__ = "jobs"

    job_id: Mapped[int] = note("Slurm JobId", primary_key=True, autoincrement=False)
    cluster: Mapped[str] = note("Slurm cluster name ('' = the only one)", server_default="")
    user: Mapped[Optional[str]]
    name: Mapped[Optional[str]]
    partition: Mapped[Optional[str]]
    submit_time: Mapped[Optional[float]] = note("the first submission's (kept across requeues)")
    eligible_time: Mapped[Optional[float]] = note(
        "when it could start (dependencies, its user's hold, a begin time); kept across an admin's or"
        " the controller's hold and psbatch's first look, where Slurm restarts it")
    start_time: Mapped[Optional[float]] = note("NULL while pending")
    end_time: Mapped[Optional[float]] = note("NULL while active; estimated if state ends in '?'")
    state: Mapped[str] = note("last seen: PENDING, RUNNING, COMPLETED, ...; 'COMPLETED?' or 'CANCELLED?':"
                              " vanished from the queue unseen, end_time = the first tick it was gone")
    state_reason: Mapped[Optional[str]] = note("Slurm's Reason (Priority, Resources, ...)")
    num_nodes: Mapped[Optional[int]]
    gpus: Mapped[Optional[int]] = note("the current request (pending) or allocation")
    requested_gpus: Mapped[Optional[int]] = note("gpus when first seen (before any resize)")
    opted_in: Mapped[bool] = note("carries the psbatch opt-in tag",
                                  server_default=false())  # 0 in SQLite, false in PostgreSQL
    job_class: Mapped[Optional[str]] = note("calibration key, from the profile")
    size_class: Mapped[Optional[str]] = note(
        "small (< 4 GPU-h), medium (< 32), large; from run_s, else predicted_run_s")
    queue_s: Mapped[Optional[float]] = note("start_time - wait_origin_time, once started")
    run_s: Mapped[Optional[float]] = note("end_time - start_time (its latest run)")
    predicted_run_s: Mapped[Optional[float]] = note("the latest estimate for the config it runs with")
    run_config: Mapped[Optional[str]] = note("that config, ExecConfig.short() (NULL: the controller cannot"
                                             " know it)")
    calibration_skip: Mapped[Optional[str]] = note(
        "why it must not feed calibration: the launcher chose a config the controller cannot see,"
        " or an emulated run (NULL: it may)")
    first_seen_tick: Mapped[Optional[int]]
    last_seen_tick: Mapped[Optional[int]]
    restarts: Mapped[int] = note("requeues seen (or reported by Slurm)", server_default=text("0"))
    ran_s: Mapped[float] = note("wall seconds of its runs before a requeue", server_default=text("0"))
    attained_gpu_s: Mapped[float] = note("GPU-seconds of those runs", server_default=text("0"))
    wait_origin_time: Mapped[Optional[float]] = note(
        "coalesce(eligible_time, submit_time) + ran_s (rows.wait_origin): a pending job has waited"
        " now - wait_origin_time so far")

    __table_args__ = about("One row per Slurm job the controller has seen, as last observed.",
                           Index("ix_jobs_state", "state"), Index("ix_jobs_end_time", "end_time"))


class ProfileRow(Base):
    """The psbatch profile token of a job: raw request text and what parsing made of it."""

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
    requested_config: Mapped[Optional[str]] = note("the user's own config, ExecConfig.short()")
    parse_error: Mapped[Optional[str]]
    created_at: Mapped[float]
    updated_at: Mapped[float]

    __table_args__ = about("The psbatch profile token found in a job's Comment. User-editable text: a"
                           " request, never a fact. Parsed fields are NULL when parsing failed"
                           " (parse_error says why).")


class TickRow(Base):
    """One controller tick; ``finished_at`` = started_at + duration_s unless the caller
    says otherwise."""

    __tablename__ = "ticks"

    tick_id: Mapped[int] = mapped_column(primary_key=True)
    started_at: Mapped[float] = note("the tick's clock (epoch or simulated s)")
    finished_at: Mapped[Optional[float]] = note("started_at + duration_s")
    duration_s: Mapped[Optional[float]] = note("wall seconds the tick took")
    policy: Mapped[str]
    dry_run: Mapped[bool]
    n_pending: Mapped[int] = mapped_column(server_default=text("0"))
    n_running: Mapped[int] = mapped_column(server_default=text("0"))
    n_decisions: Mapped[int] = mapped_column(server_default=text("0"))
    n_applied: Mapped[int] = mapped_column(server_default=text("0"))
    n_errors: Mapped[int] = mapped_column(server_default=text("0"))
    status: Mapped[str] = note("'ok', 'failed', 'acting' or 'interrupted'")
    error: Mapped[Optional[str]]

    __table_args__ = about("One row per controller tick (one transaction each). A tick whose transaction"
                           " rolled back leaves no row, unless the controller recorded it afterwards with"
                           " status 'failed'.")


class StateTransitionRow(Base):
    """A job's state change as the controller saw it."""

    __tablename__ = "state_transitions"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.job_id"))
    tick_id: Mapped[int] = mapped_column(ForeignKey("ticks.tick_id"))
    at: Mapped[float]
    from_state: Mapped[Optional[str]]
    to_state: Mapped[str]
    reason: Mapped[Optional[str]] = note("Slurm's Reason, or 'vanished'")

    __table_args__ = about("Every state change the controller saw; the first sighting has from_state"
                           " NULL. \"at\" is the job's own time for the new state where Slurm reports"
                           " one (submit, start, end), else the tick's time.",
                           Index("ix_state_transitions_job_id", "job_id"))


class DecisionRow(Base):
    """One policy decision for one job in one tick, and what became of it.

    The config's fields are stored one per column so the Decision can be rebuilt exactly.
    A live tick writes its decisions before it changes Slurm, with ``awaiting_outcome``
    set (an intent), and clears it once the outcome is known; an intent whose tick died
    (or whose outcome Slurm did not say) is settled by the next tick from what Slurm shows
    (``error`` then says so).
    """

    __tablename__ = "decisions"

    id: Mapped[int] = mapped_column(primary_key=True)
    tick_id: Mapped[int] = mapped_column(ForeignKey("ticks.tick_id"))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.job_id"))
    at: Mapped[float]
    kind: Mapped[str] = note("the levers moved, e.g. 'resize+site_factor', 'none'")
    config: Mapped[Optional[str]] = note("ExecConfig.short(), e.g. '8gpu=1x8 tp1 pp4 dp2 mbs1 M16'")
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
    hold: Mapped[Optional[bool]] = note("1 hold, 0 release (the controller's own hold)")
    partition: Mapped[Optional[str]] = note("moved to this partition (a mixed cluster)")
    reason: Mapped[Optional[str]]
    predicted_start_s: Mapped[Optional[float]]
    predicted_end_s: Mapped[Optional[float]]
    intended: Mapped[bool] = note("moves any lever")
    applied: Mapped[Optional[bool]] = note("1 applied, 0 failed (see error), NULL not attempted (a dry run,"
                                           " or the same as the decision last applied)")
    error: Mapped[Optional[str]]
    awaiting_outcome: Mapped[bool] = note("1: written before Slurm was changed, outcome not known yet",
                                          server_default=false())

    __table_args__ = about(
        "Every decision the policy made, whether applied or not. The config columns are the ExecConfig"
        " fields (tp = tensor_model_parallel_size, pp = pipeline_model_parallel_size, dp = data-parallel"
        " size, cp = context_parallel_size, vp = virtual pipeline stages).",
        Index("ix_decisions_job_id", "job_id"), Index("ix_decisions_tick_id", "tick_id"))


class CalibrationRow(Base):
    """Estimator bias per job class."""

    __tablename__ = "calibration"

    job_class: Mapped[str] = mapped_column(primary_key=True)
    n_jobs: Mapped[int]
    log_ratio: Mapped[float]
    ratio: Mapped[float]
    updated_at: Mapped[float]

    __table_args__ = about("Estimator bias per job class: ratio = exp(log_ratio), log_ratio = robust mean"
                           " of ln(actual run_s / predicted run_s) over n_jobs finished jobs.")


class MeasurementRow(Base):
    """What the launcher measured of a job, as the controller accepted it."""

    __tablename__ = "measurements"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.job_id"), primary_key=True, autoincrement=False)
    user: Mapped[Optional[str]]
    job_class: Mapped[Optional[str]]
    config: Mapped[Optional[str]] = note("ExecConfig.short() of the layout that ran")
    tp: Mapped[Optional[int]]
    pp: Mapped[Optional[int]]
    micro_batch_size: Mapped[Optional[int]]
    vp: Mapped[Optional[int]]
    iter_s: Mapped[Optional[float]] = note("measured median s per iteration")
    predicted_iter_s: Mapped[Optional[float]] = note("the cost model's, uncalibrated")
    iterations: Mapped[Optional[int]] = note("the last iteration the launcher saw")
    status: Mapped[str] = note("'ok', or why not learned from: 'out of bounds', 'not its user's file', ...")
    reported_at: Mapped[float] = note("when the launcher wrote it (the file's mtime)")
    own_layout: Mapped[Optional[int]] = note("1: the user's own layout ran, 0: another (NULL: recorded"
                                             " before this column)")

    __table_args__ = about(
        "What the launcher measured of a job (submit/iterlog.py: Megatron's iteration lines), as the"
        " controller accepted it (slurm/measured.py): median seconds per iteration after the warm-up, of"
        " the layout that ran, beside the cost model's uncalibrated prediction for that layout. A claim"
        " about this job only: status is 'ok' or why it is not learned from.")


class TickSnapshotRow(Base):
    """Cluster occupancy seen by one tick, for utilisation over time."""

    __tablename__ = "tick_snapshots"

    tick_id: Mapped[int] = mapped_column(ForeignKey("ticks.tick_id"), primary_key=True,
                                         autoincrement=False)
    at: Mapped[float]
    n_nodes: Mapped[int]
    total_gpus: Mapped[int] = note("on usable nodes only")
    free_gpus: Mapped[int]
    busy_gpus: Mapped[int] = note("total_gpus - free_gpus")
    pending_gpus: Mapped[int] = note("the GPUs pending jobs ask for (demand)")
    n_pending: Mapped[int]
    n_running: Mapped[int]

    __table_args__ = about("Cluster occupancy seen by each tick (utilisation over time).")


class ControllerLeaseRow(Base):
    """Which controller may act (one row, ``id`` 1); two hosts, or two lock files, share a
    history safely."""

    __tablename__ = "controller_lease"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    holder: Mapped[Optional[str]] = note("'host pid N'; NULL when free")
    taken_at: Mapped[Optional[float]]
    expires_at: Mapped[float] = note("epoch s; free once past", server_default=text("0"))

    __table_args__ = about("Which controller may act (one row, id 1): taken at the start of every live tick"
                           " with a conditional UPDATE, so two controllers sharing this history never act"
                           " in the same tick.")
