"""Error bands (``core/error_band.py``): the shipped table is what the published rows give
today, so a cost-model change that moves the errors fails here until the table is refreshed
(``python bench/fidelity.py --band-table`` prints the new lines)."""

from pathlib import Path

import pytest

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.error_band import BANDS, DEFAULT_BAND, MIN_BAND, band_for, band_value
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.core.megatron import profile_from_argv
from pipeswift_slurm.core.model import ExecConfig
from pipeswift_slurm.measure.fidelity import SHARED_FAMILIES, band_rows, band_table, compare, compare_shared

ROOT = Path(__file__).resolve().parents[2]
REPO_CSV = ROOT / "tests" / "data" / "fidelity" / "published_megatron.csv"
SHARED_CSV = ROOT.parent / "shared" / "reference" / "published" / "megatron_published.csv"


def _shipped(families: set[str]) -> dict[tuple[str, bool, bool], float]:
    return {k: v for k, v in BANDS.items() if k[0] in families}


def _derived(rows: list) -> dict[tuple[str, bool, bool], float]:
    return {k: g["band"] for k, g in band_table(rows).items() if g["band"] is not None}


def test_repository_rows_give_the_shipped_bands_of_their_families() -> None:
    derived = _derived(band_rows(compare(REPO_CSV), []))
    assert derived and {k[0] for k in derived}.isdisjoint(SHARED_FAMILIES)
    assert derived == pytest.approx(_shipped({k[0] for k in derived}), abs=0.005)


def test_shared_rows_give_the_shipped_bands_of_their_families() -> None:
    if not SHARED_CSV.is_file():
        pytest.skip("%s absent: the Hopper and Blackwell bands cannot be recomputed here" % SHARED_CSV)
    shared, _refused = compare_shared(SHARED_CSV)
    derived = _derived(band_rows([], shared))
    assert {k[0] for k in derived} == set(SHARED_FAMILIES)
    assert derived == pytest.approx(_shipped(set(SHARED_FAMILIES)), abs=0.005)


def test_default_band_is_wider_than_every_measured_group_and_none_is_narrower_than_the_floor() -> None:
    assert all(MIN_BAND <= band < DEFAULT_BAND for band in BANDS.values())
    assert band_value(0.001) == MIN_BAND and band_value(0.1105) == 0.12 and band_value(0.11) == 0.11


def _cfg(tp: int = 1, pp: int = 1, cp: int = 1) -> ExecConfig:
    return ExecConfig(tp=tp, pp=pp, dp=1, micro_batch_size=1, num_micro_batches=8, cp=cp)


def test_band_follows_the_layout_features_and_gpu_family() -> None:
    assert band_for("H100-80GB", _cfg(tp=4)).rel == BANDS[("hopper", False, False)]
    assert band_for("H200-141GB", _cfg(tp=4, pp=4)).rel == BANDS[("hopper", True, False)]
    assert band_for("H100-80GB", _cfg(cp=2)).rel == BANDS[("hopper", False, True)]
    assert band_for("A100-80GB", _cfg(tp=8, pp=2)).group == "ampere, pp > 1, cp = 1"
    unlike = band_for("A100-80GB", _cfg(cp=2))  # nobody published A100 runs with context parallelism
    assert unlike.rel == DEFAULT_BAND and not unlike.measured and "ampere, pp = 1, cp > 1" in unlike.group
    assert band_for("MI300X", _cfg()).rel == DEFAULT_BAND  # a type of a hardware file: no family
    assert band_for("H100-80GB", _cfg(tp=4)).text() == "\u00b1 6 %"


def test_every_estimate_carries_its_band() -> None:
    profile = profile_from_argv(["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16",
                                 "--seq-length", "2048", "--max-position-embeddings", "2048",
                                 "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                 "--micro-batch-size", "1", "--global-batch-size", "64", "--train-iters", "10",
                                 "--bf16"], world_size=8)
    est = CostModel(get_gpu_type("H100-80GB")).estimate(profile, profile.requested)
    assert est.band == band_for("H100-80GB", profile.requested) and est.band.rel == 0.08


def _layout_argv() -> list[str]:
    # tp 2 without pipelining: within the band of the fastest layout (tp 1), so it is kept
    return ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
            "1", "--micro-batch-size", "4", "--global-batch-size", "64", "--train-iters", "100", "--bf16"]


def test_estimate_and_plan_show_the_band_and_the_kept_layout() -> None:
    import json

    from click.testing import CliRunner

    from pipeswift_slurm.cli.main import pipeswift

    def run(*args: str) -> str:
        result = CliRunner().invoke(pipeswift, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    text = run("estimate", "--num-gpus", "8", "--", *_layout_argv())
    assert "iteration time         0.867 s \u00b1 21 %" in text and "ampere, pp = 1, cp = 1" in text
    data = json.loads(run("estimate", "--num-gpus", "8", "--gpu-type", "H100-80GB", "--json", "--", *_layout_argv()))
    assert (data["error_band"], data["error_band_group"]) == (0.06, "hopper, pp = 1, cp = 1")
    plan = json.loads(run("plan", "--gpus", "8", "--top", "3", "--json", "--", *_layout_argv()))
    assert all(row["error_band"] == 0.21 and row["chosen"] is False for row in plan["configs"])  # tp1 pp1 first
    kept = plan["user_layout_kept"]
    assert [(k["gpus"], k["config"]["tp"], k["config"]["pp"], k["error_band"]) for k in kept] == [(8, 2, 1, 0.21)]
    assert "runs on 8 GPUs: your layout 8gpu=1x8 tp2 pp1" in run("plan", "--gpus", "8", "--", *_layout_argv())
