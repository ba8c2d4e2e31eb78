"""The database-side guard: one controller acts per history at a time.

A live tick takes the ``controller_lease`` row before it observes the cluster and gives it
back at its end. Taking is a compare-and-swap in one transaction (read the row, then
``UPDATE ... WHERE holder and expires_at are still what was read``), which works the
same on SQLite (``BEGIN IMMEDIATE`` serialises it) and PostgreSQL (the second UPDATE
waits for the first's row lock, then matches nothing). The lease is free when nobody
holds it, when it expired, when this very holder had it, or when its holder was a
process on this host that no longer runs (a tick killed with -9 does not block the next
one for the whole TTL). Must not import ``store.history``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Optional

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from pipeswift_slurm.core.fmt import digits
from pipeswift_slurm.store.schema import ControllerLeaseRow

LEASE_ID = 1
LEASE_TTL_S = 900.0  # longer than the systemd unit's TimeoutStartSec (5 min) kills a tick


@dataclass(frozen=True)
class LeaseState:
    """The outcome of ``take_lease``: whether it was taken, who held it before, and
    until when (epoch s) that holder's lease ran."""

    taken: bool
    holder: Optional[str]
    expires_at: float


def this_holder() -> str:
    """This process's holder id: ``<host> pid <pid>``."""
    return "%s pid %d" % (socket.gethostname(), os.getpid())


def _gone_from_this_host(holder: str) -> bool:
    """Whether ``holder`` names a process on this host that no longer exists."""
    host, _, pid = holder.rpartition(" pid ")
    if host != socket.gethostname() or not digits(pid):
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def take_lease(engine: Engine, holder: str, now: float, ttl_s: float = LEASE_TTL_S) -> LeaseState:
    """Take the lease for ``holder`` until ``now + ttl_s`` if it is free (see module doc).

    ``engine`` must begin its transactions with the write lock on SQLite
    (``sqlite_begin="IMMEDIATE"``, the Store's write engine).
    """
    table = ControllerLeaseRow.__table__
    try:
        with Session(engine) as s, s.begin():
            if s.execute(select(table.c.id).where(table.c.id == LEASE_ID)).first() is None:
                s.execute(insert(table).values(id=LEASE_ID, holder=None, taken_at=None, expires_at=0.0))
    except IntegrityError:
        pass  # another controller inserted it first
    with Session(engine) as s, s.begin():
        seen = s.execute(select(table.c.holder, table.c.expires_at).where(table.c.id == LEASE_ID)).one()
        seen_holder, seen_expires = seen[0], float(seen[1] or 0.0)
        free = (seen_holder is None or seen_holder == holder or seen_expires < now
                or _gone_from_this_host(seen_holder))
        if not free:
            return LeaseState(False, seen_holder, seen_expires)
        same = table.c.holder.is_(None) if seen_holder is None else table.c.holder == seen_holder
        result = s.execute(update(table).where(table.c.id == LEASE_ID, same, table.c.expires_at == seen[1])
                           .values(holder=holder, taken_at=now, expires_at=now + ttl_s))
        if result.rowcount != 1:
            again = s.execute(select(table.c.holder, table.c.expires_at).where(table.c.id == LEASE_ID)).one()
            return LeaseState(False, again[0], float(again[1] or 0.0))
        return LeaseState(True, seen_holder, seen_expires)


def release_lease(engine: Engine, holder: str) -> None:
    """Give the lease back (only if ``holder`` still has it)."""
    table = ControllerLeaseRow.__table__
    with Session(engine) as s, s.begin():
        s.execute(update(table).where(table.c.id == LEASE_ID, table.c.holder == holder)
                  .values(holder=None, expires_at=0.0))
