"""psbatch's resident helper: Megatron submissions at sbatch's cost, without starting Python.

Owns: a per-user process that the compiled psbatch front end (``fast/psbatch.c``) asks
what to do with a Megatron job (``psbatch.decide``: the same function the Python psbatch
runs) and the local socket protocol between them. The helper only decides; it never runs
sbatch, never runs anything else, and never reads a user's file: the front end sends the
argv, the environment and the script text it read, and carries out the answer itself
(exec of sbatch, with a rewritten script on stdin or in ``psbatch-<pid>-XXXXXX/`` inside
this folder, which the helper removes once that pid has ended), so the job is submitted
by the user's own process, with its limits, umask, session and signals, exactly as the
Python psbatch would submit it.

The front end starts the helper in the background the first time it needs one (that
submission goes through the Python psbatch as before); the helper exits after
``PIPESWIFT_PSBATCH_HELPER_IDLE_S`` seconds without a request (default 600), when the
package's code changes under it, or on SIGTERM. ``PIPESWIFT_PSBATCH_HELPER=off`` turns it
off. Its folder (``helper_dir``) must be the user's own and mode 0700; the helper also
checks that each peer is the same user (SO_PEERCRED). Whenever anything is off (no
helper, a timeout, a protocol or version mismatch, an error), the front end falls back to
the Python psbatch: nothing was submitted yet, so a submission is never lost or doubled.

Protocol (version ``PROTOCOL``): each side sends records, a tag byte, a 4-byte big-endian
length and the bytes, ending with a ``z`` record.
    request: ``v`` ``protocol_id``, ``a`` each argument after argv[0], ``t`` the script text
             as read (absent: unreadable or none) -- these three are the request's *key* --
             then ``h`` the key's memo name (16 hex digits: its 64-bit FNV-1a hash) and
             ``E`` the environment (each ``NAME=value`` ended by a NUL).
    answer:  ``x`` fall back to the Python psbatch (also for ``--pipeswift=check``, whose
             report it prints); else ``w`` a warning line for stderr, ``a`` each argument for
             sbatch, ``i`` bytes for sbatch's stdin, or ``n`` the argv index, ``f`` the file
             name and ``s`` the text of a script to write.

The memo: ``decide`` depends only on the key and on the few variables it looks up, so
after answering, the helper writes the answer to ``memo/<name>`` in its folder, with the
whole key and each variable it read (``g`` the name, then ``G`` its value or ``N``
absent) in front; the front end that sends the same key again, with the same values of
those variables, carries out that answer without asking (a resubmitted script costs no
Python at all). The front end uses the memo only while the helper holds its lock, and
marks the lock file when it does (so the helper does not exit idle meanwhile); the helper
empties the memo when it starts and when it exits, also when its code changes.

    python -m pipeswift_slurm.submit.helper {serve,status,stop} [--dir DIR] [--idle-s S]

Must not import SQLAlchemy, click, the store or any backend (like psbatch).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import functools
import logging
import os
import re
import select
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Optional, Sequence

from pipeswift_slurm.submit import psbatch

log = logging.getLogger(__name__)

PROTOCOL = "pswift-psbatch-helper-2"
SOCKET_NAME = "psbatch.sock"
JOB_PREFIX = "psbatch-"  # the front end's folder for a rewritten script: psbatch-<pid>-XXXXXX
LOCK_NAME = "psbatch.lock"
MEMO_NAME = "memo"
MEMO_MAX_ENTRIES = 64
MEMO_MAX_ENTRY_BYTES = 256 << 10
MEMO_WRITE_AFTER_S = 0.05
IDLE_S_DEFAULT = 600.0
IO_TIMEOUT_S = 5.0
CODE_CHECK_S = 1.0
JOB_MIN_AGE_S = 5.0
MAX_REQUEST_BYTES = 16 << 20
_HEAD = struct.Struct(">cI")
_WARM_UP_SCRIPT = ("#!/bin/bash\n#SBATCH --gpus=2\ntorchrun pretrain_gpt.py --num-layers 4 --hidden-size 64"
                   " --num-attention-heads 4 --seq-length 64 --global-batch-size 8\n")

Record = tuple[bytes, bytes]


class HelperError(Exception):
    """The helper cannot serve from this folder (a one-line reason)."""


@functools.lru_cache(maxsize=1)
def package_root() -> str:
    """The folder holding this ``pipeswift_slurm`` package (resolved once: every request
    checks the protocol id)."""
    return str(Path(psbatch.__file__).resolve().parent.parent)


def protocol_id(root: Optional[str] = None) -> str:
    """What both sides must send: the protocol and the package's folder, so a front end
    built from one checkout is never answered by a helper running another."""
    return "%s %s" % (PROTOCOL, root or package_root())


SHARED_MEMORY = "/dev/shm"


def shared_memory_usable(folder: str = SHARED_MEMORY) -> bool:
    """Whether ``folder`` is a sticky folder everyone may write in (as ``/dev/shm`` is: a
    tmpfs, where making and removing the script folders costs far less than on a disk)."""
    try:
        st = os.stat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX) and os.access(folder, os.W_OK | os.X_OK)


def helper_dir(environ: Mapping[str, str], uid: int, shared_memory: str = SHARED_MEMORY) -> str:
    """The helper's folder: ``$PIPESWIFT_PSBATCH_HELPER_DIR``, else
    ``$XDG_RUNTIME_DIR/pipeswift``, else ``/dev/shm/pipeswift-<uid>`` when ``/dev/shm`` is
    usable, else ``/tmp/pipeswift-<uid>`` (the front end uses the same rule)."""
    if environ.get("PIPESWIFT_PSBATCH_HELPER_DIR"):
        return environ["PIPESWIFT_PSBATCH_HELPER_DIR"]
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        return os.path.join(runtime, "pipeswift")
    if shared_memory_usable(shared_memory):
        return os.path.join(shared_memory, "pipeswift-%d" % uid)
    return "/tmp/pipeswift-%d" % uid


# ---------------------------------------------------------------- records


def encode_records(records: Iterable[Record]) -> bytes:
    return b"".join(_HEAD.pack(tag, len(data)) + data for tag, data in records)


def encode(records: Iterable[Record]) -> bytes:
    return encode_records(records) + _HEAD.pack(b"z", 0)


def _take_records(data: bytes | bytearray, at: int, records: list[Record], limit: int) -> tuple[int, bool]:
    """Append the whole records of ``data`` from ``at`` to ``records``: where the next one
    starts, and whether the ``z`` record was reached. Raises ValueError past ``limit``."""
    while len(data) - at >= _HEAD.size:
        tag, size = _HEAD.unpack_from(data, at)
        if at + _HEAD.size + size > limit:
            raise ValueError("request over %d bytes" % limit)
        if tag == b"z":
            return at, True
        if len(data) - at - _HEAD.size < size:
            break
        records.append((tag, bytes(data[at + _HEAD.size:at + _HEAD.size + size])))
        at += _HEAD.size + size
    return at, False


def read_records(conn: socket.socket, limit: int = MAX_REQUEST_BYTES) -> list[Record]:
    """Records up to the ``z`` one. Raises ValueError past ``limit`` bytes or on EOF."""
    data = bytearray()
    records: list[Record] = []
    at = 0
    while True:
        at, done = _take_records(data, at, records, limit)
        if done:
            return records
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise ValueError("connection closed mid-request")
        data += chunk


def read_records_from(data: bytes) -> list[Record]:
    """The records of ``data`` (a memo entry) up to the ``z`` one. Raises ValueError when
    it is cut short."""
    records: list[Record] = []
    if not _take_records(data, 0, records, len(data))[1]:
        raise ValueError("records cut short")
    return records


class EnvBlock(Mapping[str, str]):
    """The submitter's environment as the front end sends it (``NAME=value`` entries, each
    ended by a NUL), read lazily: a variable is found and decoded only when asked for (a
    submission needs a handful of them; decoding all took longer than the rest of the
    request). The first entry of a name wins, as getenv(3) finds it; an entry without
    ``=`` or with an empty name is not a variable.

    It keeps what was read: ``asked`` maps each name looked up to its raw value (None:
    absent), and ``whole`` says that more than those was read (the whole environment was
    iterated, or a name getenv(3) would look up differently)."""

    def __init__(self, block: bytes) -> None:
        self._block = b"\0" + block
        self._all: Optional[dict[str, str]] = None
        self.asked: dict[str, Optional[bytes]] = {}
        self.whole = False

    def __getitem__(self, name: str) -> str:
        key = b"\0" + os.fsencode(name) + b"="
        at = -1
        if name and "=" not in name and "\0" not in name:
            at = self._block.find(key)
        else:
            self.whole = True
        if at < 0:
            self.asked.setdefault(name, None)
            raise KeyError(name)
        start = at + len(key)
        end = self._block.find(b"\0", start)
        raw = self._block[start:] if end < 0 else self._block[start:end]
        self.asked.setdefault(name, raw)
        return os.fsdecode(raw)

    def _decoded(self) -> dict[str, str]:
        self.whole = True
        if self._all is None:
            self._all = {}
            for entry in self._block.split(b"\0"):
                name, sep, value = os.fsdecode(entry).partition("=")
                if sep and name:
                    self._all.setdefault(name, value)
        return self._all

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())

    def __bool__(self) -> bool:  # without decoding every entry
        return len(self._block) > 1


# ---------------------------------------------------------------- answers


def respond(request: Sequence[Record]) -> tuple[list[Record], Optional[Mapping[str, str]]]:
    """The answer to one request (what the Python psbatch would do, or fall back), and the
    environment it read from (None for a fall back); ``memo_entry`` makes the answer's
    memo entry from them once the answer is sent."""
    versions: list[bytes] = []
    texts: list[bytes] = []
    argv: list[str] = []
    environ: Mapping[str, str] = {}
    for tag, data in request:
        if tag == b"a":
            argv.append(os.fsdecode(data))
        elif tag == b"E":
            environ = EnvBlock(data)
        elif tag == b"v":
            versions.append(data)
        elif tag == b"t":
            texts.append(data)
    if versions != [os.fsencode(protocol_id())]:
        return [(b"x", b"")], None
    text = texts[0].decode("utf-8", "surrogateescape") if texts else None
    action = psbatch.decide(argv, environ, lambda _argv: psbatch.Source(text, None))
    if action.check:  # a report, not a submission: the Python psbatch prints it
        return [(b"x", b"")], None
    out: list[Record] = []
    if action.warning:
        out.append((b"w", psbatch.warning_line(action.warning).encode("utf-8", "backslashreplace")))
    out.extend((b"a", os.fsencode(word)) for word in action.argv)
    if action.stdin is not None:
        out.append((b"i", action.stdin))
    if action.script is not None:
        index, name, script = action.script
        out += [(b"n", str(index).encode()), (b"f", os.fsencode(name)),
                (b"s", script.encode("utf-8", "surrogateescape"))]
    return out, environ


def memo_entry(request: Sequence[Record], environ: Mapping[str, str], reply: Sequence[Record]) -> Optional[bytes]:
    """The memo entry for ``reply``: the request's key, each variable read and its value
    (or its absence), then the answer. None when the answer read more than those."""
    if not isinstance(environ, EnvBlock) or environ.whole:
        return None
    records = [(b"k", encode_records((tag, data) for tag, data in request if tag in (b"v", b"a", b"t")))]
    for name, raw in environ.asked.items():
        records += [(b"g", os.fsencode(name)), (b"N", b"") if raw is None else (b"G", raw)]
    return encode(records + list(reply))


# ---------------------------------------------------------------- serving


def _own_folder(folder: str) -> None:
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise HelperError("cannot create %s: %s" % (folder, exc.strerror)) from None
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise HelperError("%s is not a folder of this user with mode 0700; remove it or set "
                          "PIPESWIFT_PSBATCH_HELPER_DIR" % folder)


def _same_user(conn: socket.socket) -> bool:
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return bool(uid == os.getuid())


def _code_stamp() -> dict[str, int]:
    """Modification times of this package's loaded modules (a new install stops the helper)."""
    stamp = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.split(".")[0] == __name__.split(".")[0] and path:
            try:
                stamp[path] = os.stat(path).st_mtime_ns
            except OSError:
                stamp[path] = -1
    return stamp


