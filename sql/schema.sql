-- pipeswift-slurm: reference DDL of the controller's history database (SQLite).
--
-- The controller creates these tables itself (pipeswift_slurm/store/schema.py, SQLAlchemy)
-- the first time it opens the database; this file says the same thing in plain SQL so an
-- admin can read it, query it with sqlite3, or create an empty database by hand:
--
--     sqlite3 /var/lib/pipeswift/pipeswift.sqlite < sql/schema.sql
--
-- Written by `pipeswift report sql schema` from schema.py, comments included (PostgreSQL
-- keeps them: \d+ jobs in psql).
--
-- Conventions
--   * Times (*_time, *_at, at) are epoch seconds as REAL: whole seconds from Slurm,
--     fractions from the simulator. Convert with datetime(x, 'unixepoch').
--   * Durations (*_s) are seconds, REAL (time_limit_s: INTEGER, as Slurm gives it).
--   * BOOLEAN columns hold 0 or 1.
--   * NULL means "not known (yet)", never zero: a pending job has start_time NULL.

PRAGMA foreign_keys = ON;

-- One row per Slurm job the controller has seen, as last observed.
CREATE TABLE IF NOT EXISTS jobs (
    job_id           INTEGER NOT NULL PRIMARY KEY,  -- Slurm JobId
    cluster          TEXT    NOT NULL DEFAULT '',   -- Slurm cluster name ('' = the only one)
    user             TEXT,
    name             TEXT,
    partition        TEXT,
    submit_time      REAL,                          -- the first submission's (kept across requeues)
    eligible_time    REAL,                          -- when it could start (dependencies, its user's
                                                    -- hold, a begin time); kept across an admin's
                                                    -- or the controller's hold and psbatch's first
                                                    -- look, where Slurm restarts it
    start_time       REAL,                          -- NULL while pending
    end_time         REAL,                          -- NULL while active; estimated if state ends in
                                                    -- '?'
    state            TEXT    NOT NULL,              -- last seen: PENDING, RUNNING, COMPLETED, ...;
                                                    -- 'COMPLETED?' or 'CANCELLED?': vanished from
                                                    -- the queue unseen, end_time = the first tick
                                                    -- it was gone
    state_reason     TEXT,                          -- Slurm's Reason (Priority, Resources, ...)
    num_nodes        INTEGER,
    gpus             INTEGER,                       -- the current request (pending) or allocation
    requested_gpus   INTEGER,                       -- gpus when first seen (before any resize)
    opted_in         BOOLEAN NOT NULL DEFAULT 0,    -- carries the psbatch opt-in tag
    job_class        TEXT,                          -- calibration key, from the profile
    size_class       TEXT,                          -- small (< 4 GPU-h), medium (< 32), large; from
                                                    -- run_s, else predicted_run_s
    queue_s          REAL,                          -- start_time - wait_origin_time, once started
    run_s            REAL,                          -- end_time - start_time (its latest run)
    predicted_run_s  REAL,                          -- the latest estimate for the config it runs
                                                    -- with
    run_config       TEXT,                          -- that config, ExecConfig.short() (NULL: the
                                                    -- controller cannot know it)
    calibration_skip TEXT,                          -- why it must not feed calibration: the
                                                    -- launcher chose a config the controller cannot
                                                    -- see, or an emulated run (NULL: it may)
    first_seen_tick  INTEGER,
    last_seen_tick   INTEGER,
    restarts         INTEGER NOT NULL DEFAULT 0,    -- requeues seen (or reported by Slurm)
    ran_s            REAL    NOT NULL DEFAULT 0,    -- wall seconds of its runs before a requeue
    attained_gpu_s   REAL    NOT NULL DEFAULT 0,    -- GPU-seconds of those runs
    wait_origin_time REAL                           -- coalesce(eligible_time, submit_time) + ran_s
                                                    -- (rows.wait_origin): a pending job has waited
                                                    -- now - wait_origin_time so far
);
CREATE INDEX IF NOT EXISTS ix_jobs_end_time ON jobs (end_time);
CREATE INDEX IF NOT EXISTS ix_jobs_state ON jobs (state);

