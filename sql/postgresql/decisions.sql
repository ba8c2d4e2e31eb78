-- The 50 latest decisions that moved a lever (resize, SiteFactor, time limit, requeue),
-- newest first, with what became of them (applied / FAILED / not applied).
-- PostgreSQL variant of ../decisions.sql (same columns, same rows).
--
-- Run: psql -X -d pipeswift -f sql/postgresql/decisions.sql
SELECT
    d.id,
    d.tick_id,
    to_char(to_timestamp(d.at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS at_utc,
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
