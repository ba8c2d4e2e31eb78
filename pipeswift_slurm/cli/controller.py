"""``pipeswift controller tick|run``: the admin's cron job and daemon.

A tick takes a non-blocking file lock (a second tick exits 0 quietly), observes the
cluster, decides, acts on pending opted-in jobs, records everything in one transaction,
then refits the per-class calibration from finished jobs (the controller's own last step,
``slurm/calibrate.py``). Exit 0 when all is well,
1 on a real failure (one line on stderr), 2 on bad configuration.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import stat
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import click

from pipeswift_slurm.cli.common import FiniteFloatRange, Obj, error_reason, fail, pass_obj

log = logging.getLogger(__name__)


class LockPathError(RuntimeError):
    """The lock path is one a user could take or redirect (one line, exit 2)."""


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def check_lock_folder(folder: Path) -> None:
    """Make ``folder`` (mode 0700, parents as needed) if missing, and refuse one that a
    user could plant the lock in: world-writable (``/run/lock``: whoever creates the file
    first holds it, so every root tick would exit doing nothing), a symlink, or owned by
    someone else than root or the running user.

    Raises:
        LockPathError: the folder is unsafe or cannot be made.
    """
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError as exc:
        raise LockPathError("cannot make the lock folder %s (%s); set [controller] lock_file to a path in a "
                            "folder only the controller's user can write" % (folder, exc.strerror or exc)) from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        why = "is a symlink" if stat.S_ISLNK(st.st_mode) else "is not a folder"
    elif st.st_mode & stat.S_IWOTH:
        why = "is world-writable (any user could create the lock first and stop every tick)"
    elif not _trusted_owner(st.st_uid):
        why = "is owned by uid %d, not root or the controller's user" % st.st_uid
    else:
        return
    raise LockPathError("lock folder %s %s; set [controller] lock_file to a path in a folder only the "
                        "controller's user can write (default %s)" % (folder, why, _default_lock()))


def _default_lock() -> str:
    from pipeswift_slurm.slurm.config import DEFAULT_LOCK

    return DEFAULT_LOCK


def open_lock_file(path: str) -> int:
    """Open (create, 0600) the lock file in a checked folder, never through a symlink, and
    refuse one owned by another user.

    Raises:
        LockPathError: the folder or the file is unsafe, or cannot be opened.
    """
    check_lock_folder(Path(path).parent)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise LockPathError("cannot open the lock file %s (%s); remove it or set [controller] lock_file"
                            % (path, "a symlink" if exc.errno == errno.ELOOP else exc.strerror or exc)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not _trusted_owner(st.st_uid):
        os.close(fd)
        raise LockPathError("lock file %s is %s; remove it (only the controller's user may own it)"
                            % (path, "not a regular file" if not stat.S_ISREG(st.st_mode)
                               else "owned by uid %d" % st.st_uid))
    return fd


@contextmanager
def tick_lock(path: str) -> Iterator[bool]:
    """Hold an exclusive flock on ``path`` for the block; yields False when another process
    holds it (the lock dies with its holder, so a killed tick never blocks the next). The
    holder writes ``<pid> <epoch s>`` into the file, so a tick that finds the lock taken
    can say who holds it and since when (``lock_holder``).

    Raises:
        LockPathError: the path is one a user could take first or redirect (``open_lock_file``).
    """
    fd = open_lock_file(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"%d %d\n" % (os.getpid(), int(time.time())), 0)
        yield True
    finally:
        os.close(fd)


def lock_holder(path: str, now_s: float) -> str:
    """Who holds the tick lock at ``path`` and for how long, as words ("" when unknown)."""
    try:
        pid, since = Path(path).read_text().split()[:2]
        return "held by pid %d for %.0f s" % (int(pid), max(0.0, now_s - int(since)))
    except (OSError, ValueError):
        return ""


def _load(config_path: Optional[str], overrides: dict[str, Any]) -> Any:
    from dataclasses import replace

    from pipeswift_slurm.slurm.config import ConfigError, check_backend, load_config

    try:
        cfg = load_config(config_path)
        cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
        if overrides.get("backend") is not None:
            check_backend("--backend", cfg.backend)
    except ConfigError as exc:
        fail(str(exc))
    return cfg


def partition_gpu(cfg: Any, obj: Obj, partition: str = "") -> Any:
    """The GpuType the config plans ``partition`` on (``ControllerConfig.gpu_type_of``; ''
    or a partition not named: ``[slurm] gpu_type``), from the config's hardware file, else
    ``--hardware``'s.

    Raises:
        HardwareError: an unknown GPU type or an unreadable hardware file.
    """
    from pipeswift_slurm.core.hardware import get_gpu_type

    return get_gpu_type(cfg.gpu_type_of(partition), cfg.hardware_file or obj.hardware)


def site_gpu(cfg: Any, obj: Obj) -> Any:
    """The config's GPU type (with its hardware file, else ``--hardware``'s)."""
    from pipeswift_slurm.core.hardware import HardwareError

    try:
        return partition_gpu(cfg, obj)
    except HardwareError as exc:
        fail("%s: [slurm] gpu_type: %s" % (cfg.source, exc))


def build_controller(cfg: Any, obj: Obj) -> Any:
    """Backend, store, policy and calibrated estimator from the config (the calibration
    step, when on, ends every tick that is not a dry run)."""
    from pipeswift_slurm.cli.common import load_layer_profile, open_store
    from pipeswift_slurm.core.costmodel import CostModel
    from pipeswift_slurm.core.estimator import Estimator
    from pipeswift_slurm.core.site_model import SiteModel
    from pipeswift_slurm.policy import get_policy
    from pipeswift_slurm.slurm.backends import BackendError, get_backend
    from pipeswift_slurm.slurm.calibrate import StoreCalibration
    from pipeswift_slurm.slurm.config import policy_knobs
    from pipeswift_slurm.slurm.controller import Controller, ControllerSettings
    from pipeswift_slurm.slurm.measured import folder_problem

    gpu = site_gpu(cfg, obj)
    store = open_store(cfg.db_url) if cfg.db_url else None  # a config mistake first, then the host's
    try:
        backend = get_backend(cfg.backend, partitions=cfg.partitions or None)
    except BackendError as exc:
        fail(str(exc), 1)
    policy = get_policy(cfg.policy, **policy_knobs(cfg))  # name and knobs checked by load_config
    gpn = cfg.gpus_per_node or 8
    layer_profile = load_layer_profile(cfg.layer_profile, gpu, what="%s: [slurm] layer_profile" % cfg.source)
    # the GPUs per node here only seed the estimator: each tick plans with the cluster's own
    estimator = Estimator(CostModel(gpu, layer_profile=layer_profile), gpn, own_layout_first=cfg.own_layout_first)
    # the files a job's own plan reads too, by absolute paths (a job runs elsewhere)
    hardware, profile_path = cfg.hardware_file or obj.hardware, cfg.layer_profile
    site = SiteModel(gpu_type=cfg.gpu_type, partition_gpu_types=dict(cfg.partition_gpu_types),
                     hardware_file=os.path.abspath(hardware) if hardware else "",
                     layer_profile=os.path.abspath(profile_path) if profile_path else "",
                     own_layout_first=cfg.own_layout_first)
    calibration = (StoreCalibration(store, cfg.calibration_exclude_partitions, cfg.measure_dir, cfg.publish_file, site)
                   if store is not None else None)
    if calibration is not None:
        estimator = estimator.with_bias(calibration.bias_map())
    if cfg.measure_dir and cfg.calibrate and (problem := folder_problem(cfg.measure_dir)):
        log.warning("%s: [calibration] measure_dir: %s", cfg.source, problem)
    settings = ControllerSettings(dry_run=cfg.dry_run, allow_requeue=cfg.allow_requeue, partitions=cfg.partitions,
                                  gpus_per_node=cfg.gpus_per_node)
    return Controller(backend, policy, estimator, store, settings,
                      calibration=calibration if cfg.calibrate else None,
                      partition_costs=partition_costs(cfg, obj, layer_profile))


def partition_costs(cfg: Any, obj: Obj, layer_profile: Any = None) -> dict[str, Any]:
    """Partition -> the cost model of its GPU type, for a mixed cluster
    (``[slurm.partition_gpu_types]``; the partitions of ``[slurm] partitions`` not named
    there run ``gpu_type``), with the site's layer profile where it was measured on that
    type; empty when the config names none."""
    from pipeswift_slurm.core.costmodel import CostModel
    from pipeswift_slurm.core.hardware import HardwareError
    from pipeswift_slurm.core.layer_profile import profile_for_gpu

    if not cfg.partition_gpu_types:
        return {}
    kinds = dict(cfg.partition_gpu_types)
    out = {}
    for name in list(cfg.partitions) + [p for p in kinds if p not in cfg.partitions]:
        try:
            gpu = partition_gpu(cfg, obj, name)
            out[name] = CostModel(gpu, layer_profile=profile_for_gpu(layer_profile, gpu.name))
        except HardwareError as exc:
            fail("%s: [slurm.partition_gpu_types] %s: %s" % (cfg.source, name, exc))
    return out


def run_one_tick(cfg: Any, obj: Obj, controller: Optional[Any] = None) -> Optional[Any]:
    """One locked tick; returns the report, or None when another tick holds the lock file or
    another controller holds the history's lease (``controller_lease``: two hosts, or two
    lock files, sharing one database never act in the same tick)."""
    from pipeswift_slurm.slurm.backends import BackendError
    from sqlalchemy.exc import SQLAlchemyError

    from pipeswift_slurm.store.history import StoreBusy, StoreError, shown_url

    try:
        with tick_lock(cfg.lock_file) as got:
            if not got:
                held = lock_holder(cfg.lock_file, time.time())
                log.warning("another controller tick is running (lock %s%s); nothing to do this time",
                            cfg.lock_file, ", " + held if held else "")
                return None
            try:
                controller = controller or build_controller(cfg, obj)
                with leased(controller.store) as leased_ok:
                    return controller.tick() if leased_ok else None
            except BackendError as exc:
                fail("slurm: %s" % exc, 1)
            except StoreBusy as exc:
                fail("database busy: %s" % exc, 1)
            except StoreError as exc:
                fail("database: %s (nothing more was changed in Slurm; the next tick reads back what was)" % exc, 1)
            except SQLAlchemyError as exc:  # e.g. a database holding another program's tables of these names
                fail("database %s: %s (is it pipeswift's history? give another [store] url)"
                     % (shown_url(cfg.db_url), error_reason(exc)), 1)
    except LockPathError as exc:
        fail(str(exc))
    return None


@contextmanager
def leased(store: Optional[Any]) -> Iterator[bool]:
    """Hold the history's controller lease for the block (always True without a store);
    False, with one WARNING line, when another controller holds it."""
    if store is None:
        yield True
        return
    from pipeswift_slurm.store.lease import this_holder

    me = this_holder()
    now = time.time()
    state = store.take_lease(me, now)
    if not state.taken:
        log.warning("another controller (%s) holds the history's lease for %.0f s more; this one does not act "
                    "(two controllers share %s)", state.holder, max(0.0, state.expires_at - now),
                    getattr(getattr(store, "engine", None), "url", "the history"))
        yield False
        return
    try:
        yield True
    finally:
        store.release_lease(me)


def dry_run_note(cfg: Any, flag: Optional[bool]) -> str:
    """The one line that says a tick is a dry run, why, and how to go live ("" when live)."""
    from pipeswift_slurm.slurm.config import DEFAULT_PATH

    if not cfg.dry_run:
        return ""
    if flag:
        why, live = "--dry-run", "drop --dry-run"
    elif not cfg.from_file:
        why = "no config file at %s or $PIPESWIFT_CONFIG" % DEFAULT_PATH
        live = ("write one (example: wrappers/config.example.toml) with [controller] dry_run = false"
                " and [store] url")
    else:
        why, live = "[controller] dry_run = true in %s" % cfg.source, "set it to false"
    recorded = "history in %s" % cfg.db_url if cfg.db_url else "no history written"
    return "dry run (%s): nothing is changed in Slurm, %s; to go live, %s" % (why, recorded, live)


def _summary(report: Any, dry_run: bool) -> None:
    view = report.view
    log_line = ("tick: %d pending, %d running, %d decisions, %d applied, %d skipped, %.2f s%s"
                % (len(view.pending), len(view.running), len(report.decisions), len(report.applied),
                   len(report.skipped), report.duration_s, " (dry run)" if dry_run else ""))
    click.echo(log_line, err=True)
    if dry_run:
        for d in report.decisions:
            cfg = d.config.short() if d.config else "-"
            click.echo("job %d: config=%s site_factor=%s time_limit_s=%s requeue=%s  # %s"
                       % (d.job_id, cfg, d.site_factor, d.time_limit_s, d.requeue, d.reason))


@click.group()
def controller() -> None:
    """The admin's controller: one tick from cron, or a loop."""


