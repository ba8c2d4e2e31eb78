"""The history database opened for reading by ``pipeswift report``, ``explain`` and
``whatif``: read-only, so a user who may only read the file may run every report, and one
error line (exit 2) for a database that cannot be opened or holds values the reports cannot
read."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from pipeswift_slurm.cli.common import error_reason, fail


def open_history(db: str) -> Any:
    """The Store over ``db`` opened read-only (a user who may read the file may run every
    report); one error line (exit 2) when unusable."""
    from sqlalchemy.exc import SQLAlchemyError

    from pipeswift_slurm.reports.queries import has_history_tables
    from pipeswift_slurm.store.history import Store, StoreUnavailable, shown_url, sqlite_path

    path = sqlite_path(db)
    if path is not None:
        if path.is_dir():
            fail("--db %s: is a folder; give the history's file (e.g. %s)" % (path, path / "pipeswift.sqlite"))
        if not path.is_file():
            fail("no history database at %s (give --db FILE or set PIPESWIFT_DB)" % path)
    try:
        store = Store.reader(db)
        if not has_history_tables(store.engine):
            fail("%s is not a pipeswift history database (no jobs/ticks/decisions tables)" % shown_url(db))
        return store
    except StoreUnavailable as exc:
        fail(str(exc))
    except SQLAlchemyError as exc:
        fail("cannot read %s: %s%s" % (shown_url(db), error_reason(exc), wal_hint(path)))


@contextmanager
def readable_values(db: str) -> Iterator[None]:
    """A value the reports cannot read (SQLite keeps text in a number's column; a history
    edited by hand or written by another version): one line naming the database, not a
    traceback (``PIPESWIFT_DEBUG=1`` shows it)."""
    from sqlalchemy.exc import SQLAlchemyError

    from pipeswift_slurm.store.history import shown_url

    try:
        yield
    except (SQLAlchemyError, TypeError, ValueError, OverflowError, KeyError) as exc:
        if os.environ.get("PIPESWIFT_DEBUG"):
            raise
        fail("cannot read %s: it holds a value the reports do not expect (%s: %s); it may be damaged, or from an"
             " older version (a controller tick adds the columns a newer one reads)"
             % (shown_url(db), type(exc).__name__, error_reason(exc)[:200]))


def wal_hint(path: Optional[Path]) -> str:
    """Why a read-only user cannot open a WAL database, and what helps ("" otherwise)."""
    try:
        if path is None or path.read_bytes()[18:20] != b"\x02\x02" or os.access(path.parent, os.W_OK):
            return ""
    except OSError:
        return ""
    return ("; it is in WAL mode, which a reader can only open with write access to %s: run one controller"
            " tick of this release (it switches the history to journal_mode DELETE), or read it as its owner"
            % path.parent)