-- The psbatch profile token found in a job's Comment. User-editable text: a request, never a fact.
-- Parsed fields are NULL when parsing failed (parse_error says why).
CREATE TABLE IF NOT EXISTS profiles (
    job_id            INTEGER NOT NULL PRIMARY KEY REFERENCES jobs (job_id),
    raw_text          TEXT    NOT NULL,
    job_class         TEXT,
    num_layers        INTEGER,
    hidden_size       INTEGER,
    seq_length        INTEGER,
    global_batch_size INTEGER,
    train_iters       INTEGER,
    min_gpus          INTEGER,
    max_gpus          INTEGER,
    requested_config  TEXT,  -- the user's own config, ExecConfig.short()
    parse_error       TEXT,
    created_at        REAL    NOT NULL,
    updated_at        REAL    NOT NULL
);

-- One row per controller tick (one transaction each). A tick whose transaction rolled back leaves
-- no row, unless the controller recorded it afterwards with status 'failed'.
CREATE TABLE IF NOT EXISTS ticks (
    tick_id     INTEGER NOT NULL PRIMARY KEY,
    started_at  REAL    NOT NULL,  -- the tick's clock (epoch or simulated s)
    finished_at REAL,              -- started_at + duration_s
    duration_s  REAL,              -- wall seconds the tick took
    policy      TEXT    NOT NULL,
    dry_run     BOOLEAN NOT NULL,
    n_pending   INTEGER NOT NULL DEFAULT 0,
    n_running   INTEGER NOT NULL DEFAULT 0,
    n_decisions INTEGER NOT NULL DEFAULT 0,
    n_applied   INTEGER NOT NULL DEFAULT 0,
    n_errors    INTEGER NOT NULL DEFAULT 0,
    status      TEXT    NOT NULL,  -- 'ok', 'failed', 'acting' or 'interrupted'
    error       TEXT
);

-- Every state change the controller saw; the first sighting has from_state NULL. "at" is the job's
-- own time for the new state where Slurm reports one (submit, start, end), else the tick's time.
CREATE TABLE IF NOT EXISTS state_transitions (
    id         INTEGER NOT NULL PRIMARY KEY,
    job_id     INTEGER NOT NULL REFERENCES jobs (job_id),
    tick_id    INTEGER NOT NULL REFERENCES ticks (tick_id),
    at         REAL    NOT NULL,
    from_state TEXT,
    to_state   TEXT    NOT NULL,
    reason     TEXT  -- Slurm's Reason, or 'vanished'
);
CREATE INDEX IF NOT EXISTS ix_state_transitions_job_id ON state_transitions (job_id);

