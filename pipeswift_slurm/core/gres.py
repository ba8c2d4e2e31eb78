"""How many GPUs a Slurm job asks for: one rule for psbatch, which reads sbatch's options
before the job exists, and for the controller, which reads Slurm's ``tres_per_*`` fields of
the job. The two must agree: the controller refuses a profile whose size differs from the
size the job was submitted with (``core.request.submitted_profile``).

Pure; the standard library's ``re`` only, and no dataclass: psbatch imports it on the
submit path.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

# Slurm's GPU request fields, in the order one is taken when a job sets several; sbatch's
# options for each: --gpus-per-node or --gres, --gpus, --gpus-per-task, --gpus-per-socket.
GPU_FIELDS = ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket")


def _items(spec: str) -> list[str]:
    """The comma-separated items of a GRES list, a comma inside parentheses kept
    (``gpu:2(IDX:0,1)``); one pass, as the text may be a user's (psbatch reads ``--gres``)."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(spec):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    items.append(spec[start:])
    return items


def gres_gpu(spec: str) -> Optional[tuple[int, Optional[str], bool]]:
    """The GPU item of a GRES/TRES list such as ``gpu:2``, ``gres:gpu:2``,
    ``gres/gpu:a100:4``, ``gpu:8(IDX:0-7)``, ``gres:gpu`` (count 1) or ``gres/gpu=2``:
    (count, GPU type or None, whether it is spelled ``gres/gpu``); None without a GPU item
    or with a count that is not a plain number."""
    for item in _items(spec):
        item = item.strip()
        if item.endswith(")") and "(" in item:  # gpu:8(IDX:0-7)
            item = item[:item.index("(")]
        slash = item.startswith("gres/")
        if item.startswith(("gres/", "gres:")):
            item = item[5:]
        parts = re.split(r"[:=]", item)
        if parts[0] != "gpu":
            continue
        rest = parts[1:]
        last = rest[-1] if rest else ""
        if len(rest) > 1 and not (last.isascii() and last.isdigit()):
            return None  # gpu:TYPE:COUNT with no count Slurm would take
        count = int(last) if last.isascii() and last.isdigit() else 1
        gpu_type = rest[0] if rest and not rest[0].isdigit() else None
        return count, gpu_type, slash
    return None


def job_gpus(counts: Mapping[str, Optional[int]], nodes: int,
             tasks: Optional[int]) -> Optional[tuple[str, int]]:
    """(field, total GPUs) of a request given as GPU counts per field (``GPU_FIELDS``; a
    field unset or 0 is not asked): the first field set, in ``GPU_FIELDS`` order, decides.
    Per job: its count; per task: times the tasks (1 when unknown); per node, and per socket
    (one socket a node at least): times the nodes (1 at least). None when no field is set."""
    for field in GPU_FIELDS:
        count = counts.get(field)
        if count:
            if field == "tres_per_job":
                return field, count
            if field == "tres_per_task":
                return field, count * (tasks or 1)
            return field, count * max(1, nodes)
    return None
