"""The controller's TOML configuration: one file (``/etc/pipeswift/config.toml`` or
``$PIPESWIFT_CONFIG``), every key optional, validated at load with errors that name the
file and the key: types, ranges, the backend (one the controller can drive, and
importable), the policy and its knobs (checked by the policy registry, the one place
knobs are checked). Pure apart from reading the file and looking for pyslurm. Example:
``wrappers/config.example.toml``.
"""

from __future__ import annotations

import importlib.util
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pipeswift_slurm.core.files import read_plain

DEFAULT_PATH = "/etc/pipeswift/config.toml"
DEFAULT_DB = "/var/lib/pipeswift/pipeswift.sqlite"
DEFAULT_LOCK = "/run/pipeswift/tick.lock"  # the controller makes /run/pipeswift 0700: no user can take the lock
NO_FILE = "(no config file)"
MAX_CONFIG_BYTES = 1 << 20  # a config is a few kB


class ConfigError(ValueError):
    """A config file that cannot be read or holds a wrong key or value."""


@dataclass(frozen=True)
class ControllerConfig:
    """Everything a controller tick needs to know about the site.

    ``site_factor_max`` bounds the SiteFactor the policy may set (keep it in proportion
    to the site's PriorityWeight* so jobs that are not opted in are not pushed back more
    than the site wants); ``gpus_per_node`` 0 means "read it from the cluster". An empty
    ``db_url`` records nothing (what a tick without any config file does: a dry run that
    writes no history, see ``load_config``). ``calibration_exclude_partitions`` names the
    partitions whose jobs never feed calibration (test partitions where jobs run with
    ``pipeswift-launch --emulate``: their run times are not real).
    ``partition_gpu_types`` (``[slurm.partition_gpu_types]``, partition = GPU type) makes
    a mixed cluster: each such partition is planned on its own GPU type and node size
    (read from Slurm's nodes), and a job that allows several partitions may be moved to
    the one where it is predicted to finish first. Partitions not named there run
    ``gpu_type``. ``publish_file`` is where each refit publishes the site model (the bias
    map and the GPU types, ``core/site_model.py``) for the launchers and ``psbatch
    --pipeswift=check`` (``$PIPESWIFT_SITE_MODEL`` in the jobs' environment).
    """

    db_url: str = DEFAULT_DB
    backend: str = "auto"
    partitions: tuple[str, ...] = ()
    gpu_type: str = "A100-80GB"
    partition_gpu_types: tuple[tuple[str, str], ...] = ()  # (partition, GPU type) where they differ
    gpus_per_node: int = 0
    hardware_file: Optional[str] = None
    layer_profile: Optional[str] = None
    policy: str = "pipeswift"
    policy_knobs: dict[str, Any] = field(default_factory=dict)
    site_factor_max: int = 100_000_000
    dry_run: bool = False
    allow_requeue: bool = False
    lock_file: str = DEFAULT_LOCK
    calibrate: bool = True
    calibration_exclude_partitions: tuple[str, ...] = ()
    measure_dir: str = ""  # [calibration] measure_dir: where launchers report iteration times
    publish_file: str = ""  # [calibration] publish_file: the site model for the launchers
    own_layout_first: bool = False  # [calibration] own_layout_first: needs measure_dir
    source: str = "(defaults)"

    def gpu_type_of(self, partition: str) -> str:
        """The GPU type the controller plans ``partition`` on (``[slurm.partition_gpu_types]``,
        else ``gpu_type``)."""
        return dict(self.partition_gpu_types).get(partition) or self.gpu_type

    @property
    def from_file(self) -> bool:
        """Whether a config file was read (without one, ticks are dry runs: ``load_config``)."""
        return self.source != NO_FILE


MAX_GPUS_PER_NODE = 1024  # a cap above any node's GPUs; a larger number is a typo

