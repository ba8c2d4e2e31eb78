-- Job completion time (JCT) by job size class: mean, P50, P99 and max.
--
-- JCT = end_time - submit_time (what the user waits for), over jobs that completed
-- (state COMPLETED, or COMPLETED? when the job vanished from the queue and its end
-- was taken as the first tick it was gone). Size classes are by GPU-hours:
-- small < 4, medium < 32, large >= 32 (pipeswift_slurm.store.schema.size_class).
-- Percentiles are nearest-rank: the value at rank ceil(p * n) in ascending order.
--
-- Run: sqlite3 -header -column /var/lib/pipeswift/pipeswift.sqlite < sql/jct_by_size_class.sql
--      psql -X -d pipeswift -f sql/jct_by_size_class.sql
WITH finished AS (
    SELECT COALESCE(size_class, 'unknown') AS size_class,
           end_time - submit_time          AS jct_s,
           queue_s
    FROM jobs
    WHERE state IN ('COMPLETED', 'COMPLETED?')
      AND start_time IS NOT NULL
      AND end_time IS NOT NULL
      AND submit_time IS NOT NULL
), ranked AS (
    SELECT size_class, jct_s, queue_s,
           ROW_NUMBER() OVER (PARTITION BY size_class ORDER BY jct_s) AS rank_,
           COUNT(*) OVER (PARTITION BY size_class)                    AS n
    FROM finished
)
SELECT
    size_class,
    COUNT(*)                                                              AS n_jobs,
    ROUND(CAST(AVG(jct_s) / 3600.0 AS NUMERIC), 3)                                         AS mean_jct_h,
    ROUND(CAST(MAX(CASE WHEN rank_ = (n + 1) / 2 THEN jct_s END) / 3600.0 AS NUMERIC), 3)         AS p50_jct_h,
    ROUND(CAST(MAX(CASE WHEN rank_ = (99 * n + 99) / 100 THEN jct_s END) / 3600.0 AS NUMERIC), 3) AS p99_jct_h,
    ROUND(CAST(MAX(jct_s) / 3600.0 AS NUMERIC), 3)                                         AS max_jct_h,
    ROUND(CAST(AVG(queue_s) / 3600.0 AS NUMERIC), 3)                                       AS mean_queue_h
FROM ranked
GROUP BY size_class
ORDER BY CASE size_class WHEN 'small' THEN 0 WHEN 'medium' THEN 1 WHEN 'large' THEN 2 ELSE 3 END;
