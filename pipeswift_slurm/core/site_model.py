"""The site model the controller publishes for the jobs' side: what it learned of run times
(the calibration's bias map: per class, per family and the layout terms), which GPU type
each partition runs and the hardware and layer-profile files it plans with, in one small
JSON file (``[calibration] publish_file``).

``pipeswift-launch`` plans a job the controller made no decision for (Slurm started it
before a tick, or its decision does not fit the allocation), and ``psbatch
--pipeswift=check`` shows the layouts a job would run; both read the file that
``$PIPESWIFT_SITE_MODEL`` names, so they choose as the controller does: with the site's
measurements in the do-no-harm rule, and on the partition's GPU type. Without the file, or
with one that cannot be read, they use the cost model alone (one warning line).

The file is written by the controller (the admin) and only read by jobs; a user who points
the variable at a file of their own changes only the plans of their own jobs, which they
could as well write into their command. It is read with bounds all the same: at most
``MAX_BYTES``, ratios finite in ``[1/RATIO_BOUND, RATIO_BOUND]``, names of bounded length.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from pipeswift_slurm.core.files import read_plain, write_atomic

FORMAT = "pipeswift-site-model"
VERSION = 1
ENV = "PIPESWIFT_SITE_MODEL"
MAX_BYTES = 8 << 20
MAX_NAME = 200
RATIO_BOUND = 1000.0


class SiteModelError(ValueError):
    """A site model file that cannot be read or is not one."""


@dataclass(frozen=True)
class SiteModel:
    """What a published site model holds.

    Attributes:
        bias: the controller's bias map (``Estimator.bias_by_class``).
        gpu_type: the site's GPU type (``[slurm] gpu_type``).
        partition_gpu_types: partition -> GPU type where it differs (a mixed cluster).
        hardware_file: the site's hardware table (``[slurm] hardware_file``), '' for none.
        layer_profile: the site's measured layer profile (``[slurm] layer_profile``), '' for
            none; it stands in for the GPU table where it was measured on the job's GPU type.
        written_at: when the controller wrote it (epoch seconds).
        own_layout_first: the controller bets against no user's layout of a class before
            a run in one was measured (``[calibration] own_layout_first``); launchers then
            run users' layouts or measured ones only (only the controller explores).
    """

    bias: Mapping[str, float] = field(default_factory=dict)
    gpu_type: str = ""
    partition_gpu_types: Mapping[str, str] = field(default_factory=dict)
    hardware_file: str = ""
    layer_profile: str = ""
    written_at: float = 0.0
    own_layout_first: bool = False

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "written_at": self.written_at,
                           "gpu_type": self.gpu_type, "partition_gpu_types": dict(self.partition_gpu_types),
                           "hardware_file": self.hardware_file, "layer_profile": self.layer_profile,
                           "bias": dict(self.bias), "own_layout_first": self.own_layout_first}, sort_keys=True)


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise SiteModelError("%s must be a string of at most %d characters" % (what, MAX_NAME))
    return value


def parse(text: str) -> SiteModel:
    """The site model in ``text``.

    Raises:
        SiteModelError: not JSON, another format or version, or a value out of bounds.
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SiteModelError("not JSON (%s)" % exc) from None
    except RecursionError:  # json reads nested arrays recursively
        raise SiteModelError("not a site model: values nested too deeply") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SiteModelError("not a %s file" % FORMAT)
    if data.get("version") != VERSION:
        raise SiteModelError("version %r, this pipeswift reads version %d" % (data.get("version"), VERSION))
    bias, kinds = data.get("bias", {}), data.get("partition_gpu_types", {})
    if not isinstance(bias, dict) or not isinstance(kinds, dict):
        raise SiteModelError("bias and partition_gpu_types must be objects")
    ratios = {}
    for key, ratio in bias.items():
        _name(key, "a bias key")
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) \
                or not 1 / RATIO_BOUND <= ratio <= RATIO_BOUND:
            raise SiteModelError("bias %r: %r is not a ratio in [1/%g, %g]" % (key, ratio, RATIO_BOUND, RATIO_BOUND))
        ratios[key] = float(ratio)
    written_at = data.get("written_at", 0.0)
    if isinstance(written_at, bool) or not isinstance(written_at, (int, float)) or not math.isfinite(written_at):
        raise SiteModelError("written_at must be a number")
    own_first = data.get("own_layout_first", False)  # absent in files of older releases
    if not isinstance(own_first, bool):
        raise SiteModelError("own_layout_first must be true or false")
    return SiteModel(ratios, _name(data.get("gpu_type", ""), "gpu_type"),
                     {_name(p, "a partition"): _name(t, "a GPU type") for p, t in kinds.items()},
                     _name(data.get("hardware_file", ""), "hardware_file"),
                     _name(data.get("layer_profile", ""), "layer_profile"), float(written_at), own_first)


def read(path: str) -> SiteModel:
    """The site model in the file at ``path``.

    Raises:
        SiteModelError: the file cannot be read, is too large, or is not a site model.
    """
    try:
        raw = read_plain(path, MAX_BYTES)  # a FIFO or a device must not hang a job's start
    except OSError as exc:
        raise SiteModelError("cannot read it (%s)" % (exc.strerror or exc)) from None
    return parse(raw.decode("utf-8", errors="replace"))


def write(path: str, model: SiteModel) -> None:
    """Write ``model`` to ``path``, readable by all, atomically (``files.write_atomic``).

    Raises:
        OSError: the folder cannot be written.
    """
    write_atomic(path, model.to_json() + "\n", 0o644)


def from_env(env: Mapping[str, str]) -> tuple[Optional[SiteModel], str]:
    """(the site model ``$PIPESWIFT_SITE_MODEL`` names, why not) : (None, '') when the
    variable is unset, (None, a warning) when the file is not usable."""
    path = env.get(ENV, "")
    if not path:
        return None, ""
    try:
        return read(path), ""
    except SiteModelError as exc:
        return None, "%s=%s: %s; using the cost model alone" % (ENV, path, exc)