_SCHEMA: dict[str, dict[str, tuple[str, type]]] = {
    "store": {"url": ("db_url", str)},
    "slurm": {"backend": ("backend", str), "partitions": ("partitions", list), "gpu_type": ("gpu_type", str),
              "gpus_per_node": ("gpus_per_node", int), "hardware_file": ("hardware_file", str),
              "layer_profile": ("layer_profile", str), "partition_gpu_types": ("partition_gpu_types", dict)},
    "policy": {"name": ("policy", str), "site_factor_max": ("site_factor_max", int), "knobs": ("policy_knobs", dict)},
    "controller": {"dry_run": ("dry_run", bool), "allow_requeue": ("allow_requeue", bool),
                   "lock_file": ("lock_file", str), "calibrate": ("calibrate", bool)},
    "calibration": {"exclude_partitions": ("calibration_exclude_partitions", list),
                    "measure_dir": ("measure_dir", str), "publish_file": ("publish_file", str),
                    "own_layout_first": ("own_layout_first", bool)},
}


# backends a controller can drive (``sim`` is the simulator's in-memory cluster)
CONTROLLER_BACKENDS = ("auto", "cli", "pyslurm")


def check_backend(source: str, name: str) -> None:
    """Refuse a backend the controller cannot use here.

    Raises:
        ConfigError: unknown name, ``sim``, or ``pyslurm`` when it is not installed.
    """
    where = "%s: [slurm] backend" % source
    if name == "sim":
        raise ConfigError("%s = 'sim' is the simulator's in-memory cluster, not a Slurm cluster; use one of %s"
                          % (where, ", ".join(CONTROLLER_BACKENDS)))
    if name not in CONTROLLER_BACKENDS:
        raise ConfigError("%s %r unknown; use one of %s" % (where, name, ", ".join(CONTROLLER_BACKENDS)))
    if name == "pyslurm" and importlib.util.find_spec("pyslurm") is None:
        raise ConfigError("%s = 'pyslurm', but the pyslurm module is not installed for this Python; install the"
                          " pyslurm matching the site's Slurm, or use backend = 'cli'" % where)


def _check(path: str, section: str, key: str, value: Any, kind: type) -> Any:
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError("%s: [%s] %s must be a non-negative integer (got %r)" % (path, section, key, value))
    if key == "gpus_per_node" and value > MAX_GPUS_PER_NODE:
        raise ConfigError("%s: [%s] %s must be at most %d (got %r)" % (path, section, key, MAX_GPUS_PER_NODE, value))
    if kind is not int and not isinstance(value, kind):
        raise ConfigError("%s: [%s] %s must be a %s (got %r)" % (path, section, key, kind.__name__, value))
    if kind is str and "\0" in value:  # every string is a path, a name or a URL: none can hold one
        raise ConfigError("%s: [%s] %s must not contain a NUL character" % (path, section, key))
    if kind is list:
        if not all(isinstance(v, str) and v.strip() and "\0" not in v for v in value):
            raise ConfigError("%s: [%s] %s must be a list of names (strings, none empty)" % (path, section, key))
        return tuple(value)
    if key in _JOB_SIDE_PATHS and value and not os.path.isabs(value):
        raise ConfigError("%s: [%s] %s must be an absolute path (got %r): the launchers %s it from"
                          " every job's own working directory" % (path, section, key, value, _JOB_SIDE_PATHS[key]))
    if key == "partition_gpu_types":
        if not all(k.strip() and "\0" not in k for k in value):
            raise ConfigError("%s: [%s.%s] a partition name is empty; write each as name = \"GPU type\""
                              % (path, section, key))
        if not all(isinstance(v, str) and v for v in value.values()):
            raise ConfigError("%s: [%s.%s] each value must be a GPU type name, e.g. a100 = \"A100-80GB\""
                              % (path, section, key))
        return tuple(sorted(value.items()))
    return value


# paths the jobs' launchers use too, each from its own working directory: relative, they
# would name another file in every job
_JOB_SIDE_PATHS = {"measure_dir": "write to", "publish_file": "read"}


