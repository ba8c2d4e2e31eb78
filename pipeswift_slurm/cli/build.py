"""``pipeswift build-psbatch``: compile psbatch's front end (``submit/fast/psbatch.c``) by hand.

``pip install`` already builds it when a C compiler is there; this command is for a site
that installs the binary elsewhere or for another interpreter. A thin command over
``fast.build``: bad input (no compiler, an unwritable output path) is one error line and
exit 2; a failing compiler is one line and exit 1.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Optional

import click

from pipeswift_slurm.cli.common import fail


@click.command("build-psbatch")
@click.option("--out", default="psbatch", show_default=True,
              help="Where to write the binary (a folder gets 'psbatch' in it); replaced atomically.")
@click.option("--cc", help="C compiler command [default: $CC, else musl-gcc when installed, then cc].")
@click.option("--python", "python", help="Interpreter that runs the Python psbatch for Megatron jobs "
              "[default: this one, %s]." % (sys.executable or "?"))
def build_psbatch(out: str, cc: Optional[str], python: Optional[str]) -> None:
    """Compile psbatch's front end: a drop-in psbatch that costs sbatch's time plus well
    under a millisecond for jobs that are plainly not Megatron jobs (no --pipeswift option,
    no #PSWIFT line, no Megatron marker), and runs the Python psbatch for every other job
    (PIPESWIFT_PSBATCH_FAST=off: for every job). Install it on PATH as psbatch."""
    from pipeswift_slurm.submit.fast.build import BuildError, build

    try:
        path, how = build(out, cc=cc, python=python)
    except BuildError as exc:
        fail(str(exc), exc.code)
    click.echo("wrote %s (built with %s; Megatron jobs run %s)" % (path, " ".join(how), python or sys.executable))
    if python and not (os.path.isfile(python) and os.access(python, os.X_OK)) and not shutil.which(python):
        click.echo("pipeswift: warning: --python %s is no executable on this machine: where it is none, psbatch"
                   " submits every job as written (with a warning), opting none in" % python, err=True)