-- Every decision the policy made, whether applied or not. The config columns are the ExecConfig
-- fields (tp = tensor_model_parallel_size, pp = pipeline_model_parallel_size, dp = data-parallel
-- size, cp = context_parallel_size, vp = virtual pipeline stages).
CREATE TABLE IF NOT EXISTS decisions (
    id                                INTEGER NOT NULL PRIMARY KEY,
    tick_id                           INTEGER NOT NULL REFERENCES ticks (tick_id),
    job_id                            INTEGER NOT NULL REFERENCES jobs (job_id),
    at                                REAL    NOT NULL,
    kind                              TEXT    NOT NULL,           -- the levers moved, e.g.
                                                                  -- 'resize+site_factor', 'none'
    config                            TEXT,                       -- ExecConfig.short(), e.g.
                                                                  -- '8gpu=1x8 tp1 pp4 dp2 mbs1 M16'
    tp                                INTEGER,
    pp                                INTEGER,
    dp                                INTEGER,
    cp                                INTEGER,
    vp                                INTEGER,
    micro_batch_size                  INTEGER,
    num_micro_batches                 INTEGER,
    num_nodes                         INTEGER,
    gpus_per_node                     INTEGER,
    decoder_first_pipeline_num_layers INTEGER,
    decoder_last_pipeline_num_layers  INTEGER,
    gpus                              INTEGER,
    site_factor                       INTEGER,
    time_limit_s                      INTEGER,
    requeue                           BOOLEAN NOT NULL,
    hold                              BOOLEAN,                    -- 1 hold, 0 release (the
                                                                  -- controller's own hold)
    partition                         TEXT,                       -- moved to this partition (a
                                                                  -- mixed cluster)
    reason                            TEXT,
    predicted_start_s                 REAL,
    predicted_end_s                   REAL,
    intended                          BOOLEAN NOT NULL,           -- moves any lever
    applied                           BOOLEAN,                    -- 1 applied, 0 failed (see
                                                                  -- error), NULL not attempted (a
                                                                  -- dry run, or the same as the
                                                                  -- decision last applied)
    error                             TEXT,
    awaiting_outcome                  BOOLEAN NOT NULL DEFAULT 0  -- 1: written before Slurm was
                                                                  -- changed, outcome not known yet
);
CREATE INDEX IF NOT EXISTS ix_decisions_job_id ON decisions (job_id);
CREATE INDEX IF NOT EXISTS ix_decisions_tick_id ON decisions (tick_id);

-- Estimator bias per job class: ratio = exp(log_ratio), log_ratio = robust mean of ln(actual run_s
-- / predicted run_s) over n_jobs finished jobs.
CREATE TABLE IF NOT EXISTS calibration (
    job_class  TEXT    NOT NULL PRIMARY KEY,
    n_jobs     INTEGER NOT NULL,
    log_ratio  REAL    NOT NULL,
    ratio      REAL    NOT NULL,
    updated_at REAL    NOT NULL
);

-- What the launcher measured of a job (submit/iterlog.py: Megatron's iteration lines), as the
-- controller accepted it (slurm/measured.py): median seconds per iteration after the warm-up, of
-- the layout that ran, beside the cost model's uncalibrated prediction for that layout. A claim
-- about this job only: status is 'ok' or why it is not learned from.
CREATE TABLE IF NOT EXISTS measurements (
    job_id           INTEGER NOT NULL PRIMARY KEY REFERENCES jobs (job_id),
    user             TEXT,
    job_class        TEXT,
    config           TEXT,              -- ExecConfig.short() of the layout that ran
    tp               INTEGER,
    pp               INTEGER,
    micro_batch_size INTEGER,
    vp               INTEGER,
    iter_s           REAL,              -- measured median s per iteration
    predicted_iter_s REAL,              -- the cost model's, uncalibrated
    iterations       INTEGER,           -- the last iteration the launcher saw
    status           TEXT    NOT NULL,  -- 'ok', or why not learned from: 'out of bounds', 'not its
                                        -- user's file', ...
    reported_at      REAL    NOT NULL,  -- when the launcher wrote it (the file's mtime)
    own_layout       INTEGER            -- 1: the user's own layout ran, 0: another (NULL: recorded
                                        -- before this column)
);

-- Cluster occupancy seen by each tick (utilisation over time).
CREATE TABLE IF NOT EXISTS tick_snapshots (
    tick_id      INTEGER NOT NULL PRIMARY KEY REFERENCES ticks (tick_id),
    at           REAL    NOT NULL,
    n_nodes      INTEGER NOT NULL,
    total_gpus   INTEGER NOT NULL,  -- on usable nodes only
    free_gpus    INTEGER NOT NULL,
    busy_gpus    INTEGER NOT NULL,  -- total_gpus - free_gpus
    pending_gpus INTEGER NOT NULL,  -- the GPUs pending jobs ask for (demand)
    n_pending    INTEGER NOT NULL,
    n_running    INTEGER NOT NULL
);

-- Which controller may act (one row, id 1): taken at the start of every live tick with a
-- conditional UPDATE, so two controllers sharing this history never act in the same tick.
CREATE TABLE IF NOT EXISTS controller_lease (
    id         INTEGER NOT NULL PRIMARY KEY,
    holder     TEXT,                       -- 'host pid N'; NULL when free
    taken_at   REAL,
    expires_at REAL    NOT NULL DEFAULT 0  -- epoch s; free once past
);
