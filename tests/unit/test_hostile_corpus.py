"""Issue 23's hostile-job corpus (tests/data/hostile/hostile_corpus.py: 50+ forms) through a
whole tick with fake Slurm commands: ``squeue --json`` lists three honest opted-in jobs, the
hostile job (5) and another user's job (777, not opted in), bytes as Slurm prints them.
Whatever the form: the tick ends quickly, every honest job gets its decision, no command
names a job but the honest ones (and the hostile one itself when its request is usable:
``own``), and an unusable request is skipped with one log line (job id and reason) and a
profile row with its ``parse_error``. The same corpus runs live in
tests/integration/test_hostile_corpus.py."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest

from pipeswift_slurm.core.costmodel import CostModel
from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.hardware import get_gpu_type
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.slurm.backends import slurm_cli as cli
from pipeswift_slurm.slurm.controller import Controller
from pipeswift_slurm.store.history import Store

DATA = Path(__file__).resolve().parents[1] / "data"
sys.path.insert(0, str(DATA / "hostile"))
from hostile_corpus import FORMS, HONEST, Form, squeue_bytes, squeue_record  # noqa: E402

NODES = (DATA / "slurm" / "scontrol-nodes-22.05.txt").read_text()
HONEST_IDS = (1, 2, 3)
HOSTILE_ID, OTHER_ID = 5, 777
TICK_CPU_S = 2.0  # the acceptance's bound for a tick; a tick here takes milliseconds


class FakeSlurm:
    """Answers squeue --json with the queue's bytes (decoded as SubprocessRunner does) and
    scontrol show node with a 22.05 recording; records every other command."""

    def __init__(self, queue: bytes) -> None:
        self.queue = queue.decode("utf-8", "replace")
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> str:
        if argv[:2] == ["squeue", "--json"]:
            return self.queue
        if argv[:2] == ["scontrol", "-d"]:
            return NODES
        self.calls.append(list(argv))
        return ""


def queue_for(form: Form) -> bytes:
    records = [squeue_record(i, user="alice", name=b"honest", comment=HONEST.encode(), workdir=b"/home/alice")
               for i in HONEST_IDS]
    records.append(squeue_record(HOSTILE_ID, user="eve", name=form.name, comment=form.comment,
                                 workdir=form.workdir or b"/home/eve"))
    records.append(squeue_record(OTHER_ID, user="bob", name=b"bob's", comment=b"no request here",
                                 workdir=b"/home/bob"))
    return squeue_bytes(records)


def test_the_corpus_has_every_kind_the_issue_lists() -> None:
    kinds = {f.kind for f in FORMS}
    assert len(FORMS) >= 50
    assert {"recursion", "size", "huge", "prime", "bytes", "control", "repeated", "forged", "lying length"} <= kinds
    assert any(len(f.comment) >= 1 << 20 for f in FORMS)  # 1 MB comments
    assert {"name", "workdir", "comment"} <= {w for f in FORMS for w in ("name", "workdir", "comment")
                                                 if b"JobId=777" in (getattr(f, w) or b"")}
    assert sum(f.live for f in FORMS) >= 30


@pytest.mark.parametrize("form", FORMS, ids=[f.form_id for f in FORMS])
def test_one_hostile_job_is_skipped_or_its_own_and_every_honest_job_handled(
        form: Form, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    slurm = FakeSlurm(queue_for(form))
    backend = cli.SlurmCliBackend(run=slurm, read_site_factors=False, read_limits=False)
    store = Store.from_url("sqlite:///%s" % (tmp_path / "h.sqlite"))
    controller = Controller(backend, get_policy("pipeswift"), Estimator(CostModel(get_gpu_type("A100-80GB")), 8),
                            store)
    caplog.set_level(logging.WARNING)
    started = time.process_time()
    report = controller.tick()
    assert time.process_time() - started < TICK_CPU_S

    own = {HOSTILE_ID} if form.expect == "own" else set()
    decided = {d.job_id for d in report.decisions}
    assert set(HONEST_IDS) <= decided and decided <= set(HONEST_IDS) | own
    named = {int(a.split("=", 1)[1]) for c in slurm.calls for a in c if a.startswith("JobId=")}
    assert named <= set(HONEST_IDS) | own, slurm.calls
    assert not report.errors and report.failed is None

    lines = [r.getMessage() for r in caplog.records if "job %d" % HOSTILE_ID in r.getMessage()]
    errors = dict((row[0], row[1]) for row in _parse_errors(store))
    if form.expect == "skip":
        assert len(lines) == 1 and "\n" not in lines[0] and "profile request ignored" in lines[0], lines
        assert errors.get(HOSTILE_ID), errors
    else:
        assert lines == [] and not errors.get(HOSTILE_ID)
    assert not any("job %d" % i in r.getMessage() for r in caplog.records for i in HONEST_IDS + (OTHER_ID,))


def _parse_errors(store: Store) -> list[tuple[int, str]]:
    from sqlalchemy import text

    with store.engine.connect() as conn:
        return [(r[0], r[1]) for r in conn.execute(text("SELECT job_id, parse_error FROM profiles"))]
