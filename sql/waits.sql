-- Waits and starvation by job size class, still-pending jobs included, in hours.
--
-- A started job's wait is its queue_s (start - eligible-or-submit, less the runs before a
-- requeue: ran_s). A job still PENDING has waited (now - eligible-or-submit - ran_s) so far,
-- where "now" is the last controller tick (so the query also works on a simulated history).
-- max_wait_job_id names the job with the longest wait in its class (the lowest id on ties);
-- n_over_48h counts waits above 48 h (172800 s, the pipeswift policy's default wait_bound_s:
-- `pipeswift report waits --wait-bound-h H` counts over a site's own). Size class 'unknown':
-- no run time known yet.
--
-- Run: sqlite3 -header -column /var/lib/pipeswift/pipeswift.sqlite < sql/waits.sql
--      psql -X -d pipeswift -f sql/waits.sql
-- Written by `pipeswift report sql waits` from the reports' own query
-- (pipeswift_slurm/store/reads.py): the same figures as `pipeswift report`.
WITH report AS (
    WITH waits AS (
        SELECT job_id,
               COALESCE(size_class, 'unknown')                         AS grp,
               CASE WHEN start_time IS NOT NULL THEN queue_s
                    WHEN wait_origin_time >= (SELECT MAX(started_at) FROM ticks) THEN 0.0  -- not eligible yet (a begin time ahead)
                    ELSE (SELECT MAX(started_at) FROM ticks) - wait_origin_time
               END                             AS wait_s,
               CASE WHEN start_time IS NULL THEN 1 ELSE 0 END AS still_pending
        FROM jobs
        WHERE (start_time IS NOT NULL OR state = 'PENDING')
    ), ranked AS (
        SELECT job_id, grp, wait_s, still_pending,
               ROW_NUMBER() OVER (PARTITION BY grp ORDER BY wait_s, job_id DESC) AS rank_,
               COUNT(*) OVER (PARTITION BY grp) AS n
        FROM waits
        WHERE wait_s IS NOT NULL
    )
    SELECT grp,
           COUNT(*)                                               AS n_jobs,
           SUM(still_pending)                                     AS n_pending,
           AVG(wait_s)                                            AS mean_s,
           MAX(CASE WHEN rank_ = (n + 1) / 2 THEN wait_s END)      AS median_s,
           MAX(wait_s)                                            AS max_s,
           MAX(CASE WHEN rank_ = n THEN job_id END)               AS max_job_id,  -- lowest id on ties
           SUM(CASE WHEN wait_s > 172800 THEN 1 ELSE 0 END)       AS n_over_bound,
           SUM(CASE WHEN still_pending = 1 AND wait_s > 172800 THEN 1 ELSE 0 END) AS n_pending_over_bound
    FROM ranked
    GROUP BY grp
)
SELECT grp AS size_class,
       n_jobs,
       n_pending,
       ROUND(CAST(mean_s / 3600.0 AS NUMERIC), 3) AS mean_wait_h,
       ROUND(CAST(median_s / 3600.0 AS NUMERIC), 3) AS median_wait_h,
       ROUND(CAST(max_s / 3600.0 AS NUMERIC), 3) AS max_wait_h,
       max_job_id AS max_wait_job_id,
       n_over_bound AS n_over_48h,
       n_pending_over_bound AS n_pending_over_48h
FROM report
ORDER BY max_wait_h DESC, size_class;
