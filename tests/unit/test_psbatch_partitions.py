"""psbatch and partitions (issue 26 item 3): a Megatron job submitted with ``-p a,b`` records
them in its profile token (``parts=``); ``--pipeswift-partitions`` (or ``#PSWIFT
partitions=``) adds partitions it may be moved to beside its own; a bad list is one stderr
line, exit 2 and nothing submitted. Submissions go through the fake sbatch of
test_psbatch.py, which records its argv."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeswift_slurm.core.token import decode_profile
from pipeswift_slurm.submit.sbatch_args import OwnOptions, PsbatchUsageError, job_partitions, own_options

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_psbatch import _psbatch  # noqa: E402

CMD = ("torchrun pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 "
       "--seq-length 64 --global-batch-size 8 --train-iters 10")


def parts_sent(calls: list[dict]) -> tuple[str, ...]:
    (call,) = calls
    comment = next(a for a in call["argv"] if a.startswith("--comment="))
    return decode_profile(comment).partitions


@pytest.mark.parametrize("argv, parts", [
    (["-p", "a100,h100"], ("a100", "h100")),
    (["--partition=a100,h100,a100"], ("a100", "h100")),
    (["-p", "a100", "--pipeswift-partitions", "a100,h100"], ("a100", "h100")),
    (["--pipeswift-partitions=h100", "-pa100"], ("a100", "h100")),
    (["--pipeswift-partitions=h100,l40"], ("h100", "l40")),  # own partition: Slurm's default
    (["-p", "a100"], ()),
    ([], ()),
])
def test_partitions_a_job_may_run_in_are_recorded(tmp_path: Path, argv: list[str], parts: tuple[str, ...]) -> None:
    done, calls = _psbatch([*argv, "-N1", "--gpus-per-node=2", "--wrap", CMD], tmp_path)
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    assert parts_sent(calls) == parts
    assert not any(a.startswith("--pipeswift") for a in calls[0]["argv"])
    assert ("-p" in argv) == ("-p" in calls[0]["argv"])  # sbatch still gets -p as written


def test_partitions_from_the_script_and_the_environment(tmp_path: Path) -> None:
    (tmp_path / "t.sh").write_text("#!/bin/bash\n#SBATCH -p a100\n#SBATCH --gpus-per-node=2\n"
                                   "#PSWIFT partitions=h100\n" + CMD + "\n")
    done, calls = _psbatch(["t.sh"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert parts_sent(calls) == ("a100", "h100")
    done, calls = _psbatch(["t.sh"], tmp_path, extra_env={"SBATCH_PARTITION": "a100,l40"})
    assert parts_sent(calls) == ("a100", "l40", "h100")  # SBATCH_PARTITION over #SBATCH, as sbatch reads it


@pytest.mark.parametrize("value", ["a100,", "a b", "h100;x", "é", ",".join("p%d" % i for i in range(17))])
def test_a_bad_partition_list_is_one_line_and_exit_2(tmp_path: Path, value: str) -> None:
    done, calls = _psbatch(["--pipeswift-partitions", value, "--gpus=2", "--wrap", CMD], tmp_path)
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 2 and calls == [] and done.stdout == b""
    assert len(lines) == 1 and lines[0].startswith("psbatch: error: --pipeswift-partitions") \
        and lines[0].endswith("; nothing submitted"), lines
    checked = _psbatch(["--pipeswift=check", "--pipeswift-partitions", value, "--gpus=2", "--wrap", CMD], tmp_path)[0]
    assert checked.returncode == 2 and checked.stderr.decode().splitlines() == lines


def test_check_shows_the_partitions(tmp_path: Path) -> None:
    done, calls = _psbatch(["--pipeswift=check", "-p", "a100", "--pipeswift-partitions=h100", "--gpus=2",
                            "--wrap", CMD], tmp_path)
    assert done.returncode == 0 and calls == []
    assert "partitions a100,h100 (where it is predicted to finish first)" in done.stdout.decode()


def test_job_partitions_rules() -> None:
    own = own_options([("partitions", "h100,a100")])
    assert own.partitions == ("h100", "a100")
    assert job_partitions({"partition": "a100"}, own) == ("a100", "h100")
    assert job_partitions({"partition": "a100,h100"}, OwnOptions()) == ("a100", "h100")
    assert job_partitions({"partition": "weird name"}, OwnOptions()) == ()  # sbatch judges -p
    assert job_partitions({"partition": "weird name"}, own) == ("h100", "a100")
    many = own_options([("partitions", ",".join("p%d" % i for i in range(16)))])
    with pytest.raises(PsbatchUsageError, match="at most 16"):
        job_partitions({"partition": "a100"}, many)
