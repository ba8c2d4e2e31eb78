"""The site model the controller publishes for the jobs' side (``core/site_model.py``): what
it holds, how a bad file is refused, and that the launcher's own plan (a job without a
decision) and ``psbatch --pipeswift=check`` choose with it as the controller does: the
site's measurements in the do-no-harm rule, the GPU type of the job's partition."""

from __future__ import annotations

import json
import logging
import math
import os
import stat
from pathlib import Path

import pytest

from pipeswift_slurm.core import site_model
from pipeswift_slurm.core.estimator import job_side_estimator
from pipeswift_slurm.core.layout_fit import feature_key
from pipeswift_slurm.core.site_model import SiteModel, SiteModelError
from pipeswift_slurm.core.token import ProfileRequest
from pipeswift_slurm.slurm.calibrate import StoreCalibration
from pipeswift_slurm.submit import launcher

# GPT 1.3B-like with the user's tp2 pp1 mbs2 on 8 A100s: the model alone replaces it (by
# tp1 pp1 mbs8, a predicted 24 % gain against a 21 % band); a site that measured this
# class's tp2 runs at 0.8 of the prediction keeps it (``test_do_no_harm``).
MEGATRON = ["pretrain_gpt.py", "--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16",
            "--seq-length", "2048", "--max-position-embeddings", "2048", "--tensor-model-parallel-size", "2",
            "--pipeline-model-parallel-size", "1", "--micro-batch-size", "2", "--global-batch-size", "64",
            "--train-iters", "100", "--bf16"]
ALLOC = launcher.Allocation(1, 8, 7)


def _no_squeue(argv):
    return json.dumps({"jobs": [{"job_id": 7, "admin_comment": "", "comment": ""}]})


def _publish(tmp_path: Path, model: SiteModel) -> dict[str, str]:
    path = tmp_path / "site-model.json"
    site_model.write(str(path), model)
    return {site_model.ENV: str(path)}


def test_round_trip_and_readable_by_all(tmp_path: Path) -> None:
    model = SiteModel({"gpt-1.3b": 1.2, "gpt-1.3b tp=2": 0.8}, "A100-80GB", {"h100": "H100-80GB"}, written_at=1.7e9)
    env = _publish(tmp_path, model)
    assert site_model.read(env[site_model.ENV]) == model
    assert stat.S_IMODE(os.stat(env[site_model.ENV]).st_mode) == 0o644
    assert site_model.from_env(env) == (model, "")
    assert site_model.from_env({}) == (None, "")
    first = SiteModel({"gpt-1.3b": 1.2}, "A100-80GB", own_layout_first=True)
    assert site_model.parse(first.to_json()) == first
    estimator = job_side_estimator(_publish(tmp_path, first), 8)[0]
    assert estimator.own_layout_first and not estimator.explores  # only the controller explores


@pytest.mark.parametrize("text, says", [
    ("{", "not JSON"),
    ('{"format": "other"}', "not a pipeswift-site-model file"),
    ('{"format": "pipeswift-site-model", "version": 2}', "version 2"),
    ('{"format": "pipeswift-site-model", "version": 1, "bias": []}', "must be objects"),
    ('{"format": "pipeswift-site-model", "version": 1, "bias": {"a": -1}}', "not a ratio"),
    ('{"format": "pipeswift-site-model", "version": 1, "bias": {"a": 1e9}}', "not a ratio"),
    ('{"format": "pipeswift-site-model", "version": 1, "bias": {"a": true}}', "not a ratio"),
    ('{"format": "pipeswift-site-model", "version": 1, "bias": {"a": "1.2"}}', "not a ratio"),
    ('{"format": "pipeswift-site-model", "version": 1, "bias": {"%s": 1.0}}' % ("x" * 300), "at most 200"),
    ('{"format": "pipeswift-site-model", "version": 1, "gpu_type": 3}', "gpu_type must be a string"),
    ('{"format": "pipeswift-site-model", "version": 1, "written_at": "now"}', "written_at"),
    ('{"format": "pipeswift-site-model", "version": 1, "own_layout_first": "yes"}', "own_layout_first"),
    ("[" * 100_000, "nested too deeply"),  # a RecursionError stopped the launcher before its job ran
])
def test_a_bad_file_is_refused_with_its_reason(text: str, says: str) -> None:
    with pytest.raises(SiteModelError, match=says):
        site_model.parse(text)


