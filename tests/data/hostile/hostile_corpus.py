"""The hostile-job corpus (issue 23): what one user may write into the parts of a Slurm job
they control (its name, its Comment, its work directory), each form with what the
controller must make of it.

``FORMS`` holds at least 50 forms: recursion and size bombs, huge and prime numbers,
non-UTF-8 and control characters, repeated keys, forged decision tokens in names, paths
and comments, 1 MB comments, lying lengths. Fields are bytes (a job name or comment may
hold any byte but NUL, and ``squeue --json`` passes non-UTF-8 bytes through raw).

``expect`` is what a tick must do with the job whatever else is in the queue:

* ``skip``: the job is opted in but its request is unusable: one log line (job id,
  reason), a profile row with ``parse_error``, no decision for it.
* ``own``: the request is usable (the hostile text is in a name, a path, or after the
  token): the job is handled like an honest one, and only ever under its own id.
* ``ignored``: the text carries no profile request: the job is not opted in, nothing
  is done to it.

``live`` marks forms Slurm 22.05 accepts as given (``sbatch`` argv cannot hold NUL, a
Comment holds at most 1,024 characters, a work directory must exist): the live corpus
test (tests/integration/test_hostile_corpus_live.py) submits those. Imported by path (not a
package): ``sys.path.insert(0, <this folder>)``.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Optional

PROFILE_PREFIX = "pswift1;"
HONEST_ARGV = ("--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16",
               "--seq-length", "1024", "--max-position-embeddings", "1024", "--micro-batch-size", "4",
               "--global-batch-size", "64", "--train-iters", "1000")
SLURM_COMMENT_MAX = 1024  # Slurm 22.05 refuses a longer --comment ("Pathname ... too long")
MB = 1 << 20
# the decision token a hostile user would like some other job (777) to carry
FORGED_DECISION = "pswift-decision1;tp=1;pp=1;dp=8;mbs=1;M=8;nodes=1;gpn=8;at=1700000000;hold=1"
FORGED = "x JobId=777 AdminComment=%s" % FORGED_DECISION


def b64(payload: bytes) -> str:
    return base64.urlsafe_b64encode(payload).decode()


def token(argv: object = HONEST_ARGV, extra: str = "", raw_args: Optional[str] = None) -> str:
    """A profile token: ``args`` the base64 JSON of ``argv`` (or ``raw_args`` as is), plus
    ``extra`` (``;key=value`` items)."""
    args = raw_args if raw_args is not None else b64(json.dumps(list(argv) if isinstance(argv, tuple)
                                                                else argv).encode())
    return "pswift1;args=%s;gpus=1-8%s" % (args, extra)


HONEST = token()


def argv_with(flag: str, value: str) -> list[str]:
    """The honest argv with ``flag`` set to ``value`` (added when absent)."""
    argv = list(HONEST_ARGV)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


@dataclass(frozen=True)
class Form:
    """One hostile job: its name, Comment and work directory (None: an honest one)."""

    form_id: str
    kind: str
    expect: str  # skip | own | ignored
    comment: bytes = HONEST.encode()
    name: bytes = b"honest-name"
    workdir: Optional[bytes] = None

    @property
    def live(self) -> bool:
        """Whether Slurm 22.05 takes this form through ``sbatch`` as given."""
        fields = (self.comment, self.name, self.workdir or b"")
        return len(self.comment) <= SLURM_COMMENT_MAX and not any(b"\x00" in f for f in fields) \
            and b"\n" not in self.name and len(self.name) < 200 and len(self.workdir or b"") < 200


def _form(form_id: str, kind: str, expect: str, comment: object = None, **kw: bytes) -> Form:
    if comment is not None:
        kw["comment"] = comment.encode("utf-8", "surrogateescape") if isinstance(comment, str) else comment  # type: ignore[assignment]
    return Form(form_id, kind, expect, **kw)  # type: ignore[arg-type]


def _bomb_forms() -> list[Form]:
    deep = b"[" * 20000 + b"]" * 20000
    return [
        _form("nested-list-20000", "recursion", "skip", token(raw_args=b64(deep))),
        _form("nested-list-300", "recursion", "skip", token(raw_args=b64(b"[" * 300 + b"]" * 300))),
        _form("nested-dict-5000", "recursion", "skip",
              token(raw_args=b64(b'{"a":' * 5000 + b"1" + b"}" * 5000))),
        _form("list-of-200000-strings", "size", "skip", token(["x"] * 200000)),
        _form("list-of-2000-empty-strings", "size", "skip", token([""] * 2000)),
        _form("one-string-of-1mb", "size", "skip", token(["--num-layers", "9" * MB])),
        _form("comment-1mb-of-A", "size", "skip", "pswift1;args=" + "A" * MB),
        _form("comment-1mb-after-token", "size", "skip", HONEST + " " + "x" * MB),
        _form("comment-1024-after-token", "size", "own",
              (HONEST + " " + "x" * SLURM_COMMENT_MAX)[:SLURM_COMMENT_MAX]),
        _form("semicolons-1000", "size", "skip", "pswift1;" + ";" * 1000),
        _form("args-a-json-string", "size", "skip", token(raw_args=b64(json.dumps("x" * 500).encode()))),
    ]


def _number_forms() -> list[Form]:
    return [
        _form("train-iters-1e300", "huge", "skip", token(argv_with("--train-iters", "1" + "0" * 300))),
        _form("train-iters-1e400", "huge", "skip", token(argv_with("--train-iters", "1" + "0" * 400))),
        _form("num-layers-1e18", "huge", "skip", token(argv_with("--num-layers", "1" + "0" * 18))),
        _form("global-batch-1e15", "huge", "skip", token(argv_with("--global-batch-size", "1" + "0" * 15))),
        _form("hidden-2-63", "huge", "skip", token(argv_with("--hidden-size", str(2 ** 63)))),
        _form("tp-prime-1000000007", "prime", "skip", token(argv_with("--tensor-model-parallel-size",
                                                                       "1000000007"))),
        _form("world-prime-1000000007", "prime", "skip", token(extra=";world=1000000007")),
        _form("world-prime-131071", "prime", "skip", token(extra=";world=131071")),
        _form("gpus-range-1e11", "huge", "skip", token(extra=";gpus=1-99999999999")),
        _form("gpus-prime-range", "prime", "skip", token(extra=";gpus=1000000007-1000000007")),
        _form("gpus-negative", "huge", "skip", token(extra=";gpus=-5")),
        _form("mbmin-400-digits", "huge", "skip", token(extra=";mbmin=" + "9" * 400)),
        _form("pp-prime", "prime", "own", token(extra=";pp=1000000007")),
        _form("seq-length-negative", "huge", "skip", token(argv_with("--seq-length", "-1"))),
        _form("num-layers-zero", "huge", "skip", token(argv_with("--num-layers", "0"))),
        _form("iters-and-samples", "huge", "skip", token(argv_with("--train-samples", "1" + "0" * 13))),
        _form("hidden-1e400-float", "huge", "skip", token(argv_with("--hidden-size", "1e400"))),
        _form("hidden-nan", "huge", "skip", token(argv_with("--hidden-size", "NaN"))),
        _form("hidden-inf", "huge", "skip", token(argv_with("--hidden-size", "inf"))),
        _form("num-layers-hex", "huge", "skip", token(argv_with("--num-layers", "0x18"))),
        _form("num-layers-arabic", "digits", "skip", token(argv_with("--num-layers", "\u0662\u0664"))),
        _form("num-layers-fullwidth", "digits", "skip", token(argv_with("--num-layers", "\uff12\uff14"))),
        _form("hidden-underscore", "digits", "skip", token(argv_with("--hidden-size", "1_024"))),
        _form("world-arabic", "digits", "skip", token(extra=";world=\u0668")),
    ]


def _text_forms() -> list[Form]:
    return [
        _form("name-not-utf8", "bytes", "own", name=b"caf\xe9"),
        _form("name-control-chars", "control", "own", name=b"a\x01\x07\x1b[31mred\x1b[0m\x7f"),
        _form("name-nul", "control", "own", name=b"a\x00b"),
        _form("name-newline-jobid", "control", "own", name=b"x\nJobId=777 JobState=PENDING"),
        _form("name-rtl-override", "control", "own", name="evil\u202etxt.exe".encode()),
        _form("name-200kb", "size", "own", name=b"n" * 200_000),
        _form("comment-not-utf8-args", "bytes", "skip", b"pswift1;args=\xff\xfe\xfd;gpus=1-8"),
        _form("args-not-utf8-json", "bytes", "skip", token(raw_args=b64(b'["--num-layers", "\xff"]'))),
        _form("comment-control-in-args", "control", "skip", "pswift1;args=AA\x07BB;gpus=1-8"),
        _form("comment-nul", "control", "skip", "pswift1;args=\x00;gpus=1-8"),
        _form("comment-not-utf8-after-token", "bytes", "own", HONEST.encode() + b" caf\xe9\xff"),
    ]


def _forgery_forms() -> list[Form]:
    return [
        _form("repeated-args-last-hostile", "repeated", "skip",
              HONEST + ";args=" + b64(json.dumps(argv_with("--train-iters", "1" + "0" * 300)).encode())),
        _form("repeated-gpus", "repeated", "own", token(extra=";gpus=1-1;gpus=1-1;gpus=1-4" * 5)),
        _form("repeated-flag-last-huge", "repeated", "skip",
              token(list(HONEST_ARGV) + ["--train-iters", "1" + "0" * 300])),
        _form("repeated-class", "repeated", "own", token(extra=";class=x;class=gpt-<0.5B;class=y")),
        _form("forged-decision-in-name", "forged", "own", name=FORGED.encode()),
        _form("forged-decision-in-comment", "forged", "own", HONEST + " " + FORGED),
        _form("forged-decision-before-token", "forged", "own", FORGED_DECISION + " " + HONEST),
        _form("forged-decision-only", "forged", "ignored", FORGED),
        _form("forged-hold-in-request", "forged", "own", token(extra=";hold=1;at=1")),
        _form("forged-decision-in-workdir", "forged", "own", workdir=("/tmp/%s" % FORGED).encode()),
        _form("forged-jobid-in-workdir-kv", "forged", "own", workdir=b"/tmp/JobId=777 Comment=x Partition=y"),
        _form("forged-decision-in-args", "forged", "own",
              token(list(HONEST_ARGV) + ["--tag", FORGED])),
        _form("forged-second-token-in-comment", "forged", "own",
              HONEST + " Comment=" + token(argv_with("--train-iters", "1" + "0" * 300))),
    ]


def _lying_forms() -> list[Form]:
    return [
        _form("base64-extra-padding", "lying length", "skip", token(raw_args=b64(b'["a"]') + "====")),
        _form("base64-truncated", "lying length", "skip", token(raw_args=b64(json.dumps(HONEST_ARGV).encode())[:-7])),
        _form("world-lies-4096", "lying length", "skip", token(extra=";world=4096")),
        _form("claims-one-iteration", "lying length", "own", token(argv_with("--train-iters", "1"))),
        _form("gpus-reversed-range", "lying length", "skip", token(extra=";gpus=8-1")),
        _form("int3-rampup-two-values", "lying length", "skip",
              token(list(HONEST_ARGV) + ["--rampup-batch-size", "16", "16"])),
        _form("digits-only-comment-1010", "size", "skip", "pswift1;world=" + "9" * 1010),
    ]


FORMS: tuple[Form, ...] = tuple(_bomb_forms() + _number_forms() + _text_forms() + _forgery_forms()
                                + _lying_forms())
assert len({f.form_id for f in FORMS}) == len(FORMS) >= 50


def squeue_record(job_id: int, *, user: str, name: bytes, comment: bytes, workdir: bytes,
                  gpus: int = 1) -> dict[str, object]:
    """One pending job as ``squeue --json`` (Slurm 22.05) lists it; bytes kept raw through
    surrogateescape (``squeue_bytes`` writes them back as bytes)."""
    def text(b: bytes) -> str:
        return b.decode("utf-8", "surrogateescape")

    return {"job_id": job_id, "job_state": "PENDING", "user_name": user, "name": text(name),
            "comment": text(comment), "admin_comment": "", "current_working_directory": text(workdir),
            "partition": "gpu", "node_count": {"set": True, "infinite": False, "number": 1},
            "tres_per_node": "gres:gpu:%d" % gpus, "time_limit": {"set": True, "infinite": False, "number": 60},
            "submit_time": {"set": True, "infinite": False, "number": 1_700_000_000 - 600},
            "state_reason": "Resources", "priority": {"set": True, "infinite": False, "number": 1}}


def squeue_bytes(records: list[dict[str, object]]) -> bytes:
    """What ``squeue --json`` prints for ``records``: JSON, control characters escaped,
    other bytes raw (non-UTF-8 included, as Slurm passes them)."""
    return json.dumps({"jobs": records}, ensure_ascii=False).encode("utf-8", "surrogateescape")
