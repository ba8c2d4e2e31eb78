"""The one rule for how many GPUs a job asks for (core.gres), which psbatch and the
controller share."""

import pytest

from pipeswift_slurm.core.gres import GPU_FIELDS, gres_gpu, job_gpus


@pytest.mark.parametrize("spec, item", [
    ("gpu:2", (2, None, False)),
    ("gres:gpu", (1, None, False)),
    ("gres/gpu:a100:4", (4, "a100", True)),
    ("gres/gpu=2", (2, None, True)),
    ("gpu:8(IDX:0-7)", (8, None, False)),
    ("shard:1,gpu:h100:8", (8, "h100", False)),
    ("gres:mps:100", None),
    ("", None),
    ("gpu:a100:x4", None),        # no count Slurm would take: none read
    ("gpu:a100:\u0664", None),    # a digit, but not one Slurm reads
    ("gpu:2(IDX:0,1),shard:1", (2, None, False)),  # a comma inside parentheses
    ("," * 200_000 + "gpu:3", (3, None, False)),  # user text (--gres): read in one pass
    ("(" * 200_000 + ")", None),
])
def test_gres_gpu_reads_the_gpu_item(spec, item):
    assert gres_gpu(spec) == item


def test_the_first_field_set_decides_and_scales_by_nodes_or_tasks():
    assert job_gpus({}, 2, None) is None and job_gpus({"tres_per_node": 0}, 2, None) is None
    assert job_gpus({"tres_per_job": 6}, 2, None) == ("tres_per_job", 6)
    assert job_gpus({"tres_per_node": 2}, 3, None) == ("tres_per_node", 6)
    assert job_gpus({"tres_per_task": 2}, 2, 4) == ("tres_per_task", 8)
    assert job_gpus({"tres_per_task": 2}, 2, None) == ("tres_per_task", 2)
    assert job_gpus({"tres_per_socket": 1}, 0, None) == ("tres_per_socket", 1)
    # several set: the first in GPU_FIELDS order
    assert GPU_FIELDS[0] == "tres_per_node"
    assert job_gpus({"tres_per_job": 4, "tres_per_node": 2}, 2, None) == ("tres_per_node", 4)
