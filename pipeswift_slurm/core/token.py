"""The two small texts that travel inside a Slurm job.

* The *profile request* that ``psbatch`` writes into the job's ``Comment`` (user-editable,
  so the controller treats it as a request and re-validates it): the Megatron argv and the
  flexibility the user allows.
* The *decision token* the controller writes into ``AdminComment`` (admin-only): the
  ExecConfig it chose. The launcher checks it against the real allocation before use.

Both are plain ``key=value`` text: they are parsed, never evaluated. No I/O here.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Optional

from pipeswift_slurm.core.model import ExecConfig, Job

PROFILE_PREFIX = "pswift1;"
DECISION_PREFIX = "pswift-decision1;"
MAX_TOKEN_CHARS = 60000  # bounded parsing effort on user text

_CONFIG_KEYS = {
    "tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "vp": "vp", "mbs": "micro_batch_size",
    "M": "num_micro_batches", "nodes": "num_nodes", "gpn": "gpus_per_node",
    "first": "decoder_first_pipeline_num_layers", "last": "decoder_last_pipeline_num_layers",
}


class TokenError(ValueError):
    """A token that is malformed; callers treat the job as having no token."""


@dataclass(frozen=True)
class ProfileRequest:
    """What psbatch recorded: Megatron argv plus the user's flexibility options.

    ``gpus`` is (min, max) or None (rigid at the submitted size); ``min_micro_batch_size``
    and ``allowed_pp`` narrow the planner's search; ``job_class`` keys calibration;
    ``partitions`` are the partitions the job may run in (Slurm's ``-p a,b`` or psbatch's
    ``--pipeswift-partitions``; empty: only the one it was submitted to). A request: the
    controller moves a job only among the partitions it manages. ``first_look``: psbatch
    submitted the job with a short begin time for the controller's first decision to clear
    (``first_look_pending``).
    """

    argv: tuple[str, ...]
    gpus: Optional[tuple[int, int]] = None
    min_micro_batch_size: Optional[int] = None
    allowed_pp: Optional[tuple[int, ...]] = None
    job_class: str = ""
    world_size: Optional[int] = None
    partitions: tuple[str, ...] = ()
    first_look: bool = False


def _kv(text: str, prefix: str) -> dict[str, str]:
    if len(text) > MAX_TOKEN_CHARS:
        raise TokenError("token longer than %d characters" % MAX_TOKEN_CHARS)
    start = text.find(prefix)
    if start < 0:
        raise TokenError("no %r token" % prefix)
    body = text[start + len(prefix):].split()[0] if text[start + len(prefix):].strip() else ""
    pairs: dict[str, str] = {}
    for item in body.split(";"):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise TokenError("token item %r has no '='" % item)
        pairs[key] = value
    return pairs


# Numbers in a token: GPU counts, sizes and epoch seconds; anything longer is not one of ours.
MAX_TOKEN_INT = 10 ** 13
MAX_PARTITIONS = 16  # partitions one job may name
MAX_PARTITION_CHARS = 64  # Slurm partition names are short; longer is not one


def partition_names(text: str, what: str = "parts") -> tuple[str, ...]:
    """A comma-separated list of partition names, checked: letters, digits, '_', '-' and
    '.' only, at most MAX_PARTITION_CHARS each, at most MAX_PARTITIONS, no repeats kept.

    Raises:
        TokenError: an empty, too long or odd name, or too many.
    """
    names = [n for n in text.split(",")]
    if len(names) > MAX_PARTITIONS:
        raise TokenError("%s names %d partitions; at most %d" % (what, len(names), MAX_PARTITIONS))
    for name in names:
        if not name or len(name) > MAX_PARTITION_CHARS or not all(c.isascii() and (c.isalnum() or c in "_-.")
                                                                  for c in name):
            raise TokenError("%s=%r is not a partition name (letters, digits, '_', '-', '.'; up to %d)"
                             % (what, name[:40], MAX_PARTITION_CHARS))
    return tuple(dict.fromkeys(names))


def token_int(value: str, what: str) -> int:
    if not value or len(value) > 14 or not all("0" <= c <= "9" for c in value) or int(value) > MAX_TOKEN_INT:
        raise TokenError("%s=%r is not a whole number in digits 0-9 up to %d" % (what, value[:40], MAX_TOKEN_INT))
    return int(value)


def encode_profile(req: ProfileRequest) -> str:
    """Render a ProfileRequest as one whitespace-free token (argv as base64 JSON)."""
    argv_b64 = base64.urlsafe_b64encode(json.dumps(list(req.argv)).encode()).decode()
    parts = [PROFILE_PREFIX.rstrip(";"), "args=" + argv_b64]
    if req.gpus:
        parts.append("gpus=%d-%d" % req.gpus)
    if req.min_micro_batch_size:
        parts.append("mbmin=%d" % req.min_micro_batch_size)
    if req.allowed_pp:
        parts.append("pp=" + ",".join(str(p) for p in req.allowed_pp))
    if req.world_size:
        parts.append("world=%d" % req.world_size)
    if req.job_class:
        parts.append("class=" + "".join(c for c in req.job_class if c.isalnum() or c in "-_."))
    if req.partitions:
        parts.append("parts=" + ",".join(partition_names(",".join(req.partitions))))
    if req.first_look:
        parts.append("look=1")
    return ";".join(parts)


def carries_profile(comment: str) -> bool:
    """Whether a job's Comment carries a profile request (the job opted in to pipeswift);
    whether that request is valid is ``decode_profile``'s and the controller's to say."""
    return PROFILE_PREFIX in comment


def decode_profile(text: str) -> ProfileRequest:
    """Parse a profile token found anywhere in ``text`` (e.g. a job comment).

    Raises:
        TokenError: no token, or a malformed one.
    """
    kv = _kv(text, PROFILE_PREFIX)
    try:
        argv = json.loads(base64.urlsafe_b64decode(kv.get("args", "").encode()).decode())
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise TokenError("args is not base64 JSON: %s" % str(exc)[:200]) from None
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise TokenError("args is not a list of strings")
    gpus = None
    if "gpus" in kv:
        lo, _, hi = kv["gpus"].partition("-")
        gpus = (token_int(lo, "gpus"), token_int(hi or lo, "gpus"))
        if not 1 <= gpus[0] <= gpus[1]:
            raise TokenError("gpus=%s: need 1 <= A <= B in gpus=A-B" % kv["gpus"][:40])
    allowed = tuple(token_int(p, "pp") for p in kv["pp"].split(",")) if kv.get("pp") else None
    mbmin = token_int(kv["mbmin"], "mbmin") if "mbmin" in kv else None
    if 0 in (allowed or ()) or mbmin == 0:
        raise TokenError("pp and mbmin are counts of at least 1")
    world = token_int(kv["world"], "world") if kv.get("world") else None
    partitions = partition_names(kv["parts"]) if kv.get("parts") else ()
    return ProfileRequest(tuple(argv), gpus, mbmin, allowed, kv.get("class", ""), world, partitions,
                          kv.get("look") == "1")


def first_look_pending(job: Job, now: float) -> bool:
    """Whether a pending job waits only for the controller's first look: psbatch gave it a
    begin time a minute or so ahead (``look=1`` in its profile token) so that the controller
    sizes and places it before Slurm may start it; the controller's first update of it
    clears that begin time (StartTime=now), once: the begin time is still ahead (its
    eligible time after ``now``, or Slurm's reason says so; a job just submitted may show
    no reason yet). A begin time the user asked for carries no such mark, and a requeued
    job's is Slurm's own. The mark is user text: it can only start the user's own job
    sooner, as the user could."""
    ahead = job.state_reason == "BeginTime" or (job.eligible_time is not None and job.eligible_time > now)
    if not ahead or job.restarts or PROFILE_PREFIX not in job.comment:
        return False
    try:
        return decode_profile(job.comment).first_look
    except TokenError:
        return False


def encode_decision(config: ExecConfig, decided_at: int, held: bool = False, asked_gpus: Optional[int] = None) -> str:
    """Render the decision token written to AdminComment (``hold=1`` marks a job the
    controller held, so it only ever releases its own holds; ``asked=N``, when the config
    has another size, the GPUs the job was submitted with: ``submitted_gpus``)."""
    parts = [DECISION_PREFIX.rstrip(";")]
    for key, attr in _CONFIG_KEYS.items():
        value = getattr(config, attr)
        if value is not None:
            parts.append("%s=%d" % (key, value))
    parts.append("at=%d" % decided_at)
    if held:
        parts.append("hold=1")
    if asked_gpus and asked_gpus != config.gpus:
        parts.append("asked=%d" % asked_gpus)
    return ";".join(parts)


def submitted_gpus(admin_comment: str, gpus: int) -> int:
    """The GPUs a job was submitted with: the ``asked=`` our decision token keeps in its
    AdminComment (which only the admin writes) once the controller resized it, else its
    size now (``gpus``). Never the size a user's Comment claims: a job claiming more than it
    asked for would have its growth counted as its own, past the lending bars."""
    try:
        asked = _kv(admin_comment, DECISION_PREFIX).get("asked")
        return token_int(asked, "asked") if asked else gpus
    except TokenError:
        return gpus


def decision_token(config: ExecConfig, decided_at: int, held: bool, admin_comment: str, gpus: int) -> str:
    """The decision token for a job whose AdminComment is ``admin_comment`` and whose size
    now is ``gpus``: ``encode_decision`` with the GPUs it was submitted with carried over
    (``submitted_gpus``), the one way every backend writes it."""
    return encode_decision(config, decided_at, held=held, asked_gpus=submitted_gpus(admin_comment, gpus))


def held_by_controller(admin_comment: str) -> bool:
    """Whether the decision token in ``admin_comment`` says the controller held the job."""
    try:
        return _kv(admin_comment, DECISION_PREFIX).get("hold") == "1"
    except TokenError:
        return False


def decode_decision(text: str) -> tuple[ExecConfig, int]:
    """Parse a decision token found in ``text``; returns (config, decided_at epoch s).

    Raises:
        TokenError: no token, or a malformed one.
    """
    kv = _kv(text, DECISION_PREFIX)
    values: dict[str, Optional[int]] = {}
    for key, attr in _CONFIG_KEYS.items():
        values[attr] = token_int(kv[key], key) if kv.get(key) else None
    for required in ("tp", "pp", "dp", "micro_batch_size", "num_micro_batches"):
        if values[required] is None:
            raise TokenError("decision token lacks %s" % required)
    cfg = ExecConfig(
        tp=values["tp"], pp=values["pp"], dp=values["dp"],  # type: ignore[arg-type]
        micro_batch_size=values["micro_batch_size"],  # type: ignore[arg-type]
        num_micro_batches=values["num_micro_batches"],  # type: ignore[arg-type]
        cp=values["cp"] or 1, vp=values["vp"] or 1, num_nodes=values["num_nodes"] or 1,
        gpus_per_node=values["gpus_per_node"] or 0,
        decoder_first_pipeline_num_layers=values["decoder_first_pipeline_num_layers"],
        decoder_last_pipeline_num_layers=values["decoder_last_pipeline_num_layers"],
    )
    return cfg, token_int(kv.get("at", "0"), "at")