_config_option = click.option("--config", "config_path", envvar="PIPESWIFT_CONFIG", type=click.Path(dir_okay=False),
                              help="TOML config [env PIPESWIFT_CONFIG; default /etc/pipeswift/config.toml].")
_db_option = click.option("--db", "db_url", envvar="PIPESWIFT_DB", help="Override [store] url [env PIPESWIFT_DB].")
_backend_option = click.option("--backend", envvar="PIPESWIFT_BACKEND",
                               type=click.Choice(["auto", "cli", "pyslurm"]), help="Override [slurm] backend.")
_dry_run_option = click.option("--dry-run", is_flag=True, default=None,
                               help="Decide and print; change nothing in Slurm (the default without a config file).")


@controller.command("tick")
@_config_option
@_db_option
@_backend_option
@_dry_run_option
@pass_obj
def tick_cmd(obj: Obj, config_path: Optional[str], db_url: Optional[str], backend: Optional[str],
             dry_run: Optional[bool]) -> None:
    """Run one controller tick (cron-safe: overlapping ticks exit quietly)."""
    cfg = _load(config_path, {"db_url": db_url, "backend": backend, "dry_run": dry_run})
    note = dry_run_note(cfg, dry_run)
    if note:
        click.echo(note, err=True)
    report = run_one_tick(cfg, obj)
    if report is not None:
        _summary(report, cfg.dry_run)