def remove_ended_jobs(folder: str, min_age_s: float = JOB_MIN_AGE_S) -> None:
    """Remove the script folders of submissions whose sbatch has ended. The front end
    names each after its pid, which sbatch keeps when the front end execs it; a pid that
    is gone (or reused by another user's process) means sbatch has read its script. A
    folder younger than ``min_age_s`` stays whatever its pid says (sbatch reads the script
    at once; this guards against a pid this process cannot see)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        pid_text = name[len(JOB_PREFIX):].partition("-")[0] if name.startswith(JOB_PREFIX) else ""
        if not pid_text.isdigit() or int(pid_text) < 2:
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # still running
        except (ProcessLookupError, PermissionError):  # gone, or the pid is another user's now
            pass
        path = os.path.join(folder, name)
        try:
            if time.time() - os.lstat(path).st_mtime < min_age_s:
                continue
            for entry in os.listdir(path):
                os.unlink(os.path.join(path, entry))
            os.rmdir(path)
        except OSError:
            pass


_MEMO_KEY = re.compile(rb"[0-9a-f]{16}")


def clear_memo(folder: str) -> None:
    """Empty the memo (the helper starts and ends with none: a memo never outlives the
    code that wrote it)."""
    memo = os.path.join(folder, MEMO_NAME)
    try:
        names = os.listdir(memo)
    except OSError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(memo, name))
        except OSError:
            pass


def memo_size(folder: str) -> int:
    """How many answers the memo holds."""
    try:
        return sum(1 for name in os.listdir(os.path.join(folder, MEMO_NAME)) if _MEMO_KEY.fullmatch(os.fsencode(name)))
    except OSError:
        return 0


def remember(folder: str, name: bytes, entry: bytes) -> None:
    """Write ``entry`` as ``memo/<name>`` (whole or not at all), keeping at most
    ``MEMO_MAX_ENTRIES`` entries of at most ``MEMO_MAX_ENTRY_BYTES``: the least recently
    used go (by modification time, which the front end renews on each hit)."""
    if not _MEMO_KEY.fullmatch(name) or len(entry) > MEMO_MAX_ENTRY_BYTES:
        return
    memo = os.path.join(folder, MEMO_NAME)
    try:
        os.makedirs(memo, mode=0o700, exist_ok=True)
        entries = [e for e in os.scandir(memo) if _MEMO_KEY.fullmatch(os.fsencode(e.name))]
        if len(entries) >= MEMO_MAX_ENTRIES:
            entries.sort(key=lambda e: e.stat().st_mtime_ns)
            for old in entries[:len(entries) - MEMO_MAX_ENTRIES + 1]:
                os.unlink(old.path)
        tmp = os.path.join(memo, ".new-%d" % os.getpid())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, entry)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(memo, os.fsdecode(name)))
    except OSError:
        log.debug("cannot write a memo entry", exc_info=True)


def pend(pending: list[tuple[bytes, bytes]], name: bytes, entry: bytes) -> Optional[tuple[bytes, bytes]]:
    """Queue a new memo entry in ``pending`` (at most ``MEMO_MAX_ENTRIES``), or return it
    to be written at once when the same request is already queued: asked twice before a
    pause, it is being resubmitted in a loop, and waiting for a pause would have the helper
    answer every one of them."""
    if any(queued == name for queued, _ in pending):
        pending[:] = [(queued, kept) for queued, kept in pending if queued != name]
        return name, entry
    if len(pending) < MEMO_MAX_ENTRIES:
        pending.append((name, entry))
    return None


def _serve_one(conn: socket.socket) -> Optional[tuple[bytes, bytes]]:
    """Answer one connection: the memo name and entry of the answer, when reusable."""
    conn.settimeout(IO_TIMEOUT_S)
    if not _same_user(conn):
        return None
    try:
        request = read_records(conn)
    except (OSError, ValueError):
        return None
    environ: Optional[Mapping[str, str]] = None
    try:
        reply, environ = respond(request)
    except Exception:  # decide() never raises for a job; anything else: the Python psbatch
        log.debug("helper answer failed", exc_info=True)
        reply = [(b"x", b"")]
    try:
        conn.sendall(encode(reply))
        conn.shutdown(socket.SHUT_WR)  # the front end reads to the end: it may go on now
    except OSError:
        return None
    names = [data for tag, data in request if tag == b"h"]
    if environ is None or len(names) != 1:
        return None
    entry = memo_entry(request, environ, reply)  # after the answer: not in the front end's way
    return (names[0], entry) if entry is not None else None


def serve(folder: str, idle_s: float = IDLE_S_DEFAULT) -> int:
    """Serve until ``idle_s`` without a request; 0 also when another helper already serves."""
    _own_folder(folder)
    lock_fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return 0
        raise
    os.ftruncate(lock_fd, 0)
    os.write(lock_fd, b"%d\n" % os.getpid())
    clear_memo(folder)
    path = os.path.join(folder, SOCKET_NAME)
    if os.path.lexists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old_mask)
    bound = os.lstat(path).st_ino
    listener.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    psbatch.decide(["-H"], EnvBlock(b""), lambda _argv: psbatch.Source(_WARM_UP_SCRIPT, None))  # imports, caches
    loaded = _code_stamp()
    last_request = chores_at = time.monotonic()
    marked = os.fstat(lock_fd).st_mtime_ns
    to_remember: list[tuple[bytes, bytes]] = []
    try:
        # Chores between requests, never while one waits, about once a second: the
        # scripts of ended submissions go, a front end's mark on the lock file (a memo
        # hit) counts as a request, and once the code on disk changed the helper exits,
        # so the next submission starts one on the new code. New memo entries are written
        # once no request came for MEMO_WRITE_AFTER_S (not while the front end that was
        # just answered submits the job), or at once when the same request comes again
        # before that (a loop resubmitting one job: from its third time on, the memo
        # answers).
        while True:
            now = time.monotonic()
            if to_remember and now >= last_request + MEMO_WRITE_AFTER_S:
                for name, entry in to_remember:
                    remember(folder, name, entry)
                to_remember.clear()
            if now >= chores_at:
                remove_ended_jobs(folder)
                if _code_stamp() != loaded:
                    break
                mark = os.fstat(lock_fd).st_mtime_ns
                if mark != marked:
                    marked, last_request = mark, now
                chores_at = now + CODE_CHECK_S
            idle_left_s = last_request + idle_s - now
            if idle_left_s <= 0:
                break
            wake_s = min(idle_left_s, chores_at - now)
            if to_remember:
                wake_s = min(wake_s, last_request + MEMO_WRITE_AFTER_S - now)
            if select.select([listener], [], [], max(0.0, wake_s))[0]:
                conn, _ = listener.accept()
                with conn:
                    done = _serve_one(conn)
                if done:
                    write_now = pend(to_remember, *done)
                    if write_now:
                        remember(folder, *write_now)
                last_request = time.monotonic()
    finally:
        clear_memo(folder)
        remove_ended_jobs(folder)
        try:
            if os.lstat(path).st_ino == bound:
                os.unlink(path)
        except OSError:
            pass
        listener.close()
    return 0


def running_pid(folder: str) -> Optional[int]:
    """The pid of the helper serving ``folder``, None when none does."""
    try:
        fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeswift_slurm.submit.helper",
                                 description="psbatch's resident helper for the compiled front end.")
    ap.add_argument("command", choices=("serve", "status", "stop"), nargs="?", default="status")
    ap.add_argument("--dir", help="the helper's folder (default: as the front end finds it)")
    ap.add_argument("--idle-s", type=float, help="seconds without a request before it exits "
                    "(default: $PIPESWIFT_PSBATCH_HELPER_IDLE_S, else %g)" % IDLE_S_DEFAULT)
    args = ap.parse_args(argv)
    folder = args.dir or helper_dir(os.environ, os.getuid())
    if args.command == "serve":
        idle_s = args.idle_s
        if idle_s is None:
            try:
                idle_s = float(os.environ.get("PIPESWIFT_PSBATCH_HELPER_IDLE_S") or IDLE_S_DEFAULT)
            except ValueError:
                idle_s = IDLE_S_DEFAULT
        try:
            return serve(folder, idle_s)
        except (HelperError, OSError) as exc:
            sys.stderr.write("psbatch helper: error: %s\n" % exc)
            return 2
    pid = running_pid(folder)
    if args.command == "status":
        if pid:
            held = memo_size(folder)
            sys.stdout.write("running (pid %d) in %s; %d answer%s in its memo\n"
                             % (pid, folder, held, "" if held == 1 else "s"))
        else:
            sys.stdout.write("not running (%s)\n" % folder)
        return 0 if pid else 1
    if pid:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        sys.stdout.write("stopped pid %d\n" % pid)
    else:
        sys.stdout.write("not running (%s)\n" % folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
