"""``python -m pipeswift_slurm.cli``: the ``pipeswift`` command."""

from pipeswift_slurm.cli.main import main

main()
