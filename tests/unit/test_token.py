"""Profile and decision tokens: round trips, malformed input, and tokens inside user text."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeswift_slurm.core import token
from pipeswift_slurm.core.model import ExecConfig
from pipeswift_slurm.core.token import (
    DECISION_PREFIX,
    MAX_TOKEN_CHARS,
    PROFILE_PREFIX,
    ProfileRequest,
    TokenError,
    decode_decision,
    decode_profile,
    encode_decision,
    encode_profile,
)

_pos = st.integers(1, 10_000)
_argv = st.lists(st.text(max_size=30), max_size=12).map(tuple)


@st.composite
def profile_requests(draw: st.DrawFn) -> ProfileRequest:
    lo = draw(st.integers(1, 512))
    return ProfileRequest(
        argv=draw(_argv),
        gpus=draw(st.none() | st.just((lo, draw(st.integers(lo, 1024))))),
        min_micro_batch_size=draw(st.none() | _pos),
        allowed_pp=draw(st.none() | st.lists(st.integers(1, 64), min_size=1, max_size=5).map(tuple)),
        job_class=draw(st.text(alphabet="abcXYZ019-_.", max_size=20)),
        world_size=draw(st.none() | _pos),
    )


@st.composite
def exec_configs(draw: st.DrawFn) -> ExecConfig:
    optional = st.none() | st.integers(0, 64)
    return ExecConfig(tp=draw(_pos), pp=draw(_pos), dp=draw(_pos), micro_batch_size=draw(_pos),
                      num_micro_batches=draw(_pos), cp=draw(_pos), vp=draw(_pos), num_nodes=draw(_pos),
                      gpus_per_node=draw(st.integers(0, 64)), decoder_first_pipeline_num_layers=draw(optional),
                      decoder_last_pipeline_num_layers=draw(optional))


@settings(max_examples=150, deadline=None)
@given(req=profile_requests())
def test_profile_token_round_trips(req: ProfileRequest) -> None:
    token = encode_profile(req)
    assert token.startswith(PROFILE_PREFIX)
    assert token.split() == [token]  # one whitespace-free word, whatever the argv holds
    assert decode_profile(token) == req


@settings(max_examples=50, deadline=None)
@given(req=profile_requests(), before=st.text(max_size=40), after=st.text(max_size=40))
def test_profile_token_found_inside_user_text(req: ProfileRequest, before: str, after: str) -> None:
    text = "{} {} {}".format(before.replace("pswift", "p"), encode_profile(req), after)
    assert decode_profile(text) == req


def test_profile_token_job_class_is_sanitised() -> None:
    req = ProfileRequest(argv=("--num-layers", "2"), job_class="my class;gpus=1-1")
    decoded = decode_profile(encode_profile(req))
    assert decoded.job_class == "myclassgpus1-1"
    assert decoded.gpus is None


def test_profile_token_keeps_argv_with_spaces_and_semicolons() -> None:
    argv = ("--data-path", "/data/my corpus;v2", "--lr=1e-4", "")
    text = f"Megatron run for the NLP team (ask bob) {encode_profile(ProfileRequest(argv=argv))} please; thanks"
    assert decode_profile(text).argv == argv


@settings(max_examples=150, deadline=None)
@given(cfg=exec_configs(), at=st.integers(0, 2 ** 40))
def test_decision_token_round_trips(cfg: ExecConfig, at: int) -> None:
    token = encode_decision(cfg, at)
    assert token.startswith(DECISION_PREFIX)
    assert token.split() == [token]
    assert decode_decision(token) == (cfg, at)


def test_decision_token_found_inside_admin_comment() -> None:
    cfg = ExecConfig(tp=2, pp=4, dp=2, micro_batch_size=1, num_micro_batches=64, vp=2, num_nodes=2,
                     gpus_per_node=8)
    text = f"resized by admin on monday  {encode_decision(cfg, 1700000000)}  see ticket 42"
    assert decode_decision(text) == (cfg, 1700000000)


def test_both_tokens_in_one_text_do_not_confuse_each_other() -> None:
    cfg = ExecConfig(tp=1, pp=2, dp=1, micro_batch_size=2, num_micro_batches=8, num_nodes=1, gpus_per_node=2)
    req = ProfileRequest(argv=("--num-layers", "4"), gpus=(2, 8))
    text = f"{encode_decision(cfg, 5)} {encode_profile(req)}"
    assert decode_profile(text) == req
    assert decode_decision(text) == (cfg, 5)


def _b64(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode()


@pytest.mark.parametrize("text", [
    "",
    "no token here",
    "pswift1;args=!!!notbase64",
    "pswift1;args=" + _b64({"not": "a list"}),
    "pswift1;args=" + _b64(["ok", 3]),
    "pswift1;args=" + _b64(["ok"]) + ";gpus=four-8",
    "pswift1;args=" + _b64(["ok"]) + ";mbmin=x",
    "pswift1;args=" + _b64(["ok"]) + ";pp=2,x",
    "pswift1;args=" + _b64(["ok"]) + ";gpus=8-4",  # a range the planner would search as empty
    "pswift1;args=" + _b64(["ok"]) + ";gpus=0-4",
    "pswift1;args=" + _b64(["ok"]) + ";pp=0,2",
    "pswift1;args=" + _b64(["ok"]) + ";mbmin=0",
    "pswift1;args=" + _b64(["ok"]) + ";noequals",
    "pswift1;" + "x" * MAX_TOKEN_CHARS,
])
def test_malformed_profile_tokens_raise_token_error(text: str) -> None:
    with pytest.raises(TokenError):
        decode_profile(text)


@pytest.mark.parametrize("text", [
    "",
    "pswift1;args=W10=",
    "pswift-decision1;tp=2;pp=1;dp=1;mbs=1",  # lacks M
    "pswift-decision1;tp=two;pp=1;dp=1;mbs=1;M=4",
    "pswift-decision1;tp=2;pp=1;dp=1;mbs=1;M=4;at=yesterday",
    "pswift-decision1;tp=2;pp",
])
def test_malformed_decision_tokens_raise_token_error(text: str) -> None:
    with pytest.raises(TokenError):
        decode_decision(text)


def test_token_error_is_a_value_error() -> None:
    assert issubclass(TokenError, ValueError)


def test_the_decision_token_keeps_the_size_a_job_was_submitted_with() -> None:
    """A resized job's size before the resize is kept in our AdminComment (``asked=``),
    which only the admin writes, and read back by ``submitted_gpus``; the user's Comment is
    never asked. Written only when the size changes; garbage there reads as no record."""
    cfg = ExecConfig(tp=1, pp=2, dp=2, micro_batch_size=1, num_micro_batches=8, num_nodes=1, gpus_per_node=4)
    grown = token.encode_decision(cfg, 1, asked_gpus=1)
    assert grown.endswith(";asked=1") and token.submitted_gpus(grown, 4) == 1
    assert token.submitted_gpus("ticket 42 " + grown, 4) == 1  # our word among the admin's
    same = token.encode_decision(cfg, 1, asked_gpus=4)
    assert "asked" not in same and token.submitted_gpus(same, 4) == 4
    assert token.submitted_gpus("", 4) == 4 and token.submitted_gpus(grown.replace("asked=1", "asked=x"), 4) == 4
    assert token.decode_decision(grown) == (cfg, 1)  # the launcher reads the config as before
    # a second resize keeps the first size, not the one in between: the backends' one way
    regrown = token.decision_token(cfg, 2, True, grown, 2)
    assert regrown.endswith(";hold=1;asked=1") and token.submitted_gpus(regrown, 4) == 1
    assert "asked" not in token.decision_token(cfg, 2, False, "", 4)  # submitted at this size
