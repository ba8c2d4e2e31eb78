"""Error bands: how far off the cost model's iteration time is for layouts like a given one.

Every estimate carries a relative band (``Estimate.band``), read from a table of measured
groups. A group is a GPU family and two layout features that move the model's error:
whether the layout is pipelined (pp > 1) and whether it uses context parallelism (cp > 1).
A group's band is the largest |step time error| (predicted / published - 1) of the published
Megatron runs in it, rounded up to the next whole percent, and never below ``MIN_BAND``;
a group with fewer than ``MIN_ROWS`` runs is not measured. A layout of no measured group
(another GPU family, a GPU type of a hardware file, a feature mix nobody published) gets
``DEFAULT_BAND``.

The rows behind the table are not shipped: ``measure.fidelity.band_table`` derives it from
``bench/fidelity.py``'s rows, and ``tests/unit/test_error_band.py`` recomputes it and fails
when a cost-model change moves the errors (refresh with ``python bench/fidelity.py
--band-table``). Pure: no I/O, imports nothing outside the standard library and the core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from pipeswift_slurm.core.model import ExecConfig

# A group needs this many published runs to get its own band.
MIN_ROWS = 3
# No group's band is narrower: a handful of runs of two or three models is all a group has.
MIN_BAND = 0.05
# Layouts of no measured group: wider than every measured group (the widest, Ampere
# without pipelining, is 21 %); tests check it stays wider.
DEFAULT_BAND = 0.35

# GPU type name prefix -> family. The family's band holds for its every type: H200 shares
# H100's compute (the table gives it H100's efficiency), B200 GB200's.
FAMILIES = (("GB200", "blackwell"), ("B200", "blackwell"), ("H100", "hopper"), ("H200", "hopper"),
            ("A100", "ampere"), ("V100", "volta"))

# (family, pipelined, context parallel) -> band. From bench/fidelity.py at the commit that
# last changed the cost model (the overlap flags, elementwise work, NCCL's per-node NIC
# bandwidth and the efficiency refit of bench/fit_efficiency.py; "python bench/fidelity.py
# --band-table" prints it):
# - hopper and blackwell: the 63 rows of ../shared/reference/published/megatron_published.csv
#   (NVIDIA DGX Cloud recipes, every flag stated; they supersede the repository's four older
#   H100 recipes of the same models, whose overlap flags are not stated);
# - ampere: the 18 A100 rows of tests/data/fidelity/published_megatron.csv (NAR21, KOR22).
BANDS: dict[tuple[str, bool, bool], float] = {
    # Nemotron-4 15B at tp 2 and 4 (16 rows): -5 to +1 %
    ("hopper", False, False): 0.06,
    # Llama 3.1 8B at cp 2, Llama 3.1 405B proxies at tp 8 pp 1 (7 rows): -5 to +2 %
    ("hopper", False, True): 0.05,
    # GPT-3 175B at tp 4 pp 8, Nemotron-4 340B at tp 8 pp 8 (15 rows): -4 to +8 %
    ("hopper", True, False): 0.08,
    # Llama 3.1 70B and 405B at cp 2, pp 3 to 9 (16 rows): -5 to +2 %
    ("hopper", True, True): 0.05,
    # Nemotron-4 340B on GB200 at tp 8 pp 4 (6 rows): -7 to -1 %
    ("blackwell", True, False): 0.08,
    # Llama 3.1 405B on GB200 at tp 4 pp 8 cp 2 (3 rows): -1 to +1 %
    ("blackwell", True, True): 0.05,
    # GPT 1.7B to 18.4B at tp 1 to 8 (NAR21) and 22B at tp 8 (KOR22) (6 rows): -20 to +15 %
    ("ampere", False, False): 0.21,
    # GPT 39.1B to 1T (NAR21), GPT-3 175B, MT-NLG 530B, 1T (KOR22) at pp 2 to 64 (12 rows): -6 to +5 %
    ("ampere", True, False): 0.07,
}


@dataclass(frozen=True)
class ErrorBand:
    """A relative error band: the true time is expected within ``rel`` of the prediction
    (``rel`` 0.08: +- 8 %); ``group`` names the measured group it comes from, or says that
    the layout is of no measured group."""

    rel: float
    group: str

    @property
    def measured(self) -> bool:
        return not self.group.startswith("default")

    def text(self) -> str:
        """'± 8 %'."""
        return "\u00b1 %.0f %%" % (100 * self.rel)


def gpu_family(gpu_name: str) -> Optional[str]:
    """The family of a GPU type name ("H100-80GB" -> "hopper"), or None for a type of no
    known family."""
    upper = gpu_name.upper()
    return next((family for prefix, family in FAMILIES if upper.startswith(prefix)), None)


def layout_group(gpu_name: str, config: ExecConfig) -> tuple[str, bool, bool]:
    """The group key of ``config`` on GPU type ``gpu_name``: (family or "other",
    pipelined, context parallel)."""
    return gpu_family(gpu_name) or "other", config.pp > 1, config.cp > 1


def group_name(key: tuple[str, bool, bool]) -> str:
    """'hopper, pp > 1, cp = 1'."""
    family, piped, ctx = key
    return "%s, %s, %s" % (family, "pp > 1" if piped else "pp = 1", "cp > 1" if ctx else "cp = 1")


def band_value(max_abs_error: float) -> float:
    """The band of a group whose largest |error| is ``max_abs_error``: rounded up to the
    next whole percent, at least ``MIN_BAND``."""
    return max(MIN_BAND, math.ceil(round(100 * max_abs_error, 6)) / 100)


_CACHE: dict[tuple[str, bool, bool], ErrorBand] = {}


def band_for(gpu_name: str, config: ExecConfig) -> ErrorBand:
    """The error band of an estimate of ``config`` on GPU type ``gpu_name``."""
    key = layout_group(gpu_name, config)
    hit = _CACHE.get(key)
    if hit is None:
        rel = BANDS.get(key)
        hit = _CACHE[key] = ErrorBand(rel, group_name(key)) if rel is not None else \
            ErrorBand(DEFAULT_BAND, "default: no published runs of %s" % group_name(key))
    return hit


def unmeasured_band() -> ErrorBand:
    """The band of an estimate made without a GPU type's name: the default."""
    return ErrorBand(DEFAULT_BAND, "default: no GPU type named")
