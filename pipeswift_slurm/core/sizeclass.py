"""Job size classes by GPU-hours: one rule for the store, the reports and the simulator.
Pure: no imports beyond the standard library."""

from __future__ import annotations

from typing import Optional

# Size-class thresholds in GPU-hours (gpus * run_s / 3600). The seed's example sets the
# scale: two 2-GPU x 1 h jobs (2 GPU·h) are small, an 8-GPU x 4 h job (32 GPU·h) is large.
SMALL_MAX_GPU_H = 4.0
MEDIUM_MAX_GPU_H = 32.0
SIZE_CLASSES = ("small", "medium", "large")


def size_class(gpus: Optional[int], run_s: Optional[float]) -> Optional[str]:
    """Classify a job by the GPU-hours it uses.

    Thresholds (module constants): ``small`` below 4 GPU·h (e.g. 2 GPUs x 1 h),
    ``medium`` from 4 up to below 32 GPU·h (e.g. 8 GPUs x 2 h), ``large`` from 32 GPU·h
    (e.g. 8 GPUs x 4 h, 64 GPUs x 30 min).

    Args:
        gpus: GPUs the job holds (total, all nodes).
        run_s: its run time in seconds (actual when finished, else predicted).

    Returns:
        "small", "medium" or "large"; None when either input is unknown.
    """
    if gpus is None or run_s is None:
        return None
    gpu_h = max(0, gpus) * max(0.0, run_s) / 3600.0
    if gpu_h < SMALL_MAX_GPU_H:
        return "small"
    if gpu_h < MEDIUM_MAX_GPU_H:
        return "medium"
    return "large"