@controller.command("run")
@_config_option
@_db_option
@_backend_option
@click.option("--interval", "interval_s", type=FiniteFloatRange(min=1, max=86400), default=60.0, show_default=True,
              help="Seconds between ticks.")
@click.option("--max-ticks", type=click.IntRange(min=1), help="Stop after this many ticks (tests).")
@_dry_run_option
@pass_obj
def run_cmd(obj: Obj, config_path: Optional[str], db_url: Optional[str], backend: Optional[str],
            interval_s: float, max_ticks: Optional[int], dry_run: Optional[bool]) -> None:
    """Tick every --interval seconds until SIGTERM/SIGINT; a failed tick is logged and retried.
    Exits 1 when the last tick failed (a service manager then shows the controller failing)."""
    cfg = _load(config_path, {"db_url": db_url, "backend": backend, "dry_run": dry_run})
    note = dry_run_note(cfg, dry_run)
    if note:
        click.echo(note, err=True)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    controller_obj = build_controller(cfg, obj)
    done, failed = 0, False
    while not stop["now"] and (max_ticks is None or done < max_ticks):
        started = time.monotonic()
        try:
            report = run_one_tick(cfg, obj, controller_obj)
            if report is not None:
                _summary(report, cfg.dry_run)
            failed = False
        except SystemExit as exc:
            if exc.code == 2:
                raise
            failed = True
            log.warning("tick failed; retrying in %.0f s", interval_s)
        done += 1
        while not stop["now"] and time.monotonic() - started < interval_s and (max_ticks is None or done < max_ticks):
            time.sleep(min(1.0, interval_s))
    if failed:
        sys.exit(1)
