"""Requests are user text that the controller reads as the Slurm admin on every tick: each one
is parsed with bounds (ASCII digits, sane limits, bounded sizes), and whatever a request holds,
reading it ends quickly in a profile or in one of the two errors the controller handles
(TokenError, MegatronArgError). Issue 23: "every job is parsed in isolation, with bounds"."""

from __future__ import annotations

import base64
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeswift_slurm.core.megatron import MegatronArgError, profile_from_argv
from pipeswift_slurm.core.model import Job
from pipeswift_slurm.core.token import ProfileRequest, TokenError, decode_profile, encode_profile
from pipeswift_slurm.slurm.controller import parse_profile

SHAPE = ["--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
         "--global-batch-size", "256", "--micro-batch-size", "2", "--train-iters", "100"]


def _with(flag: str, value: str) -> list[str]:
    argv = list(SHAPE)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


@pytest.mark.parametrize("flag, value", [
    ("--train-iters", "1" + "0" * 300),           # 10^300: overflowed a float
    ("--num-layers", "1" + "0" * 18),              # _divisors over 10^18
    ("--global-batch-size", "1000000000000000"),
    ("--tensor-model-parallel-size", "1000000007"),
    ("--num-layers", "\u0662\u0664"),              # Arabic-Indic digits: int() reads 24
    ("--num-layers", "\uff12\uff14"),              # fullwidth digits
    ("--num-layers", "2_4"),
    ("--num-layers", "+24"),
    ("--num-layers", " 24"),
    ("--hidden-size", "1e3"),
])
def test_numbers_beyond_reason_or_not_in_plain_digits_are_refused(flag: str, value: str) -> None:
    started = time.process_time()
    with pytest.raises(MegatronArgError) as err:
        profile_from_argv(_with(flag, value))
    assert err.value.flag == flag
    assert time.process_time() - started < 1.0


def _job(comment: str, gpus: int = 8) -> Job:
    return Job(1, "PENDING", 0.0, gpus=gpus, opted_in=True, comment=comment)


def _token(payload: object, extra: str = "") -> str:
    return "pswift1;args=%s%s" % (base64.urlsafe_b64encode(json.dumps(payload).encode()).decode(), extra)


@pytest.mark.parametrize("comment", [
    _token([["x"]] * 3),                                  # not a list of strings
    "pswift1;args=" + base64.urlsafe_b64encode(("[" * 20000 + "]" * 20000).encode()).decode(),  # recursion
    _token(SHAPE, ";world=1000000007"),                   # a prime world of 10^9
    _token(SHAPE, ";gpus=1-99999999999"),
    _token(SHAPE, ";world=\u0668"),
    _token(SHAPE, ";gpus=1_0-2"),
    _token(SHAPE, ";mbmin=" + "9" * 400),
    "pswift1;args=" + "A" * 70000,                        # past the token size bound
    _token(SHAPE) + " JobId=777 AdminComment=pswift-decision1;tp=1",
    "pswift1;args=%%%;world=4",
])
def test_hostile_comments_end_quickly_in_a_reason_never_a_crash(comment: str) -> None:
    started = time.process_time()
    profile, why = parse_profile(_job(comment), 8, 64)
    assert time.process_time() - started < 1.0
    if profile is None:
        assert why  # the controller logs it and leaves the job as submitted
    else:
        assert profile.max_gpus <= 64


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(flag_values=st.lists(st.tuples(st.sampled_from(SHAPE[::2] + ["--tensor-model-parallel-size",
                                                                   "--pipeline-model-parallel-size"]),
                                      st.one_of(st.integers(-10, 10 ** 20).map(str), st.text(max_size=12))),
                            max_size=6),
       extra=st.text(max_size=40), world=st.integers(0, 10 ** 13))
def test_fuzz_the_request_parser(flag_values: list[tuple[str, str]], extra: str, world: int) -> None:
    """Whatever the argv and token fields: a profile or one of the handled errors, fast."""
    argv = list(SHAPE)
    for flag, value in flag_values:
        argv += [flag, value]
    for comment in (encode_profile(ProfileRequest(tuple(argv), world_size=world or None)) + extra,
                    _token(argv, extra)):
        started = time.process_time()
        try:
            decode_profile(comment)
        except TokenError:
            pass
        profile, why = parse_profile(_job(comment), 8, 1024)
        assert profile is not None or why
        assert time.process_time() - started < 1.0
