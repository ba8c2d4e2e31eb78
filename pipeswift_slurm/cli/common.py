"""What every command shares: the context object, one-line failures, JSON output and the
measured layer profile option. Imports nothing from the command modules or the group.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

import click

from pipeswift_slurm.core.files import plain_or_absent, starts_as_sqlite
from pipeswift_slurm.core.hardware import GpuType, HardwareError, get_gpu_type

EXIT_USAGE = 2


class Obj:
    """Context object shared by every command: logging and the hardware file."""

    def __init__(self, verbose: int, hardware: Optional[str]):
        self.verbose = verbose
        self.hardware = hardware

    def gpu(self, name: str) -> GpuType:
        try:
            return get_gpu_type(name, self.hardware)
        except HardwareError as exc:  # the name is unknown, or the --hardware file is bad (it names itself)
            fail(str(exc) if self.hardware and str(exc).startswith(str(self.hardware)) else "--gpu-type: %s" % exc)


pass_obj = click.make_pass_decorator(Obj)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """One clear error line on stderr and a non-zero exit, never a traceback."""
    click.echo("pipeswift: error: %s" % message, err=True)
    sys.exit(code)


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf`` (click lets both through
    its bounds: ``nan`` compares false with any bound, so ``--load nan`` once hung a run)."""

    name = "finite float range"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail("%r is not a finite number" % value, param, ctx)
        return number


def output_file(path: str, what: str, inputs: Sequence[Optional[str]] = (), database: bool = False) -> Path:
    """``path`` as a file this command will write, checked before any work: its folder must
    exist, be a folder and be writable, and it must not be one of the command's ``inputs``
    nor (unless the output is a ``database``) a SQLite database, such as the history a
    report reads (else one line, exit 2). ``what`` names the option."""
    if not path.strip():
        fail("%s %r: give a file name" % (what, path))  # an empty value is no "option not given"
    target = Path(path)
    if not database and _is_sqlite(target):
        fail("%s %s: is a SQLite database (a history?); it is left alone: give another file name" % (what, path))
    if any(source and _same_file(target, Path(source)) for source in inputs):
        fail("%s %s: is this command's input or another of its outputs; give another file name" % (what, path))
    folder = target.parent
    if not folder.is_dir():
        fail("%s %s: the folder %s %s; give a path in an existing folder"
             % (what, path, folder, "is not a folder" if folder.exists() else "does not exist"))
    if target.is_dir():
        fail("%s %s: is a folder; give a file name" % (what, path))
    if not plain_or_absent(target):  # what write_atomic refuses, said before any work
        fail("%s %s: is not a plain file (a device or a FIFO); give a file name" % (what, path))
    if not os.access(folder, os.W_OK | os.X_OK):
        fail("%s %s: the folder %s is not writable; give a path in a folder you can write" % (what, path, folder))
    return target


def _is_sqlite(path: Path) -> bool:
    try:
        return starts_as_sqlite(path)
    except OSError:  # nothing there, or unreadable: not a database this command could lose
        return False


def _same_file(a: Path, b: Path) -> bool:
    """One file, whether or not it exists yet (a link, or another name of the same path)."""
    try:
        return os.path.samefile(a, b) if a.exists() and b.exists() else a.resolve() == b.resolve()
    except OSError:
        return False


def error_reason(exc: BaseException) -> str:
    """The first line of a database error's reason (the driver's own message, under
    SQLAlchemy's wrapper), else the exception's type name: what one error line quotes."""
    lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def open_store(url: str, *, reader: bool = False, journal_mode: str = "DELETE") -> Any:
    """The history Store at ``url`` (a SQLite file path or SQLAlchemy URL), for writing or,
    with ``reader``, read-only. A URL whose driver is missing (one line naming what to
    install), that SQLAlchemy cannot read, or whose server cannot be reached: exit 2."""
    from sqlalchemy.exc import SQLAlchemyError

    from pipeswift_slurm.store.history import Store, StoreUnavailable, shown_url

    try:
        return Store.reader(url) if reader else Store.from_url(url, journal_mode=journal_mode)
    except StoreUnavailable as exc:
        fail(str(exc))
    except SQLAlchemyError as exc:
        fail("cannot open the history at %s: %s" % (shown_url(url), error_reason(exc)))


def echo_json(data: Any) -> None:
    from pipeswift_slurm.core.fmt import json_text

    click.echo(json_text(data, indent=2, sort_keys=False))

def load_layer_profile(path: Optional[str], gpu: Optional[GpuType] = None, job: Any = None,
                       what: str = "--layer-profile") -> Any:
    """A measured layer profile (``pipeswift profile --out``) or None; a bad file, or one not
    measured on ``gpu`` (and, given ``job``, in its precision and layer shape) -> exit 2."""
    if not path:
        return None
    from pipeswift_slurm.core.layer_profile import layer_profile_mismatch, layer_profile_refusal
    from pipeswift_slurm.core.profile_file import ProfileFormatError, read_profile_toml

    try:
        loaded = read_profile_toml(path)
    except (OSError, ProfileFormatError) as exc:
        fail("%s: %s" % (what, exc))
    reason = layer_profile_mismatch(loaded, gpu.name, job) if gpu else None
    if gpu and reason:
        fail("%s %s" % (what, layer_profile_refusal(loaded, reason, gpu.name)))
    return loaded


layer_profile_option = click.option("--layer-profile", type=click.Path(dir_okay=False),
                                     help="Use this measured layer profile (pipeswift profile --out) for the"
                                          " layer times instead of the table.")


def hand_over_history(store: Any) -> None:
    """A simulation's history, written fast in WAL mode, handed over in the rollback-journal
    mode: readers (``report``, ``explain``, ``simulate --history``) open it read-only and
    then leave no ``-wal`` or ``-shm`` file beside it."""
    store.engine.dispose()  # the pool's other connections: the switch needs the only one
    raw = store.engine.raw_connection()  # outside a transaction, where the switch is allowed
    try:
        raw.cursor().execute("PRAGMA journal_mode=DELETE")
    finally:
        raw.close()
    store.engine.dispose()
