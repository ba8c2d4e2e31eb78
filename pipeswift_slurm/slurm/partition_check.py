"""The GPU types of a mixed cluster as Slurm reports them, against the config: which
partitions' nodes report a typed GPU GRES (``gpu:h100:4``) that is not the GPU type
``[slurm.partition_gpu_types]`` gives them (``gres_mismatches``: such a partition is left
unplanned, since its jobs would be planned for the wrong hardware). The one GRES type of
each partition is ``policy.partitions.partition_gres_types``. Pure: reads a ClusterView,
runs nothing.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Union

from pipeswift_slurm.core.model import ClusterView

PartitionGpuTypes = Union[Mapping[str, str], Iterable[tuple[str, str]]]


def normalised(name: str) -> str:
    """A GPU type name reduced to lowercase letters and digits (``H100-80GB`` -> ``h10080gb``)."""
    return "".join(c for c in name.lower() if c.isascii() and c.isalnum())


def gres_type_matches(gres_type: str, gpu_type: str) -> bool:
    """Whether a node's GRES type names the configured GPU type: the normalised GRES type is
    a prefix of the normalised configured name (``h100`` matches ``H100-80GB``, ``a100``
    does not). An untyped GRES ("") cannot be checked and matches."""
    gres = normalised(gres_type)
    return not gres or normalised(gpu_type).startswith(gres)


def gres_mismatches(view: ClusterView, partition_gpu_types: PartitionGpuTypes) -> dict[str, str]:
    """The configured partitions that must not be planned this tick, and why.

    A partition is reported when a usable node of it reports a typed GPU GRES whose type
    does not match the configured GPU type (``gres_type_matches``; the first such node by
    name is named), or when no node of the view is in it at all. Nodes that are down or
    drained are not checked; untyped GRES passes.

    Args:
        view: the tick's snapshot (its nodes, with ``gpu_type`` and ``partitions``).
        partition_gpu_types: map (or pairs) from partition name to configured GPU type name.

    Returns:
        Map from partition name to a one-line reason naming the partition, the node, the
        node's GRES type and the configured type.
    """
    found: dict[str, str] = {}
    for partition, gpu_type in sorted(dict(partition_gpu_types).items()):
        members = sorted((n for n in view.nodes if partition in n.partitions), key=lambda n: n.name)
        if not members:
            found[partition] = ("partition %s has no nodes in Slurm's view (configured GPU type %s in "
                                "[slurm.partition_gpu_types]); not planned" % (partition, gpu_type))
            continue
        bad = next((n for n in members if n.usable and not gres_type_matches(n.gpu_type, gpu_type)), None)
        if bad is not None:
            found[partition] = ("partition %s: node %s reports GPU GRES type %s, which is not the configured "
                                "GPU type %s ([slurm.partition_gpu_types]); not planned"
                                % (partition, bad.name, bad.gpu_type, gpu_type))
    return found
