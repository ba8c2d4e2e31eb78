"""Files that one side writes and another reads. ``write_atomic``, the one atomic writer
of the package (a temporary file in the same folder, renamed over the target), serves the
Prometheus metrics file, the launcher's measurement reports, the site model the controller
publishes and psbatch's compiled front end. ``read_plain`` reads a file a job is pointed at
(the site model, the layer profile it names) without ever waiting on it; ``open_nowait``
opens a file a user names (a trace, a config) without waiting for a FIFO's writer;
``starts_as_sqlite`` and ``sqlite_read_only`` look at a SQLite file without changing it.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Union
from urllib.parse import quote


def plain_or_absent(path: Union[str, Path]) -> bool:
    """Whether ``path`` (a link followed) names a plain file or nothing: what ``write_atomic``
    may replace."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return True


def write_atomic(path: Union[str, Path], content: Union[str, bytes], mode: int = 0o644) -> None:
    """Write ``content`` to ``path`` with permissions ``mode``: a reader sees the old file
    or the new one, never half of one.

    A link is followed (the file it names is replaced, not the link); a target that exists
    and is not a plain file (a device, a FIFO, a folder) is refused, never replaced.

    Raises:
        OSError: the folder cannot be written, or the target is not a plain file (nothing is
            left behind).
    """
    target = Path(os.path.realpath(path))
    if not plain_or_absent(target):
        raise OSError("%s is not a plain file (a device, a FIFO or a folder): nothing written there" % path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % target.name, suffix=".tmp", dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content.encode("utf-8") if isinstance(content, str) else content)
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_plain(path: Union[str, Path], max_bytes: int) -> bytes:
    """The bytes of the plain file at ``path``, at most ``max_bytes``: opened non-blocking
    and checked once open, so a FIFO or a device named there fails at once instead of
    hanging the reader.

    Raises:
        OSError: it cannot be opened, is not a plain file, or is larger than ``max_bytes``.
    """
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError("not a plain file")
        raw = handle.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise OSError("larger than %d bytes" % max_bytes)
    return raw


def open_nowait(path: Union[str, Path]) -> BinaryIO:
    """``path`` opened for reading in binary, without waiting for a writer when it is a FIFO:
    a FIFO nobody writes reads as empty at once, while one being written (``<(zcat f.gz)``)
    reads as it comes. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def starts_as_sqlite(path: Union[str, Path]) -> bool:
    """Whether ``path`` is a plain file that begins with SQLite's header (16 bytes read; a
    FIFO is not waited on). Raises OSError."""
    with open_nowait(path) as head:
        return Path(path).is_file() and head.read(16) == b"SQLite format 3\x00"


def sqlite_read_only(path: Union[str, Path]) -> sqlite3.Connection:
    """A connection to the SQLite file at ``path`` that can neither write nor create it.
    Raises sqlite3.Error."""
    return sqlite3.connect("file:%s?mode=ro" % quote(str(Path(path).resolve())), uri=True)
