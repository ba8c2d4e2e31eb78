-- The 50 latest decisions that moved a lever (resize, SiteFactor, time limit, requeue, hold),
-- newest first, with what became of them:
--   applied     the backend applied it
--   FAILED      the backend refused it (see error)
--   not applied not attempted: dry run, or the same as the decision already applied
-- Decisions that changed nothing (kind 'none') are left out: change "0 = 1" to "1 = 1" to
-- see them.
--
-- Run: sqlite3 -header -column /var/lib/pipeswift/pipeswift.sqlite < sql/decisions.sql
--      psql -X -d pipeswift -f sql/decisions.sql
-- Written by `pipeswift report sql decisions` from the reports' own query
-- (pipeswift_slurm/store/reads.py): the same figures as `pipeswift report`.
WITH report AS (
    SELECT d.id, d.tick_id, d.at, d.job_id, j."user", d.kind, d.config, d.gpus, d.site_factor,
           d.time_limit_s,
           CASE WHEN d.applied = TRUE THEN 'applied'
                WHEN d.applied = FALSE THEN 'FAILED'
                ELSE 'not applied' END AS outcome,
           d.error, d.reason, d.predicted_start_s, d.predicted_end_s
    FROM decisions AS d
    LEFT JOIN jobs AS j ON j.job_id = d.job_id
    WHERE (0 = 1 OR d.intended = TRUE)
    ORDER BY d.id DESC
    LIMIT 50
)
SELECT id,
       tick_id,
       datetime(at, 'unixepoch') AS at_utc,
       job_id,
       "user",
       kind,
       config,
       gpus,
       site_factor,
       time_limit_s,
       outcome,
       error,
       reason
FROM report
ORDER BY id DESC;
