-- Waits and starvation by job size class, still-pending jobs included.
--
-- A started job's wait is its queue_s (start - eligible-or-submit, less the runs before a
-- requeue: ran_s). A job still PENDING has waited (now - eligible-or-submit - ran_s) so far,
-- where "now" is the last controller tick
-- (so the query also works on a simulated history). max_wait_job_id names the job with
-- the longest wait in its class; n_over_48h counts waits above 48 h (172800 s, the
-- pipeswift policy's default wait_bound_s: edit the constant to match a site's own).
-- Size class 'unknown': no run time known yet.
--
-- Run: sqlite3 -header -column /var/lib/pipeswift/pipeswift.sqlite < sql/waits.sql
--      psql -X -d pipeswift -f sql/waits.sql
WITH now_ AS (
    SELECT MAX(started_at) AS t FROM ticks
), waits AS (
    SELECT job_id,
           COALESCE(size_class, 'unknown') AS size_class,
           CASE WHEN start_time IS NOT NULL THEN queue_s
                ELSE (SELECT t FROM now_) - COALESCE(eligible_time, submit_time) - ran_s
           END                             AS wait_s,
           CASE WHEN start_time IS NULL THEN 1 ELSE 0 END AS still_pending
    FROM jobs
    WHERE start_time IS NOT NULL OR state = 'PENDING'
), ranked AS (
    SELECT waits.*,
           ROW_NUMBER() OVER (PARTITION BY size_class ORDER BY wait_s DESC NULLS LAST, job_id DESC) AS rank_
    FROM waits
)
SELECT
    size_class,
    COUNT(*)                                                   AS n_jobs,
    SUM(still_pending)                                         AS n_pending,
    ROUND(CAST(AVG(wait_s) / 3600.0 AS NUMERIC), 3)            AS mean_wait_h,
    ROUND(CAST(MAX(wait_s) / 3600.0 AS NUMERIC), 3)            AS max_wait_h,
    MAX(CASE WHEN rank_ = 1 THEN job_id END)                   AS max_wait_job_id,
    SUM(CASE WHEN wait_s > 172800 THEN 1 ELSE 0 END)           AS n_over_48h
FROM ranked
GROUP BY size_class
ORDER BY max_wait_h DESC, size_class;
