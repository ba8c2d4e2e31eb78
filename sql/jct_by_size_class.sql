-- Job completion time (JCT) by job size class: mean, P50, P95, P99 and max, in hours.
--
-- JCT = end_time - submit_time (what the user waits for), over jobs that completed (state
-- COMPLETED, or COMPLETED? when the job vanished from the queue and its end was taken as the
-- first tick it was gone). Size classes are by GPU-hours: small < 4, medium < 32, large >= 32
-- (pipeswift_slurm.store.schema.size_class). Percentiles are nearest-rank: the value at rank
-- ceil(p * n) in ascending order.
--
-- Run: sqlite3 -header -column /var/lib/pipeswift/pipeswift.sqlite < sql/jct_by_size_class.sql
--      psql -X -d pipeswift -f sql/jct_by_size_class.sql
-- Written by `pipeswift report sql jct_by_size_class` from the reports' own query
-- (pipeswift_slurm/store/reads.py): the same figures as `pipeswift report`.
WITH report AS (
    WITH finished AS (
        SELECT COALESCE(size_class, 'unknown') AS grp, end_time - submit_time AS jct_s, queue_s
        FROM jobs
        WHERE state IN ('COMPLETED', 'COMPLETED?')
          AND start_time IS NOT NULL
          AND end_time IS NOT NULL
          AND submit_time IS NOT NULL
    ), ranked AS (
        SELECT grp, jct_s, queue_s,
               ROW_NUMBER() OVER (PARTITION BY grp ORDER BY jct_s) AS rank_,
               COUNT(*) OVER (PARTITION BY grp)                    AS n
        FROM finished
    )
    SELECT grp,
           COUNT(*)                                                AS n_jobs,
           AVG(jct_s)                                              AS mean_s,
           MAX(CASE WHEN rank_ = (n + 1) / 2 THEN jct_s END)        AS p50_s,
           MAX(CASE WHEN rank_ = (95 * n + 99) / 100 THEN jct_s END) AS p95_s,
           MAX(CASE WHEN rank_ = (99 * n + 99) / 100 THEN jct_s END) AS p99_s,
           MAX(jct_s)                                              AS max_s,
           AVG(queue_s)                                            AS mean_queue_s
    FROM ranked
    GROUP BY grp
)
SELECT grp AS size_class,
       n_jobs,
       ROUND(CAST(mean_s / 3600.0 AS NUMERIC), 3) AS mean_jct_h,
       ROUND(CAST(p50_s / 3600.0 AS NUMERIC), 3) AS p50_jct_h,
       ROUND(CAST(p95_s / 3600.0 AS NUMERIC), 3) AS p95_jct_h,
       ROUND(CAST(p99_s / 3600.0 AS NUMERIC), 3) AS p99_jct_h,
       ROUND(CAST(max_s / 3600.0 AS NUMERIC), 3) AS max_jct_h,
       ROUND(CAST(mean_queue_s / 3600.0 AS NUMERIC), 3) AS mean_queue_h
FROM report
ORDER BY CASE grp WHEN 'small' THEN 0 WHEN 'medium' THEN 1 WHEN 'large' THEN 2 ELSE 3 END;