def test_an_unusable_file_costs_one_warning_and_the_cost_model_alone(tmp_path: Path, caplog) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (site_model.MAX_BYTES + 1))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: opening it for reading must not wait for one
    for path in (str(tmp_path / "missing.json"), str(big), str(fifo), str(tmp_path), "/dev/zero"):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            estimator, basis = job_side_estimator({site_model.ENV: path}, 8)
        assert basis == "the cost model alone" and estimator.bias_by_class == {}
        [warning] = [r.getMessage() for r in caplog.records]
        assert warning.startswith("%s=%s: " % (site_model.ENV, path)) and "using the cost model alone" in warning


def test_the_gpu_type_is_the_partitions_then_the_environments_then_the_sites(tmp_path: Path) -> None:
    env = _publish(tmp_path, SiteModel({}, "A100-80GB", {"h100": "H100-80GB"}))
    name = lambda extra: job_side_estimator({**env, **extra}, 8)[0].cost.gpu.name  # noqa: E731
    assert name({}) == "A100-80GB"
    assert name({"SLURM_JOB_PARTITION": "h100"}) == "H100-80GB"
    assert name({"SLURM_JOB_PARTITION": "h100", "PIPESWIFT_GPU_TYPE": "A100-40GB"}) == "H100-80GB"
    assert name({"SLURM_JOB_PARTITION": "gpu", "PIPESWIFT_GPU_TYPE": "A100-40GB"}) == "A100-40GB"
    assert job_side_estimator({"SLURM_JOB_PARTITION": "h100"}, 8)[0].cost.gpu.name == "A100-80GB"  # no site model


def test_the_launchers_own_plan_keeps_a_layout_the_site_measured_faster(tmp_path: Path) -> None:
    profile = launcher.job_profile(MEGATRON, ProfileRequest(()), ALLOC)
    alone, _, why = launcher.choose(MEGATRON, ALLOC, {}, _no_squeue)
    assert alone is not None and alone != profile.requested and why.endswith("by the cost model alone")
    env = _publish(tmp_path, SiteModel({feature_key(profile.job_class, "tp", 2): 0.8}, "A100-80GB",
                                       written_at=1.7e9))
    kept, _, why = launcher.choose(MEGATRON, ALLOC, env, _no_squeue)
    assert kept == profile.requested
    assert why == "no decision: best for the allocation by the site model of 2023-11-14T22:13:20Z"
    # an emulated run sleeps the cost model's time: what calibration learned from emulated
    # runs must not feed back into what they sleep
    learned, basis = job_side_estimator(env, 8)
    unlearned = job_side_estimator(env, 8, learned=False)[0]
    assert math.isclose(learned.run_time_s(profile, profile.requested),
                        0.8 * unlearned.run_time_s(profile, profile.requested))


class _Store:
    """What ``StoreCalibration.refit`` reads and writes, with nothing finished yet."""

    def __init__(self, bias: dict[str, float]):
        self.bias = bias

    def finished_jobs(self):
        return []

    def save_calibration(self, entries) -> None:
        pass

    def calibration(self):
        return {k: (v, 3) for k, v in self.bias.items()}


