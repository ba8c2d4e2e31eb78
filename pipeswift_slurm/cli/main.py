"""The ``pipeswift`` command group: thin click commands that parse options, call the
library and format the result. All diagnostics go to stderr; bad input is one line and
exit code 2; cron-facing commands exit non-zero only on real failures.

The group adds the commands of its modules (``model``, ``controller``, ``sim``, ``report``,
``build``); they never import the group. Heavy or optional imports (SQLAlchemy, torch,
matplotlib, Slurm backends) happen inside the commands that need them, so ``pipeswift --help``
and ``pipeswift plan`` start fast.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional, Sequence

import click

from pipeswift_slurm.cli import build, controller, demo, model, report, sim
from pipeswift_slurm.cli.common import Obj, fail


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-vv for debug).")
@click.option("--hardware", envvar="PIPESWIFT_HARDWARE", type=click.Path(dir_okay=False),
              help="TOML file overriding/extending the GPU table [env PIPESWIFT_HARDWARE].")
@click.version_option(package_name="pipeswift-slurm")
@click.pass_context
def pipeswift(ctx: click.Context, verbose: int, hardware: Optional[str]) -> None:
    """Cut job completion time of pipeline-parallel Megatron jobs on Slurm."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx.obj = Obj(verbose, hardware)


for _command in (model.estimate, model.plan, model.profile, controller.controller, sim.simulate, demo.demo,
                 report.report, report.explain, build.build_psbatch):
    pipeswift.add_command(_command)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console-script entry point."""
    try:
        pipeswift.main(args=list(argv) if argv is not None else None, prog_name="pipeswift",
                       standalone_mode=False)
    except click.UsageError as exc:
        hint = " (see '%s --help')" % exc.ctx.command_path if exc.ctx is not None else ""
        fail("%s%s" % (exc.format_message(), hint))
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except click.Abort:
        fail("aborted", 1)
