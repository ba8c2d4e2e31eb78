-- Queue-time ratio per hour: is the bottleneck the queue or the pipeline?
--
-- For jobs submitted in each hour (UTC) that have started and ended:
--   queue_ratio    = total queue time / total (queue + run) time of those jobs
--   mean_job_ratio = average over jobs of queue_s / (queue_s + run_s)
-- queue_s counts from eligibility (or submission) to start, run_s from start to end, so
-- queue_s + run_s is the job completion time (JCT) as the scheduler can influence it (a
-- requeued job: its time not running, and its latest run; its earlier runs are ran_s).
-- A ratio near 1 means jobs mostly wait; near 0, they mostly run.
--
-- Run: sqlite3 -header -column /var/lib/pipeswift/pipeswift.sqlite < sql/queue_ratio_by_hour.sql
--      psql -X -d pipeswift -f sql/queue_ratio_by_hour.sql
-- Written by `pipeswift report sql queue_ratio_by_hour` from the reports' own query
-- (pipeswift_slurm/store/reads.py): the same figures as `pipeswift report`.
WITH report AS (
    SELECT strftime('%Y-%m-%d %H:00', submit_time, 'unixepoch')                                             AS grp,
           COUNT(*)                                            AS n_jobs,
           COALESCE(SUM(queue_s), 0)                           AS queue_s,
           COALESCE(SUM(run_s), 0)                             AS run_s,
           SUM(queue_s) / NULLIF(SUM(queue_s + run_s), 0)      AS queue_ratio,
           AVG(queue_s / NULLIF(queue_s + run_s, 0))           AS mean_job_ratio
    FROM jobs
    WHERE queue_s IS NOT NULL
      AND run_s IS NOT NULL
      AND submit_time IS NOT NULL
    GROUP BY grp
)
SELECT grp AS hour_utc,
       n_jobs,
       ROUND(CAST(queue_s / 3600.0 AS NUMERIC), 3) AS queue_h,
       ROUND(CAST(run_s / 3600.0 AS NUMERIC), 3) AS run_h,
       ROUND(CAST(queue_ratio AS NUMERIC), 4) AS queue_ratio,
       ROUND(CAST(mean_job_ratio AS NUMERIC), 4) AS mean_job_ratio
FROM report
ORDER BY hour_utc;
