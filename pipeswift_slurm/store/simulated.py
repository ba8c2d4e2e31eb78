"""A history a simulation writes, marked as such in its SQLite header, so that
``simulate --db`` and ``demo --db`` replace only what a simulation wrote: never a
controller's real history (same tables, real jobs), which an admin's slip of the path
would otherwise lose.

The mark is SQLite's ``PRAGMA application_id`` (a 32-bit integer in the file header, kept
by every SQLite tool and by ``VACUUM``; the controller never sets it). A history written
before the mark counts as a simulation's only where no controller could have written it:
no live tick took the lease (``controller_lease`` has no row) and no tick was a dry run."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from pipeswift_slurm.core.files import sqlite_read_only
from pipeswift_slurm.store.history import Store

SIMULATED_APPLICATION_ID = 0x70735331  # "psS1": written by a pipeswift simulation


def new_simulated_history(path: Path) -> Store:
    """A fresh history at ``path`` (whatever was there removed: the caller checked it with
    ``written_by_simulation``), marked as a simulation's, in WAL mode for speed."""
    path.unlink(missing_ok=True)
    store = Store.from_url(str(path), journal_mode="WAL")
    with store.engine.begin() as conn:
        conn.exec_driver_sql("PRAGMA application_id = %d" % SIMULATED_APPLICATION_ID)
    return store


def written_by_simulation(path: Path) -> bool:
    """Whether the history at ``path`` is a simulation's: it carries the mark, or no
    controller could have written it (read without writing)."""
    try:
        conn = sqlite_read_only(path)
        try:
            if conn.execute("PRAGMA application_id").fetchone()[0] == SIMULATED_APPLICATION_ID:
                return True
            return bool(conn.execute("SELECT NOT EXISTS (SELECT 1 FROM controller_lease)"
                                     " AND NOT EXISTS (SELECT 1 FROM ticks WHERE dry_run)").fetchone()[0] == 1)
        finally:
            conn.close()
    except sqlite3.Error:
        return False
