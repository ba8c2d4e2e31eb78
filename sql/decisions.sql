-- The 50 latest decisions that moved a lever (resize, SiteFactor, time limit, requeue),
-- newest first, with what became of them:
--   applied     the backend applied it
--   FAILED      the backend refused it (see error)
--   not applied not attempted: dry run, or the same as the decision already applied
-- Decisions that changed nothing (kind 'none') are left out; drop the WHERE to see them.
--
-- Run: sqlite3 -header -column /var/lib/pipeswift/pipeswift.sqlite < sql/decisions.sql
--      psql -X -d pipeswift -f sql/decisions.sql
SELECT
    d.id,
    d.tick_id,
    datetime(d.at, 'unixepoch')                       AS at_utc,
    d.job_id,
    j."user",
    d.kind,
    d.config,
    d.gpus,
    d.site_factor,
    d.time_limit_s,
    CASE WHEN d.applied THEN 'applied'
         WHEN NOT d.applied THEN 'FAILED'
         ELSE 'not applied' END                       AS outcome,
    d.error,
    d.reason
FROM decisions AS d
LEFT JOIN jobs AS j ON j.job_id = d.job_id
WHERE d.intended
ORDER BY d.id DESC
LIMIT 50;