def test_the_refit_publishes_only_what_changed_and_a_bad_folder_never_stops_it(tmp_path: Path, caplog) -> None:
    path = tmp_path / "site-model.json"
    store = _Store({"gpt-1.3b": 1.25})
    calibration = StoreCalibration(store, publish_file=str(path), site=SiteModel(gpu_type="H100-80GB"))
    estimator = job_side_estimator({}, 8)[0]
    calibration.refit(100.0, estimator)
    assert site_model.read(str(path)) == SiteModel({"gpt-1.3b": 1.25}, "H100-80GB", written_at=100.0)
    calibration.refit(200.0, estimator)
    assert site_model.read(str(path)).written_at == 100.0  # unchanged: not rewritten
    store.bias["gpt-1.3b"] = 1.5
    calibration.refit(300.0, estimator)
    assert site_model.read(str(path)) == SiteModel({"gpt-1.3b": 1.5}, "H100-80GB", written_at=300.0)
    next_tick = StoreCalibration(store, publish_file=str(path), site=SiteModel(gpu_type="H100-80GB"))
    next_tick.refit(360.0, estimator)  # cron's next tick, a new process: the file already holds it
    assert site_model.read(str(path)).written_at == 300.0
    StoreCalibration(store, publish_file=str(path), site=SiteModel(gpu_type="A100-80GB")).refit(420.0, estimator)
    assert site_model.read(str(path)) == SiteModel({"gpt-1.3b": 1.5}, "A100-80GB", written_at=420.0)  # site changed
    assert StoreCalibration(store).publish_file == ""  # publishing is opt-in
    gone = StoreCalibration(store, publish_file=str(tmp_path / "no-such-folder" / "m.json"))
    with caplog.at_level(logging.WARNING):
        assert gone.refit(400.0, estimator).bias_by_class == {"gpt-1.3b": 1.5}
    assert "cannot publish the site model" in caplog.text


def test_the_sites_layer_profile_reaches_a_jobs_own_plan_on_its_gpu_type_only(tmp_path: Path, caplog) -> None:
    from dataclasses import replace

    from pipeswift_slurm.core.costmodel import CostModel
    from pipeswift_slurm.core.hardware import get_gpu_type
    from pipeswift_slurm.core.profile_file import LayerProfile, MicroBatchTiming, write_profile_toml

    profile = launcher.job_profile(MEGATRON, ProfileRequest(()), ALLOC)
    s = profile.shape
    measured = LayerProfile("A100-80GB", "cuda:0 (NVIDIA A100-SXM4-80GB)", "torch", "sdpa", "bf16", s.hidden_size,
                            s.seq_length, s.num_attention_heads, s.num_query_groups, s.kv_channels,
                            s.ffn_hidden_size, s.swiglu, (MicroBatchTiming(1, 30.0, 1.0), MicroBatchTiming(2, 60.0, 1.0)))
    path = tmp_path / "layer-a100.toml"
    write_profile_toml(measured, path)
    env = _publish(tmp_path, SiteModel({}, "A100-80GB", {"h100": "H100-80GB"}, layer_profile=str(path)))
    cfg = profile.requested
    controller = CostModel(get_gpu_type("A100-80GB"), layer_profile=replace(measured, source=str(path)))
    assert job_side_estimator(env, 8)[0].cost.iter_time_s(profile, cfg) == controller.iter_time_s(profile, cfg)
    assert controller.iter_time_s(profile, cfg) != CostModel(get_gpu_type("A100-80GB")).iter_time_s(profile, cfg)
    on_h100 = job_side_estimator({**env, "SLURM_JOB_PARTITION": "h100"}, 8)[0].cost
    assert on_h100.gpu.name == "H100-80GB" and on_h100.layer_profile is None  # measured on another type
    path.write_text("not toml = = =")
    with caplog.at_level(logging.WARNING):
        assert job_side_estimator(env, 8)[0].cost.layer_profile is None
    assert "layer profile" in caplog.text and "using the GPU table" in caplog.text


def test_the_controller_plans_each_partition_of_the_profiles_gpu_type_with_it(tmp_path: Path) -> None:
    from pipeswift_slurm.cli.common import Obj
    from pipeswift_slurm.cli.controller import partition_costs
    from pipeswift_slurm.core.profile_file import LayerProfile, MicroBatchTiming
    from pipeswift_slurm.slurm.config import load_config

    config = tmp_path / "c.toml"
    config.write_text('[slurm]\npartitions = ["gpu"]\ngpu_type = "A100-80GB"\n'
                      '[slurm.partition_gpu_types]\na100 = "A100-80GB"\nh100 = "H100-80GB"\n')
    measured = LayerProfile("A100-80GB", "cuda:0", "torch", "sdpa", "bf16", 2048, 2048, 16, 16, 128, 8192, False,
                            (MicroBatchTiming(1, 30.0, 1.0),))
    costs = partition_costs(load_config(str(config)), Obj(0, None), measured)
    assert {name: cost.layer_profile is measured for name, cost in costs.items()} == \
        {"gpu": True, "a100": True, "h100": False}
