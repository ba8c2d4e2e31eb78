"""The core: pure rules and models, no I/O.

Owns the job and config model (``model``), Megatron's rules (``megatron``: parse, render,
validate, enumerate), the GPU table (``hardware``), the cost model, the planner, the estimator
and calibration, the profile and decision tokens (``token``) and plain formatting (``fmt``).
Imports nothing outside ``pipeswift_slurm.core`` (enforced by import-linter, see setup.cfg).
"""
