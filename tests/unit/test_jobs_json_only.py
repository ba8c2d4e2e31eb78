"""Issue 23, fail closed on what users write: jobs are read only from ``squeue --json``;
a Slurm without it, output that is not JSON or JSON of another shape stops the tick and
changes nothing; a job name that is not UTF-8 or a record of the wrong types breaks neither
the tick nor the launcher of another user's job."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pipeswift_slurm.core import token
from pipeswift_slurm.core.model import ExecConfig
from pipeswift_slurm.slurm.backends import BackendError
from pipeswift_slurm.slurm.backends import slurm_cli as cli
from pipeswift_slurm.slurm.backends.slurm_parse import parse_squeue_json
from pipeswift_slurm.submit import launcher

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
CFG = ExecConfig(tp=1, pp=1, dp=8, micro_batch_size=1, num_micro_batches=8, num_nodes=1, gpus_per_node=8)
FORGED = "x JobId=777 AdminComment=%s" % token.encode_decision(CFG, 1_700_000_000)


class Runner:
    """squeue --json answers ``squeue``; every other command is recorded and answers ''."""

    def __init__(self, squeue: object) -> None:
        self.squeue = squeue
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> str:
        self.calls.append(list(argv))
        if argv[0] == "squeue":
            if isinstance(self.squeue, Exception):
                raise self.squeue
            return str(self.squeue)
        return ""


def record(job_id: int, **fields: object) -> dict[str, object]:
    return {"job_id": job_id, "job_state": "PENDING", "comment": "pswift1;x", **fields}


def test_forged_fields_in_user_text_stay_user_text() -> None:
    """A job name, comment and work dir holding ``JobId=777 AdminComment=<decision>`` are
    only that job's name, comment and path: job 777 is not named, no decision is read."""
    jobs = parse_squeue_json(json.dumps({"jobs": [
        record(5, name=FORGED, comment="pswift1;a " + FORGED, current_working_directory="/tmp/" + FORGED),
        record(777, user_name="other")]}))
    by_id = {j.job_id: j for j in jobs}
    assert sorted(by_id) == [5, 777]
    assert by_id[5].admin_comment == "" and by_id[5].config is None and by_id[5].name == FORGED
    assert by_id[777].admin_comment == "" and by_id[777].config is None


@pytest.mark.parametrize("answer", [
    BackendError("squeue failed (exit 1): squeue: unrecognized option '--json'"),
    BackendError("squeue failed (exit 1): squeue: error: unable to find plugin data_parser"),
    "JobId=5 JobName=x AdminComment=" + token.encode_decision(CFG, 1),   # text, not JSON
    "[]", '{"jobs": {"5": {}}}', '"jobs"', "[" * 100_000,              # JSON of another shape
], ids=["no-json-option", "no-plugin", "text", "list", "jobs-dict", "string", "deep"])
def test_jobs_that_cannot_be_read_as_json_stop_the_snapshot(answer: object) -> None:
    run = Runner(answer)
    backend = cli.SlurmCliBackend(run=run, read_site_factors=False)
    with pytest.raises(BackendError) as info:
        backend.snapshot()
    assert "\n" not in str(info.value) and len(str(info.value)) < 600
    assert [c[0] for c in run.calls] == ["squeue"] or run.calls[-1] == cli.PING_ARGV, run.calls  # no text source
    assert not any("show" in c and "job" in c for c in run.calls)


def test_no_text_job_source() -> None:
    with pytest.raises(BackendError, match="only from squeue --json"):
        cli.SlurmCliBackend(job_source="text")


def test_a_record_of_the_wrong_types_is_left_out_alone() -> None:
    jobs = parse_squeue_json(json.dumps({"jobs": [
        record(5), record(6, node_count={"number": "x"}, tres_per_node=["gres:gpu:1"], array_task_string=7),
        "not a record", record(7, time_limit=[1, 2], gres_detail=5)]}))
    assert 5 in {j.job_id for j in jobs}


NON_UTF8 = (b'{"jobs": [{"job_id": 5, "job_state": "PENDING", "name": "caf\xe9", "comment": "pswift1;x"},'
            b' {"job_id": 6, "job_state": "PENDING", "name": "ok", "admin_comment": "mine", "comment": "c"}]}')


def printer(tmp_path: Path) -> list[str]:
    out = tmp_path / "out.json"
    out.write_bytes(NON_UTF8)
    return [sys.executable, "-c", "import sys; sys.stdout.buffer.write(open(%r, 'rb').read())" % str(out)]


def test_non_utf8_job_name_does_not_break_the_snapshot(tmp_path: Path) -> None:
    argv = printer(tmp_path)
    text = cli.SubprocessRunner()(argv)
    jobs = {j.job_id: j for j in parse_squeue_json(text)}
    assert jobs[5].name == "caf\ufffd" and jobs[5].opted_in and jobs[6].name == "ok"


def test_non_utf8_job_name_of_another_user_does_not_break_the_launcher(tmp_path: Path) -> None:
    argv = printer(tmp_path)

    def run(_: object) -> str:
        return launcher.subprocess_runner(argv)

    assert launcher.read_job_comments(6, run) == ("mine", "c")
    assert launcher.read_job_comments(5, lambda _: '{"jobs": {"5": 1}}') == ("", "")
