"""Work memoised per profile object (``core/memo.py``) is forgotten with the profile: a
controller that runs for weeks, or a simulation of many ticks, makes new profiles at every
tick, and a memo that kept them grew without end (6,000 jobs submitted at once: 445 MB)."""

from __future__ import annotations

import gc
from dataclasses import replace

from pipeswift_slurm.core.memo import per_profile
from pipeswift_slurm.core.megatron import profile_from_argv

ARGV = ["--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "1024",
        "--micro-batch-size", "1", "--global-batch-size", "16", "--train-iters", "10"]


def test_an_entry_lives_as_long_as_its_profile() -> None:
    memo: dict = {}
    made = []
    profile = profile_from_argv(ARGV, world_size=4)
    assert per_profile(memo, profile, lambda p: made.append(p) or len(made)) == 1
    assert per_profile(memo, profile, lambda p: made.append(p) or len(made)) == 1  # once per object
    made.clear()
    for factor in range(2, 1002):  # a new profile object per tick, as the controller makes them
        per_profile(memo, replace(profile, run_time_factor=float(factor)), lambda p: 0)
    gc.collect()
    assert list(memo) == [id(profile)]
    del profile
    gc.collect()
    assert memo == {}