def load_config(path: Optional[str] = None) -> ControllerConfig:
    """Read the config file (``path``, else $PIPESWIFT_CONFIG, else the default path when
    it exists). With no file at all, the built-in defaults in a dry run that records
    nothing: a first tick on a new host neither changes Slurm nor writes the history
    (``source`` is ``NO_FILE``).

    Raises:
        ConfigError: unreadable file, unknown section or key, or a wrong type.
    """
    if path is not None and not path.strip():
        raise ConfigError("--config %r: an empty path; give the config file's path, or leave --config out"
                          % path)
    chosen = path or os.environ.get("PIPESWIFT_CONFIG") or (DEFAULT_PATH if Path(DEFAULT_PATH).exists() else None)
    if chosen is None:
        return ControllerConfig(dry_run=True, db_url="", source=NO_FILE)
    try:
        data = tomllib.loads(read_plain(chosen, MAX_CONFIG_BYTES).decode("utf-8-sig"))  # no FIFO wait; a BOM is no key
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("%s: cannot read config: %s" % (chosen, exc)) from None
    except RecursionError:  # tomllib reads nested arrays and tables recursively
        raise ConfigError("%s: cannot read config: values nested too deeply" % chosen) from None
    values: dict[str, Any] = {"source": chosen}
    for section, table in data.items():
        if section not in _SCHEMA:
            raise ConfigError("%s: unknown section [%s]; known: %s" % (chosen, section, ", ".join(_SCHEMA)))
        if not isinstance(table, dict):
            raise ConfigError("%s: %s = %r: %s is a section; write [%s] on a line of its own, its keys below it"
                              % (chosen, section, table, section, section))
        for key, value in table.items():
            if key not in _SCHEMA[section]:
                raise ConfigError("%s: [%s] unknown key %r; known: %s"
                                  % (chosen, section, key, ", ".join(_SCHEMA[section])))
            attr, kind = _SCHEMA[section][key]
            values[attr] = _check(chosen, section, key, value, kind)
    if "backend" in values:
        check_backend(chosen, values["backend"])
    cfg = ControllerConfig(**values)
    if cfg.own_layout_first and not cfg.measure_dir:
        raise ConfigError("%s: [calibration] own_layout_first needs measure_dir (where launchers report the"
                          " layouts that ran): without it no user's layout is ever measured and no layout"
                          " would ever change" % chosen)
    _check_policy(cfg)
    _check_gpu_types(cfg)
    return cfg


def _check_gpu_types(cfg: ControllerConfig) -> None:
    """Every GPU type the config names is one the hardware table knows."""
    if not cfg.partition_gpu_types:
        return
    from pipeswift_slurm.core.hardware import HardwareError, get_gpu_type

    for partition, name in cfg.partition_gpu_types:
        try:
            get_gpu_type(name, cfg.hardware_file)
        except HardwareError as exc:
            raise ConfigError("%s: [slurm.partition_gpu_types] %s: %s" % (cfg.source, partition, exc)) from None


def _check_policy(cfg: ControllerConfig) -> None:
    from pipeswift_slurm.policy import KnobError, make_policy_knobs, policy_names
    from pipeswift_slurm.policy.knobs import SITE_FACTOR_LIMIT

    if cfg.policy not in policy_names():
        raise ConfigError("%s: [policy] name %r unknown; known: %s"
                          % (cfg.source, cfg.policy, ", ".join(policy_names())))
    if cfg.site_factor_max > SITE_FACTOR_LIMIT:
        raise ConfigError("%s: [policy] site_factor_max must be at most %d, Slurm's limit (got %d)"
                          % (cfg.source, SITE_FACTOR_LIMIT, cfg.site_factor_max))
    try:
        make_policy_knobs(cfg.policy, policy_knobs(cfg))
    except KnobError as exc:
        raise ConfigError("%s: [policy.knobs] %s" % (cfg.source, exc)) from None


def policy_knobs(cfg: ControllerConfig) -> dict[str, Any]:
    """The knobs the controller gives its policy: ``[policy.knobs]``, and ``[policy]
    site_factor_max`` for the policies that have that knob (those that set SiteFactors)."""
    from pipeswift_slurm.policy import knob_defaults

    knobs = dict(cfg.policy_knobs)
    if "site_factor_max" in knob_defaults(cfg.policy):
        knobs.setdefault("site_factor_max", cfg.site_factor_max)
    return knobs
