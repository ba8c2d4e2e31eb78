-- Estimator bias per job class: actual run time / predicted run time.
--
-- Over completed jobs (COMPLETED, or COMPLETED? with an estimated end) that have both a run
-- time and the controller's last prediction for the config they ran with. A ratio above 1
-- means jobs ran longer than predicted. A class whose median is far from 1 gets false
-- priorities until calibration corrects it; calibrated_ratio is what the controller currently
-- applies (calibration table), calibrated_on its number of jobs. The median is nearest-rank
-- (the lower middle value for an even count).
--
-- Run: sqlite3 -header -column /var/lib/pipeswift/pipeswift.sqlite < sql/estimator_bias.sql
--      psql -X -d pipeswift -f sql/estimator_bias.sql
-- Written by `pipeswift report sql estimator_bias` from the reports' own query
-- (pipeswift_slurm/store/reads.py): the same figures as `pipeswift report`.
WITH report AS (
    WITH ratios AS (
        SELECT COALESCE(NULLIF(job_class, ''), '(none)') AS job_class,
               run_s / predicted_run_s                  AS ratio
        FROM jobs
        WHERE state IN ('COMPLETED', 'COMPLETED?')
          AND run_s > 0
          AND predicted_run_s > 0
    ), ranked AS (
        SELECT job_class, ratio,
               ROW_NUMBER() OVER (PARTITION BY job_class ORDER BY ratio) AS rank_,
               COUNT(*) OVER (PARTITION BY job_class)                    AS n
        FROM ratios
    )
    SELECT r.job_class                                          AS job_class,
           COUNT(*)                                             AS n_jobs,
           AVG(r.ratio)                                         AS mean_ratio,
           MAX(CASE WHEN r.rank_ = (r.n + 1) / 2 THEN r.ratio END) AS median_ratio,
           MIN(r.ratio)                                         AS min_ratio,
           MAX(r.ratio)                                         AS max_ratio,
           MAX(c.ratio)                                         AS calibrated_ratio,
           MAX(c.n_jobs)                                        AS calibrated_on
    FROM ranked AS r
    LEFT JOIN calibration AS c ON c.job_class = r.job_class
    GROUP BY r.job_class
    ORDER BY r.job_class
)
SELECT job_class,
       n_jobs,
       ROUND(CAST(mean_ratio AS NUMERIC), 4) AS mean_ratio,
       ROUND(CAST(median_ratio AS NUMERIC), 4) AS median_ratio,
       ROUND(CAST(min_ratio AS NUMERIC), 4) AS min_ratio,
       ROUND(CAST(max_ratio AS NUMERIC), 4) AS max_ratio,
       ROUND(CAST(calibrated_ratio AS NUMERIC), 4) AS calibrated_ratio,
       calibrated_on
FROM report
ORDER BY job_class;
