"""``pipeswift build-psbatch``: compile psbatch's fast front end (``fast/psbatch.c``).

A thin command over ``fast.build``: bad input (no compiler, an unwritable output path, a
Python that cannot import this package) is one error line and exit 2; a failing
compiler is one line and exit 1.
"""

from __future__ import annotations

import sys
from typing import Optional

import click

from .cli import fail, pipeswift


@pipeswift.command("build-psbatch")
@click.option("--out", default="psbatch", show_default=True,
              help="Where to write the binary (a folder gets 'psbatch' in it); replaced atomically.")
@click.option("--cc", help="C compiler command [default: $CC, else cc].")
@click.option("--python", "python", help="Interpreter that runs Megatron jobs' Python psbatch "
              "[default: this one, %s]." % (sys.executable or "?"))
def build_psbatch(out: str, cc: Optional[str], python: Optional[str]) -> None:
    """Compile psbatch's fast front end: a drop-in psbatch that costs sbatch's time plus
    well under a millisecond for jobs that are not Megatron jobs, and hands Megatron jobs
    (and --pipeswift options) to the Python psbatch. Install it on PATH as psbatch."""
    from .fast.build import BuildError, build

    try:
        path = build(out, cc=cc, python=python)
    except BuildError as exc:
        fail(str(exc), exc.code)
    click.echo("wrote %s (Megatron jobs run %s)" % (path, python or sys.executable))
