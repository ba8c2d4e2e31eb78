"""pipeswift-slurm: joint queue order and pipeline configuration for Megatron jobs on Slurm."""

__version__ = "0.1.0"
