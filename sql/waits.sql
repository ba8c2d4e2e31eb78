-- Waits and starvation by job size class, still-pending jobs included.
--
-- A started job's wait is its queue_s (start - eligible-or-submit). A job still PENDING
-- has waited (now - eligible-or-submit) so far, where "now" is the last controller tick
-- (so the query also works on a simulated history). max_wait_job_id names the job with
-- the longest wait in its class; n_over_48h counts waits above 48 h (172800 s, the
-- pipeswift policy's default wait_bound_s: edit the constant to match a site's own). Size class 'unknown': no run time known yet.
--
-- Run: sqlite3 -header -column /var/lib/pipeswift/pipeswift.sqlite < sql/waits.sql
WITH now_ AS (
    SELECT MAX(started_at) AS t FROM ticks
), waits AS (
    SELECT job_id,
           COALESCE(size_class, 'unknown') AS size_class,
           CASE WHEN start_time IS NOT NULL THEN queue_s
                ELSE (SELECT t FROM now_) - COALESCE(eligible_time, submit_time)
           END                             AS wait_s,
           start_time IS NULL              AS still_pending
    FROM jobs
    WHERE start_time IS NOT NULL OR state = 'PENDING'
)
SELECT
    size_class,
    COUNT(*)                          AS n_jobs,
    SUM(still_pending)                AS n_pending,
    ROUND(AVG(wait_s) / 3600.0, 3)    AS mean_wait_h,
    ROUND(MAX(wait_s) / 3600.0, 3)    AS max_wait_h,
    job_id                            AS max_wait_job_id,  -- SQLite: taken from the MAX() row
    SUM(wait_s > 172800)              AS n_over_48h
FROM waits
GROUP BY size_class
ORDER BY max_wait_h DESC, size_class;
