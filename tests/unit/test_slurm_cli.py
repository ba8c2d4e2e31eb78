"""SlurmCliBackend: parsers on output recorded live on 22.05 and 24.11, argv
builders as golden lists, error mapping, and backend detection. No Slurm needed."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeswift_slurm.core import token
from pipeswift_slurm.slurm.backends import BackendError, JobGone
from pipeswift_slurm.slurm.backends import detect
from pipeswift_slurm.slurm.backends import scontrol_argv, slurm_parse
from pipeswift_slurm.slurm.backends import slurm_cli as cli
from pipeswift_slurm.slurm.controller import Controller, ControllerSettings
from pipeswift_slurm.core.model import ClusterView, Decision, ExecConfig, GpuRequest, Job, Node

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
NOW = 1_800_000_000.0


def read(name: str) -> str:
    return (DATA / name).read_text()


class FakeRunner:
    """Maps an argv (tuple) to recorded stdout, or to an exception; records every call."""

    def __init__(self, answers: dict[tuple[str, ...], object]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> str:
        self.calls.append(list(argv))
        answer = self.answers.get(tuple(argv), self.answers.get((argv[0], argv[1]), ""))
        if isinstance(answer, Exception):
            raise answer
        return str(answer)


def recorded_runner(squeue: str = "squeue-22.05.json") -> FakeRunner:
    return FakeRunner({tuple(cli.SQUEUE_JSON_ARGV): read(squeue),
                       tuple(cli.NODES_ARGV): read("scontrol-nodes-22.05.txt"),
                       tuple(cli.SPRIO_ARGV): read("sprio-22.05.txt")})


from pipeswift_slurm.slurm.backends.site_limits import ASSOC_ARGV, PARTITIONS_ARGV, QOS_ARGV  # noqa: E402

LIMITS_ARGVS = [PARTITIONS_ARGV, QOS_ARGV, ASSOC_ARGV]
CFG = ExecConfig(tp=1, pp=4, dp=1, micro_batch_size=1, num_micro_batches=8, num_nodes=2, gpus_per_node=2)


def pending(job_id: int = 42, req: GpuRequest = GpuRequest(count=1), **kw: object) -> Job:
    return Job(job_id=job_id, state="PENDING", submit_time=0.0, gpu_request=req, opted_in=True, **kw)


# ------------------------------------------------------------------ squeue --json
def by_id(jobs: list[Job]) -> dict[int, Job]:
    return {j.job_id: j for j in jobs}


def test_squeue_json_2205_states_gpus_and_tokens() -> None:
    jobs = by_id(cli.parse_squeue_json(read("squeue-22.05.json")))
    assert sorted(jobs) == list(range(1, 10))
    assert jobs[1].state == "COMPLETED" and jobs[1].end_time and jobs[1].node_list == ("node1",)
    blocker = jobs[3]
    assert blocker.state == "RUNNING" and blocker.gpus == 32 and blocker.num_nodes == 4
    assert blocker.node_list == ("node1", "node2", "node3", "node4") and blocker.start_time
    per_node = jobs[4]
    assert per_node.pending and per_node.opted_in and per_node.gpus == 1
    assert per_node.gpu_request == GpuRequest("tres_per_node", 1, None, False)
    assert per_node.config is not None and per_node.config.num_nodes == 2 and per_node.config.pp == 2
    assert per_node.start_time is None  # a pending job's StartTime is only an estimate
    per_job = jobs[5]
    assert per_job.opted_in and per_job.gpu_request == GpuRequest("tres_per_job", 4) and per_job.gpus == 4
    assert per_job.time_limit_s == 30 * 60 and per_job.priority == 6000
    held = jobs[6]
    assert held.held and held.gpus == 4 and held.eligible_time is None and not held.opted_in
    assert not jobs[7].opted_in  # array meta-record
    assert jobs[8].gpu_request.field == "tres_per_task" and jobs[8].gpus == 2
    assert jobs[9].gpus == 0 and jobs[9].gpu_request.count == 0


@pytest.mark.parametrize("suffix", ["", "-typed"])
def test_squeue_json_2411_reads_as_2205(suffix: str) -> None:
    """The same record.sh jobs, recorded live on 22.05 and on 24.11 (its dialect: states as
    lists, numbers as {set, infinite, number}, gres/gpu spelling), read the same."""
    old = by_id(cli.parse_squeue_json(read("squeue-22.05%s.json" % suffix)))
    new = by_id(cli.parse_squeue_json(read("squeue-24.11%s.json" % suffix)))
    assert sorted(new) == sorted(old)  # --states=all: finished jobs too
    for job_id, job in new.items():
        ref = old[job_id]
        assert (job.state, job.num_nodes, job.gpus, job.opted_in, job.priority, job.config, job.time_limit_s,
                job.comment, job.held) == \
            (ref.state, ref.num_nodes, ref.gpus, ref.opted_in, ref.priority, ref.config, ref.time_limit_s,
             ref.comment, ref.held), job_id
        assert dataclasses.replace(job.gpu_request, slash=False) == ref.gpu_request, job_id
        assert job.gpu_request.slash == (job.gpu_request.count > 0 and job.gpu_request.field != "")


def test_squeue_json_2411_infinite_time_limit() -> None:
    data = json.loads(read("squeue-24.11.json"))
    data["jobs"][-1]["time_limit"] = {"set": True, "infinite": True, "number": 0}
    assert cli.parse_squeue_json(json.dumps(data))[-1].time_limit_s is None


def test_squeue_json_typed_and_empty() -> None:
    jobs = by_id(cli.parse_squeue_json(read("squeue-22.05-typed.json")))
    assert jobs[1].gpus == 2 and jobs[1].gpu_request.gpu_type == "a100"
    assert jobs[2].gpu_request == GpuRequest("tres_per_node", 1, "a100", False)
    assert jobs[3].gpu_request == GpuRequest("tres_per_job", 3, "a100", False)
    assert cli.parse_squeue_json(read("squeue-22.05-empty.json")) == []


@pytest.mark.parametrize("name", ["squeue-22.05-ctld-down.json", "squeue-v0.0.42-errors.json"])
def test_squeue_json_errors_raise(name: str) -> None:
    with pytest.raises(BackendError, match="squeue --json reported"):
        cli.parse_squeue_json(read(name))


def test_squeue_json_garbage_and_array_task() -> None:
    with pytest.raises(BackendError):
        cli.parse_squeue_json("squeue: error: something")
    task = {"job_id": 12, "array_job_id": 7, "array_task_id": 1, "array_task_string": "",
            "job_state": ["RUNNING"], "node_count": {"set": True, "infinite": False, "number": 1},
            "tres_per_node": "gres/gpu:a100:2", "gres_detail": ["gpu:a100:2(IDX:0-1)"],
            "comment": token.PROFILE_PREFIX + "args=W10=", "admin_comment": "(null)", "nodes": "node3"}
    (job,) = cli.parse_squeue_json(json.dumps({"jobs": [task, {"job_id": None}]}))
    assert job.job_id == 12 and job.running and job.opted_in and job.gpus == 2
    assert job.admin_comment == "" and job.node_list == ("node3",)


def test_bad_decision_token_is_ignored() -> None:
    rec = {"job_id": 5, "job_state": "PENDING", "admin_comment": token.DECISION_PREFIX + "tp=x"}
    (job,) = cli.parse_squeue_json(json.dumps({"jobs": [rec]}))
    assert job.config is None and job.admin_comment.startswith(token.DECISION_PREFIX)


# ------------------------------------------------------------------ text parsers
def test_kv_line_and_durations() -> None:
    kv = slurm_parse.parse_kv_line("NodeName=n1 OS=Linux 6.1 #1 SMP  RealMemory=5 Comment=a;b=c d")
    assert kv == {"NodeName": "n1", "OS": "Linux 6.1 #1 SMP", "RealMemory": "5", "Comment": "a;b=c d"}
    assert slurm_parse.parse_duration_s("01:00:00") == 3600
    assert slurm_parse.parse_duration_s("2-00:30:00") == 2 * 86400 + 1800
    assert slurm_parse.parse_duration_s("30") == 1800
    assert slurm_parse.parse_duration_s("UNLIMITED") is None


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_nodes_text_json_and_typed(version: str) -> None:
    nodes = cli.parse_scontrol_nodes(read("scontrol-nodes-%s.txt" % version))
    assert [(n.name, n.gpus, n.gpus_alloc) for n in nodes] == [("node%d" % i, 8, 8) for i in range(1, 5)]
    assert nodes[0].partitions == ("gpu",) and nodes[0].state == "ALLOCATED"
    if version == "22.05":  # (24.11's sinfo --json has another shape; the backend reads the text)
        assert [(n.gpus, n.gpus_alloc) for n in slurm_parse.parse_nodes_json(read("sinfo-22.05.json"))] == [(8, 8)] * 4
    typed = cli.parse_scontrol_nodes(read("scontrol-nodes-%s-typed.txt" % version))
    assert [(n.gpu_type, n.gpus, n.gpus_alloc, n.gpus_free) for n in typed] == \
        [("a100", 8, 2, 6), ("a100", 8, 0, 8)]
    new = slurm_parse.parse_nodes_json(read("scontrol-nodes-24.11.json"))
    assert [(n.gpus, n.gpus_alloc, n.usable) for n in new] == [(8, 3, True), (8, 0, True), (8, 0, True),
                                                               (8, 0, False)]


def test_a_node_that_takes_no_work_has_no_free_gpus_also_when_changed() -> None:
    from dataclasses import replace

    from pipeswift_slurm.core.model import Node

    idle = Node("n1", gpus=8, gpus_alloc=3, state="MIXED")
    assert (idle.usable, idle.gpus_free) == (True, 5)
    for state in ("DOWN+DRAIN", "idle+drain", "MIXED+NOT_RESPONDING", "FUTURE"):
        assert (replace(idle, state=state).usable, replace(idle, state=state).gpus_free) == (False, 0), state
    assert replace(idle, gpus_alloc=8).gpus_free == 0 and replace(idle, state="IDLE+RESERVED").gpus_free == 5
    assert replace(idle, state="DOWN") == replace(idle, state="DOWN") != idle


def test_nodes_from_tres_when_gres_missing() -> None:
    line = "NodeName=x Gres=(null) CfgTRES=cpu=4,gres/gpu=4 AllocTRES=gres/gpu=1 State=MIXED Partitions=a,b"
    (node,) = cli.parse_scontrol_nodes(line)
    assert (node.gpus, node.gpus_alloc, node.partitions) == (4, 1, ("a", "b"))


def test_sprio_and_gres_and_hostlist() -> None:
    assert cli.parse_sprio(read("sprio-22.05.txt")) == {4: 0, 5: 5000, 7: 0, 8: 0, 9: 0}
    assert cli.parse_sprio(read("sprio-24.11.txt")) == {4: 0, 5: 5000, 7: 0, 8: 0, 9: 0}
    assert cli.parse_sprio(read("sprio-22.05-empty.txt")) == {}
    assert cli.parse_sprio("7_1|1000|3\nbad line\n8|x|y") == {}
    assert slurm_parse.parse_gres("gres:gpu") == GpuRequest(count=1)
    assert slurm_parse.parse_gres("gres:mps:100,gres/gpu:h100:4") == GpuRequest(count=4, gpu_type="h100", slash=True)
    assert slurm_parse.parse_gres("gpu:2(IDX:0,3)") == GpuRequest(count=2)
    assert slurm_parse.parse_gres("gres/shard:2") is None and slurm_parse.parse_gres("(null)") is None
    assert slurm_parse.expand_hostlist("node[1-2,5],gpu[08-10],login") == (
        "node1", "node2", "node5", "gpu08", "gpu09", "gpu10", "login")
    assert slurm_parse.expand_hostlist("(null)") == () and slurm_parse.expand_hostlist("") == ()


# ------------------------------------------------------------------ argv builders (golden)
def test_update_argv_per_node() -> None:
    decision = Decision(42, config=CFG, site_factor=3000, time_limit_s=1501)
    assert cli.update_argv(decision, pending(), NOW) == [
        "scontrol", "update", "JobId=42", "NumNodes=2-2", "TresPerNode=gres:gpu:2", "TimeLimit=26",
        "SiteFactor=3000", "AdminComment=" + token.encode_decision(CFG, int(NOW))]


def test_update_argv_clears_the_first_looks_begin_time_only() -> None:
    """A job psbatch left for the first look (``look=1``, pending on BeginTime, never run)
    gets StartTime=now with the controller's update; a requeued job or a user's begin time
    keeps its begin time."""
    look = token.encode_profile(token.ProfileRequest(("--num-layers", "2"), first_look=True))
    decision = Decision(42, site_factor=7)
    first = cli.update_argv(decision, pending(comment=look, state_reason="BeginTime"), NOW)
    assert first == ["scontrol", "update", "JobId=42", "SiteFactor=7", "StartTime=now"]
    for job in (pending(comment=look, state_reason="BeginTime", restarts=1), pending(comment=look),
                pending(comment=token.encode_profile(token.ProfileRequest(("--num-layers", "2"))),
                        state_reason="BeginTime")):
        assert cli.update_argv(decision, job, NOW) == ["scontrol", "update", "JobId=42", "SiteFactor=7"]
    fresh = pending(comment=look, state_reason="None", eligible_time=NOW + 60)  # no reason yet
    assert "StartTime=now" in (cli.update_argv(decision, fresh, NOW) or [])
    cleared = pending(comment=look, state_reason="Priority", eligible_time=NOW - 5)  # done: once only
    assert cli.update_argv(decision, cleared, NOW) == ["scontrol", "update", "JobId=42", "SiteFactor=7"]
    assert not token.first_look_pending(pending(comment="x " + look[:20], state_reason="BeginTime"), NOW)


@pytest.mark.parametrize("req, expected", [
    (GpuRequest("tres_per_job", 4), "TresPerJob=gres:gpu:4"),
    (GpuRequest("tres_per_job", 3, "a100"), "TresPerJob=gres:gpu:a100:4"),
    (GpuRequest("tres_per_node", 1, "a100", True), "TresPerNode=gres/gpu:a100:2"),
])
def test_update_argv_keeps_the_jobs_gpu_form(req: GpuRequest, expected: str) -> None:
    argv = cli.update_argv(Decision(7, config=CFG), pending(7, req), NOW)
    assert argv is not None and argv[3:5] == ["NumNodes=2-2", expected]


def test_a_job_that_asked_for_no_gpus_is_never_given_any() -> None:
    """Issue 28 item 3(c): a resize of a GPU-less job (no tres_per_* GPU field) is refused,
    never turned into ``gres:gpu:N``; a SiteFactor alone still goes through."""
    job = pending(7, GpuRequest("tres_per_node", 0))
    with pytest.raises(BackendError, match="job 7 asks for no GPUs"):
        cli.update_argv(Decision(7, config=CFG, site_factor=5), job, NOW)
    assert cli.update_argv(Decision(7, site_factor=5), job, NOW) == ["scontrol", "update", "JobId=7", "SiteFactor=5"]


def test_update_argv_site_factor_only_and_nothing() -> None:
    assert cli.update_argv(Decision(9, site_factor=-5), pending(9), NOW) == \
        ["scontrol", "update", "JobId=9", "SiteFactor=-5"]
    assert cli.update_argv(Decision(9), pending(9), NOW) is None
    assert cli.apply_argvs(Decision(9, requeue=True, site_factor=1), pending(9), NOW) == [
        ["scontrol", "requeue", "9"], ["scontrol", "update", "JobId=9", "SiteFactor=1"]]


def test_update_argv_refuses_unresizable() -> None:
    with pytest.raises(BackendError, match="tres_per_task"):
        cli.update_argv(Decision(1, config=CFG), pending(1, GpuRequest("tres_per_task", 1)), NOW)
    odd = ExecConfig(tp=1, pp=3, dp=1, micro_batch_size=1, num_micro_batches=3, num_nodes=2)
    with pytest.raises(BackendError, match="whole GPU count"):
        cli.update_argv(Decision(1, config=odd), pending(1), NOW)
    with pytest.raises(BackendError, match="whitespace"):
        scontrol_argv._argv_value("AdminComment", "a b")


# ------------------------------------------------------------------ backend
def test_snapshot_uses_three_batched_calls_and_site_factors() -> None:
    run = recorded_runner()
    view = cli.SlurmCliBackend(run=run, clock=lambda: NOW).snapshot()
    assert run.calls == [cli.SQUEUE_JSON_ARGV, cli.NODES_ARGV, cli.SPRIO_ARGV, *LIMITS_ARGVS]
    assert view.now == NOW and len(view.nodes) == 4 and view.free_gpus == 0
    assert view.job(5).site_factor == 5000 and view.job(4).site_factor == 0
    assert {j.job_id for j in view.pending} == {4, 5, 6, 7, 8, 9}


def test_snapshot_partition_filter() -> None:
    run = recorded_runner()
    view = cli.SlurmCliBackend(run=run, partitions=["other"], read_site_factors=False).snapshot()
    assert view.jobs == () and view.nodes == ()


def test_snapshot_controller_down_is_backend_error() -> None:
    run = recorded_runner("squeue-22.05-ctld-down.json")
    with pytest.raises(BackendError) as info:
        cli.SlurmCliBackend(run=run).snapshot()
    assert not isinstance(info.value, JobGone)


def test_snapshot_sprio_failure_is_tolerated() -> None:
    run = recorded_runner()
    run.answers[tuple(cli.SPRIO_ARGV)] = BackendError("sprio failed (exit 1): priority/basic")
    assert cli.SlurmCliBackend(run=run).snapshot().job(5).site_factor == 0


@pytest.mark.parametrize("file_name, gone", [
    ("err-invalid-job-22.05.txt", True), ("err-finished-job-22.05.txt", True),
    ("err-ctld-down-22.05.txt", False), ("err-typed-untyped-22.05.txt", False),
    ("err-invalid-job-24.11.txt", True), ("err-finished-job-24.11.txt", True), ("err-ctld-down-24.11.txt", False)])
def test_apply_maps_scontrol_errors(file_name: str, gone: bool) -> None:
    message = "scontrol update failed (exit 1): " + read(file_name).splitlines()[0]
    run = FakeRunner({("scontrol", "update"): BackendError(message)})
    with pytest.raises(BackendError) as info:
        cli.SlurmCliBackend(run=run, clock=lambda: NOW).apply(Decision(42, site_factor=1), pending())
    assert isinstance(info.value, JobGone) is gone


def test_apply_runs_requeue_then_update_and_skips_unmanaged() -> None:
    run = FakeRunner({})
    backend = cli.SlurmCliBackend(run=run, clock=lambda: NOW)
    running = Job(job_id=3, state="RUNNING", submit_time=0.0, opted_in=True, gpus=8, gpu_request=GpuRequest(count=8))
    backend.apply(Decision(3, config=CFG, requeue=True), running)
    assert [c[:2] for c in run.calls] == [["scontrol", "requeue"], ["scontrol", "update"]]
    with pytest.raises(JobGone):
        backend.apply(Decision(3, config=CFG), running)
    backend.apply(Decision(8, site_factor=10), Job(job_id=8, state="PENDING", submit_time=0.0))
    assert len(run.calls) == 2


def test_subprocess_runner_errors() -> None:
    runner = cli.SubprocessRunner(timeout_s=5)
    assert runner([sys.executable, "-c", "print('ok')"]) == "ok\n"
    with pytest.raises(BackendError, match=r"exit 3\): boom"):
        runner([sys.executable, "-c", "import sys; sys.stderr.write('boom\\nmore\\n'); sys.exit(3)"])
    with pytest.raises(BackendError, match="command not found"):
        runner(["/nonexistent/squeue"])
    with pytest.raises(BackendError, match="timed out"):
        cli.SubprocessRunner(timeout_s=0.2)([sys.executable, "-c", "import time; time.sleep(5)"])


# ------------------------------------------------------------------ detection
def test_detect_prefers_matching_pyslurm() -> None:
    def probe(pyslurm: str | None, slurm: str | None, conf: bool = True, imports: bool = True,
              squeue: bool = True) -> str:
        return detect.detect_backend(lambda: pyslurm, lambda: slurm, lambda: conf, lambda: imports,
                                     lambda name: "/usr/bin/squeue" if squeue else None)

    assert probe("25.11.2", "slurm 25.11.7") == "pyslurm"
    assert probe("25.11.2", "slurm 22.05.8") == "cli"
    assert probe("25.11.2", "slurm 25.11.7", conf=False) == "cli"
    assert probe("25.11.2", "slurm 25.11.7", imports=False) == "cli"
    assert probe(None, "slurm 22.05.8") == "cli"
    with pytest.raises(BackendError, match="no Slurm found"):
        probe(None, None, squeue=False)


def test_detect_helpers(tmp_path: Path) -> None:
    assert detect.major_minor("slurm 22.05.8") == "22.05" == detect.major_minor("22.5.1")
    assert detect.major_minor("slurm-wlm 24.11.5") == "24.11" and detect.major_minor("") is None
    conf = tmp_path / "slurm.conf"
    assert not detect.slurm_conf_reachable({"SLURM_CONF": str(conf)})
    conf.write_text("ClusterName=x\n")
    assert detect.slurm_conf_reachable({"SLURM_CONF": str(conf)})


def test_detect_never_imports_pyslurm() -> None:
    code = ("import sys; from pipeswift_slurm.slurm.backends import detect, slurm_cli, pyslurm_; "
            "detect.slurm_conf_reachable(); assert 'pyslurm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ batched updates (apply_many)
# stderr of one 22.05 scontrol fed five updates on stdin (exit 1): server-side errors name
# their job, client-side parse errors do not.
BATCH_STDERR_2205 = ("Invalid job id specified for job 999999\n"
                     "Job is no longer pending execution for job 1\n"
                     "Invalid GRES specification (with and without type identification) for job 3\n"
                     "scontrol: error: Invalid TimeLimit value\n"
                     "Request aborted\n")


class FakeFeed:
    """Stands in for ``SubprocessRunner.feed``: records each stdin, answers per job line.

    ``errors`` maps job_id to a stderr line for that job's command ("" = no line); a job in
    ``loose`` makes the whole process exit 1 with an error that names no job.
    """

    def __init__(self, errors: dict[int, str] | None = None, loose: frozenset[int] = frozenset(),
                 raises: BackendError | None = None) -> None:
        self.errors = errors or {}
        self.loose = loose
        self.raises = raises
        self.inputs: list[list[str]] = []

    def __call__(self, argv: list[str], stdin_text: str) -> cli.CommandResult:
        assert argv == ["scontrol"]
        lines = stdin_text.splitlines()
        self.inputs.append(lines)
        if self.raises is not None:
            raise self.raises
        stderr = []
        for line in lines:
            job_id = int(line.split()[1].removeprefix("JobId="))
            if self.errors.get(job_id):
                stderr.append("%s for job %d" % (self.errors[job_id], job_id))
            if job_id in self.loose:
                stderr.append("scontrol: error: Invalid TimeLimit value")
        return cli.CommandResult(1 if stderr else 0, "scontrol: \n" * len(lines), "\n".join(stderr))


def batch_backend(feed: FakeFeed, run: FakeRunner | None = None) -> cli.SlurmCliBackend:
    return cli.SlurmCliBackend(run=run or FakeRunner({}), clock=lambda: NOW, feed=feed)


def test_batch_text_is_one_command_a_line() -> None:
    argvs = [cli.update_argv(Decision(5, site_factor=7), pending(5), NOW),
             cli.update_argv(Decision(6, config=CFG, site_factor=8), pending(6), NOW)]
    assert cli.batch_text([a for a in argvs if a]) == (
        "update JobId=5 SiteFactor=7\n"
        "update JobId=6 NumNodes=2-2 TresPerNode=gres:gpu:2 SiteFactor=8 AdminComment=%s\n"
        % token.encode_decision(CFG, int(NOW)))
    with pytest.raises(BackendError, match="cannot batch"):
        cli.batch_text([["scontrol", "update", "JobId=1", "Comment=a b"]])
    with pytest.raises(BackendError, match="cannot batch"):
        cli.batch_text([["sbatch", "x"]])


def test_parse_batch_errors_recorded_2205() -> None:
    by_job, loose = cli.parse_batch_errors(BATCH_STDERR_2205 + "Unable to contact slurm controller for job 7_3\n")
    assert by_job == {999999: "Invalid job id specified", 1: "Job is no longer pending execution",
                      3: "Invalid GRES specification (with and without type identification)",
                      7: "Unable to contact slurm controller"}
    assert loose == ["scontrol: error: Invalid TimeLimit value", "Request aborted"]
    assert cli.parse_batch_errors("") == ({}, [])


def test_apply_many_feeds_one_process() -> None:
    feed, run = FakeFeed(), FakeRunner({})
    items = [(Decision(j, config=CFG, site_factor=j), pending(j)) for j in range(10, 15)]
    items.append((Decision(15), pending(15)))  # nothing to change: no line
    backend = cli.SlurmCliBackend(run=run, clock=lambda: NOW, feed=feed, batch_processes=1)
    assert backend.apply_many(items) == [None] * 6
    assert run.calls == [] and len(feed.inputs) == 1
    assert [line.split()[1] for line in feed.inputs[0]] == ["JobId=%d" % j for j in range(10, 15)]
    assert all(line.split()[2:] == cli.update_argv(d, j, NOW)[3:]  # type: ignore[index]
               for line, (d, j) in zip(feed.inputs[0], items))


def test_apply_many_splits_long_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "BATCH_MAX_LINES", 4)
    items = [(Decision(j, site_factor=1), pending(j)) for j in range(10)]
    feed = FakeFeed()
    cli.SlurmCliBackend(run=FakeRunner({}), clock=lambda: NOW, feed=feed, batch_processes=1).apply_many(items)
    assert [len(lines) for lines in feed.inputs] == [4, 4, 2]
    feed = FakeFeed(errors={7: "Invalid job id specified"})
    out = batch_backend(feed).apply_many(items)  # 4 processes side by side: 3 + 3 + 3 + 1 lines
    assert sorted(len(lines) for lines in feed.inputs) == [1, 3, 3, 3]
    assert sorted(line for lines in feed.inputs for line in lines) == sorted(
        "update JobId=%d SiteFactor=1" % j for j in range(10))
    assert [i for i, r in enumerate(out) if r is not None] == [7] and isinstance(out[7], JobGone)


def test_apply_many_attributes_job_errors() -> None:
    feed = FakeFeed(errors={11: "Invalid job id specified", 12: "Job is no longer pending execution",
                            13: "Invalid GRES specification (with and without type identification)"})
    items = [(Decision(j, site_factor=1), pending(j)) for j in range(10, 15)]
    out = cli.SlurmCliBackend(run=FakeRunner({}), clock=lambda: NOW, feed=feed, batch_processes=1).apply_many(items)
    assert out[0] is None and out[4] is None
    assert isinstance(out[1], JobGone) and isinstance(out[2], JobGone)
    assert isinstance(out[3], BackendError) and not isinstance(out[3], JobGone)
    assert "with and without type" in str(out[3])
    assert len(feed.inputs) == 1  # every error named its job: no re-run


def test_apply_many_bisects_errors_naming_no_job() -> None:
    feed = FakeFeed(errors={3: "Invalid job id specified"}, loose=frozenset({6}))
    items = [(Decision(j, site_factor=1), pending(j)) for j in range(16)]
    out = cli.SlurmCliBackend(run=FakeRunner({}), clock=lambda: NOW, feed=feed, batch_processes=1).apply_many(items)
    assert [i for i, r in enumerate(out) if r is not None] == [3, 6]
    assert isinstance(out[3], JobGone)
    assert isinstance(out[6], BackendError) and not isinstance(out[6], JobGone)
    assert "Invalid TimeLimit value" in str(out[6])
    assert len(feed.inputs) <= 1 + 2 * 4  # halves down to the one job, not one run per job
    assert all("JobId=3 " not in line for lines in feed.inputs[1:] for line in lines)


def test_apply_many_failed_process_fails_its_batch() -> None:
    feed = FakeFeed(raises=BackendError("scontrol (3 commands on stdin) timed out after 60 s"))
    out = batch_backend(feed).apply_many([(Decision(j, site_factor=1), pending(j)) for j in range(3)])
    assert all(isinstance(r, BackendError) and not isinstance(r, JobGone) and "timed out" in str(r)
               for r in out)


def test_apply_many_keeps_apply_rules() -> None:
    feed, run = FakeFeed(), FakeRunner({})
    running = Job(job_id=3, state="RUNNING", submit_time=0.0, opted_in=True, gpus=8, gpu_request=GpuRequest(count=8))
    unmanaged = Job(job_id=8, state="PENDING", submit_time=0.0)
    odd = ExecConfig(tp=1, pp=3, dp=1, micro_batch_size=1, num_micro_batches=3, num_nodes=2)
    out = batch_backend(feed, run).apply_many([
        (Decision(3, config=CFG, requeue=True), running),  # requeue: its own commands, in order
        (Decision(3, config=CFG), running),                # resize of a running job: gone
        (Decision(8, site_factor=10), unmanaged),          # not opted in: never touched
        (Decision(9, config=odd), pending(9)),             # cannot be expressed: error
        (Decision(10, site_factor=5), pending(10))])
    assert out[0] is None and isinstance(out[1], JobGone) and out[2] is None
    assert isinstance(out[3], BackendError) and "whole GPU count" in str(out[3]) and out[4] is None
    assert [c[:2] for c in run.calls] == [["scontrol", "requeue"], ["scontrol", "update"]]
    assert feed.inputs == [["update JobId=10 SiteFactor=5"]]


def test_apply_many_without_feed_runs_one_command_per_job() -> None:
    run = FakeRunner({("scontrol", "update"): BackendError("scontrol update failed (exit 1): "
                                                           + read("err-invalid-job-22.05.txt").splitlines()[0])})
    backend = cli.SlurmCliBackend(run=run, clock=lambda: NOW)
    out = backend.apply_many([(Decision(j, site_factor=1), pending(j)) for j in (1, 2)])
    assert all(isinstance(r, JobGone) for r in out) and len(run.calls) == 2
    assert cli.SlurmCliBackend()._feed == cli.subprocess_runner.feed


def test_subprocess_runner_feed(tmp_path: Path) -> None:
    runner = cli.SubprocessRunner(timeout_s=5, env={"PATH": "/usr/bin:/bin", "TERM": "xterm"})
    code = "import os, sys; d = sys.stdin.read(); print(d.upper(), os.environ['TERM']); sys.exit(len(d))"
    done = runner.feed([sys.executable, "-c", code], "ab\n")
    assert done == cli.CommandResult(3, "AB\n dumb\n", "")
    with pytest.raises(BackendError, match="timed out"):
        cli.SubprocessRunner(timeout_s=0.2).feed([sys.executable, "-c", "import time; time.sleep(5)"], "")
    with pytest.raises(BackendError, match="command not found"):
        runner.feed([str(tmp_path / "scontrol")], "")


# ------------------------------------------------------------------ controller on a batching backend
ARGV = ["--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "512",
        "--max-position-embeddings", "512", "--micro-batch-size", "1", "--global-batch-size", "16",
        "--train-iters", "100"]


class ListPolicy:
    name = "list"

    def __init__(self, decisions: list[Decision]) -> None:
        self.decisions = decisions

    def decide(self, view: object, profiles: object, estimator: object) -> list[Decision]:
        return list(self.decisions)


class BatchingBackend:
    """A backend with ``apply_many`` whose outcomes are given per job id."""

    name = "batching"

    def __init__(self, jobs: list[Job], outcomes: dict[int, BackendError]) -> None:
        self.jobs, self.outcomes = jobs, outcomes
        self.batches: list[list[int]] = []

    def snapshot(self) -> ClusterView:
        return ClusterView(now=NOW, nodes=(Node("n1", gpus=8),), jobs=tuple(self.jobs))

    def apply(self, decision: Decision, job: Job) -> None:
        raise AssertionError("apply_many should have been used")

    def apply_many(self, items: list[tuple[Decision, Job]]) -> list[BackendError | None]:
        self.batches.append([d.job_id for d, _ in items])
        return [self.outcomes.get(d.job_id) for d, _ in items]


def test_controller_acts_through_one_apply_many() -> None:
    comment = token.encode_profile(token.ProfileRequest(tuple(ARGV), gpus=(1, 8)))
    jobs = [pending(j, comment=comment, gpus=1) for j in (1, 2, 3, 4)]
    backend = BatchingBackend(jobs, {2: JobGone("job 2 is gone"), 3: BackendError("slurmctld went away")})
    decisions = [Decision(j, time_limit_s=600 * j) for j in (1, 2, 3, 4)]
    controller = Controller(backend, ListPolicy(decisions), estimator=None)
    with pytest.raises(BackendError, match="went away"):
        controller.tick()
    assert backend.batches == [[1, 2, 3, 4]]
    controller.backend = BatchingBackend(jobs, {2: JobGone("job 2 is gone")})
    report = controller.tick()
    assert report.applied == [1, 3, 4] and report.skipped == [(2, "job 2 is gone")] and report.errors == []
    assert report.failed is None and [d.job_id for d in report.decisions] == [1, 2, 3, 4]


class ViewsBackend:
    """A backend that shows the given views in turn and accepts every decision."""

    name = "views"

    def __init__(self, views: list[ClusterView]) -> None:
        self.views = views

    def snapshot(self) -> ClusterView:
        return self.views.pop(0)

    def apply(self, decision: Decision, job: Job) -> None:
        pass


def test_a_first_look_is_cleared_even_when_the_policy_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """A policy that decides nothing for a job psbatch left for the first look (here: none
    at all) still gets its begin time cleared, through the CLI backend's update
    (StartTime=now only); a user's own begin time is left alone, and a dry run changes
    nothing, but says that the job waits out its first look."""
    look = token.encode_profile(token.ProfileRequest(("--num-layers", "2"), first_look=True))
    mine = token.encode_profile(token.ProfileRequest(("--num-layers", "2")))
    jobs = (pending(7, comment=look, state_reason="BeginTime", eligible_time=NOW + 50),
            pending(8, comment=mine, state_reason="BeginTime", eligible_time=NOW + 3600))
    view = ClusterView(now=NOW, nodes=(Node("n1", gpus=8),), jobs=jobs)
    run = recorded_runner()
    backend = cli.SlurmCliBackend(run=run, clock=lambda: NOW)
    backend.snapshot = lambda: view  # type: ignore[method-assign]
    report = Controller(backend, ListPolicy([]), estimator=None, settings=ControllerSettings(dry_run=False)).tick()
    assert [(d.job_id, d.reason) for d in report.decisions] == [(7, "first look: nothing to change")]
    updates = [argv for argv in run.calls if "update" in argv]
    assert updates == [["scontrol", "update", "JobId=7", "StartTime=now"]], run.calls
    assert "first look" not in caplog.text
    report = Controller(ViewsBackend([view]), ListPolicy([]), estimator=None,
                        settings=ControllerSettings(dry_run=True)).tick()
    assert [d.job_id for d in report.decisions] == [7] and report.applied == []
    assert "dry run: 1 job(s) wait out psbatch's first look" in caplog.text
    assert "PIPESWIFT_FIRST_LOOK_S=0" in caplog.text


def _views_the_policy_sees(views: list[ClusterView], store: object = None) -> list[ClusterView]:
    """The view the policy is given at each tick of a controller over ``views``."""
    seen: list[ClusterView] = []

    class Spy(ListPolicy):
        def decide(self, view: ClusterView, profiles: object, estimator: object) -> list[Decision]:
            seen.append(view)
            return []

    ticks = len(views)  # the backend hands them out one by one
    controller = Controller(ViewsBackend(views), Spy([]), estimator=None, store=store)
    for _ in range(ticks):
        controller.tick()
    return seen


def test_controller_tells_the_policy_a_requeued_jobs_earlier_runs_from_its_history() -> None:
    """squeue forgets a job's run time at a requeue and restarts its submit time; the
    policy still learns its GPU-seconds, from the runs the controller saw, so it plans the
    work the job has left, and its whole wait since its first submission less those runs,
    as the simulator counts it: a job requeued again and again keeps aging toward its bound."""
    from pipeswift_slurm.store.history import Store

    nodes = (Node("n1", gpus=8),)
    first = Job(job_id=5, state="PENDING", submit_time=NOW - 5000.0, gpus=8)
    ran = dataclasses.replace(first, state="RUNNING", start_time=NOW - 3600.0)
    requeued = Job(job_id=5, state="PENDING", submit_time=NOW + 30.0, gpus=4, restarts=1)
    seen = _views_the_policy_sees([ClusterView(now=NOW - 4000.0, nodes=nodes, jobs=(first,)),
                                   ClusterView(now=NOW, nodes=nodes, jobs=(ran,)),
                                   ClusterView(now=NOW + 60.0, nodes=nodes, jobs=(requeued,)),
                                   ClusterView(now=NOW + 120.0, nodes=nodes, jobs=(requeued,))], Store.in_memory())
    assert [j.attained_gpu_s for v in seen for j in v.jobs] == [0.0, 0.0, 8 * 3660.0, 8 * 3660.0]
    told = seen[-1].jobs[0]
    assert (told.submit_time, told.ran_s, told.gpus) == (NOW - 5000.0, 3660.0, 4)
    # waited 1,400 s before its run and 60 s since: not Slurm's 90 s since the requeue
    assert told.queued_s(NOW + 120.0) == 1460.0
    [without] = _views_the_policy_sees([ClusterView(now=NOW, nodes=nodes, jobs=(requeued,))])  # no history
    assert (without.jobs[0].attained_gpu_s, without.jobs[0].submit_time) == (0.0, NOW + 30.0)  # as squeue says


def test_controller_tells_the_policy_a_released_jobs_wait_since_it_was_eligible() -> None:
    """Slurm restarts a job's eligible time when a hold on it is released (measured on
    22.05): a long job the controller holds and releases would start its wait over at each
    release. The policy is told the eligible time the history kept."""
    from pipeswift_slurm.store.history import Store

    nodes = (Node("n1", gpus=8),)
    waiting = Job(job_id=5, state="PENDING", submit_time=NOW - 5000.0, eligible_time=NOW - 5000.0, gpus=8,
                  state_reason="Priority")
    held = dataclasses.replace(waiting, eligible_time=None, state_reason="JobHeldAdmin")
    released = dataclasses.replace(waiting, eligible_time=NOW + 30.0, state_reason="Resources")
    seen = _views_the_policy_sees([ClusterView(now=t, nodes=nodes, jobs=(j,)) for t, j in
                                   ((NOW - 4000.0, waiting), (NOW, held), (NOW + 60.0, released))],
                                  Store.in_memory())
    assert seen[-1].jobs[0].queued_s(NOW + 60.0) == 5060.0  # not Slurm's 30 s since the release


def test_snapshot_controller_down_says_so_after_a_ping() -> None:
    run = recorded_runner("squeue-22.05-ctld-down.json")
    run.answers[tuple(cli.PING_ARGV)] = BackendError("scontrol ping failed (exit 1): Slurmctld(primary) at vm is DOWN")
    with pytest.raises(BackendError) as info:
        cli.SlurmCliBackend(run=run).snapshot()
    assert str(info.value) == ("slurmctld is not answering: Slurmctld(primary) at vm is DOWN "
                               "(squeue --json reported: Failed while looking for jobs)")
    assert run.calls == [cli.SQUEUE_JSON_ARGV, cli.PING_ARGV]


def test_snapshot_controller_down_2411_says_so_after_a_ping() -> None:
    """24.11's squeue --json exits 1 with the reason on stderr (and prints nothing)."""
    run = recorded_runner()
    run.answers[tuple(cli.SQUEUE_JSON_ARGV)] = BackendError(
        "squeue --json failed (exit 1): " + read("squeue-24.11-ctld-down.stderr").strip())
    run.answers[tuple(cli.PING_ARGV)] = BackendError("scontrol ping failed (exit 1): Slurmctld(primary) at vm is DOWN")
    with pytest.raises(BackendError, match="^slurmctld is not answering: Slurmctld.primary. at vm is DOWN "
                                           r"\(squeue --json failed \(exit 1\): slurm_load_jobs error: Unable"):
        cli.SlurmCliBackend(run=run).snapshot()
    assert run.calls == [cli.SQUEUE_JSON_ARGV, cli.PING_ARGV]
