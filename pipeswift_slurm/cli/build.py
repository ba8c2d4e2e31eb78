"""``pipeswift build-psbatch``: compile psbatch's fast front end (``fast/psbatch.c``).

A thin command over ``fast.build``: bad input (no compiler, an unwritable output path, a
Python that cannot import this package) is one error line and exit 2; a failing
compiler is one line and exit 1.
"""

from __future__ import annotations

import sys
from typing import Optional

import click

from pipeswift_slurm.cli.common import fail


@click.command("build-psbatch")
@click.option("--out", default="psbatch", show_default=True,
              help="Where to write the binary (a folder gets 'psbatch' in it); replaced atomically.")
@click.option("--cc", help="C compiler command [default: $CC, else musl-gcc when installed, then cc].")
@click.option("--python", "python", help="Interpreter that runs Megatron jobs' Python psbatch "
              "and its resident helper [default: this one, %s]." % (sys.executable or "?"))
@click.option("--helper/--no-helper", default=True, show_default=True,
              help="Whether the resident helper answers Megatron jobs when $PIPESWIFT_PSBATCH_HELPER "
              "does not say (off, 0, no or false: off; anything else: on).")
def build_psbatch(out: str, cc: Optional[str], python: Optional[str], helper: bool) -> None:
    """Compile psbatch's fast front end: a drop-in psbatch that costs sbatch's time plus
    well under a millisecond for jobs that are not Megatron jobs, and for common Megatron
    jobs, which it decides itself exactly as the Python psbatch would
    (PIPESWIFT_PSBATCH_FAST=off turns that off). Other Megatron jobs (and --pipeswift
    options it cannot judge) are decided by a per-user resident helper (started in the
    background the first time, gone after 10 idle minutes: python -m
    pipeswift_slurm.submit.helper status|stop), else by the Python psbatch. Install it on
    PATH as psbatch."""
    from pipeswift_slurm.submit.fast.build import BuildError, build_with

    try:
        path, how = build_with(out, cc=cc, python=python, helper=helper)
    except BuildError as exc:
        fail(str(exc), exc.code)
    click.echo("wrote %s (built with %s; Megatron jobs run %s%s)" % (
        path, " ".join(how), python or sys.executable, "" if helper else "; resident helper off"))
