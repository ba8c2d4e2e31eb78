"""sbatch's command line as psbatch reads it: its options, psbatch's own
``--pipeswift-*`` settings, and the GPU request they add up to.

Owns: the table of sbatch 22.05-25.11 options (how each takes its value); splitting an
argv the way sbatch's getopt_long does (``scan_argv``); taking out and checking psbatch's
own options (``strip_own_options``, ``own_options``); and resolving option values (script
header < environment < command line) into the GPUs the job asks for. Pure: no I/O.

Must not import SQLAlchemy, click, the store, any backend or ``megatron``: psbatch must
start fast.
"""

from __future__ import annotations

import re
from typing import Mapping, NamedTuple, Optional, Sequence

OWN_PREFIX = "--pipeswift"

# sbatch 22.05-25.11 options (slurm_opt.c; checked against 22.05 and 24.11 `sbatch --help`),
# by how they take a value.
SHORT = {"a": "array", "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task",
          "C": "constraint", "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile",
          "G": "gpus", "i": "input", "J": "job-name", "L": "licenses", "m": "distribution",
          "M": "clusters", "n": "ntasks", "N": "nodes", "o": "output", "p": "partition", "q": "qos",
          "S": "core-spec", "t": "time", "w": "nodelist", "x": "exclude",
          "h": "help", "H": "hold", "k": "no-kill", "O": "overcommit", "Q": "quiet",
          "s": "oversubscribe", "u": "usage", "v": "verbose", "V": "version", "W": "wait"}
LONG_REQUIRED = frozenset("""
    account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint
    container container-id core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline
    delay-boot dependency distribution error export export-file extra extra-node-info gid gpu-bind
    gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint input job-name
    kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu
    mincpus network nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node
    ntasks-per-socket open-mode output partition power prefer priority profile qos reservation
    resv-ports segment signal sockets-per-node switches thread-spec threads-per-core time time-min
    tmp tres-bind tres-per-task uid wait-all-nodes wckey wrap exclude
    """.split())
LONG_OPTIONAL = frozenset("exclusive get-user-env nice no-kill oom-kill-step propagate".split())
LONG_FLAGS = frozenset("""
    contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet reboot requeue
    spread-job test-only usage use-min-nodes verbose version wait
    """.split())
LONG_ALL = LONG_REQUIRED | LONG_OPTIONAL | LONG_FLAGS
NO_STDIN = frozenset({"help", "usage", "version", "wrap"})  # sbatch reads no script then
_OWN_KEYS = {"gpus": "gpus", "min-micro-batch": "min_micro_batch_size", "pp": "allowed_pp", "class": "job_class"}


class PsbatchError(Exception):
    """psbatch's own logic cannot enrich this job; it is submitted unchanged."""


class PsbatchUsageError(PsbatchError):
    """An own option whose value must not be guessed at (a partition name): nothing is
    submitted, psbatch says why in one line and exits 2."""


# psbatch's own keys (``--pipeswift-KEY VALUE``, ``#PSWIFT KEY=VALUE``); ``--pipeswift=on|off|check``
OWN_KEYS = ("gpus", "min-micro-batch", "pp", "class", "partitions")


class Opt(NamedTuple):
    """One sbatch option as found in an argv: canonical long name, value, argv span."""

    name: str
    value: Optional[str]
    start: int
    end: int  # exclusive


class Scan(NamedTuple):
    """An sbatch argv split into options (per het component) and the script position."""

    opts: list[Opt]
    script_index: Optional[int]
    components: int
    unknown: list[str]


# ---------------------------------------------------------------- argv


def _long_name(text: str) -> Optional[str]:
    """Resolve a long option name as getopt_long does: exact, else a unique prefix."""
    if text in LONG_ALL:
        return text
    hits = [n for n in LONG_ALL if n.startswith(text)]
    return hits[0] if len(hits) == 1 else None


def _scan_long(argv: Sequence[str], i: int, unknown: list[str]) -> Opt:
    body, eq, inline = argv[i][2:].partition("=")
    if body.startswith("pipeswift"):  # psbatch's own: --pipeswift=off, --pipeswift-KEY[=]VALUE
        # only a known key takes the next word as its value: an unknown one (a typo) must
        # not swallow the script's name
        if eq or body[len("pipeswift-"):] not in OWN_KEYS or i + 1 >= len(argv):
            return Opt(body, inline if eq else None, i, i + 1)
        return Opt(body, argv[i + 1], i, i + 2)
    name = _long_name(body)
    if name is None:
        unknown.append(argv[i])
        return Opt(body, inline if eq else None, i, i + 1)
    if eq or name not in LONG_REQUIRED:
        return Opt(name, inline if eq else None, i, i + 1)
    if i + 1 >= len(argv):
        return Opt(name, None, i, i + 1)
    return Opt(name, argv[i + 1], i, i + 2)


def _scan_short(argv: Sequence[str], i: int, unknown: list[str]) -> list[Opt]:
    out: list[Opt] = []
    text = argv[i]
    for k in range(1, len(text)):
        name = SHORT.get(text[k])
        if name is None:
            unknown.append("-" + text[k])
            continue
        if name in LONG_REQUIRED:
            rest = text[k + 1:]
            if rest:
                return out + [Opt(name, rest, i, i + 1)]
            value = argv[i + 1] if i + 1 < len(argv) else None
            return out + [Opt(name, value, i, i + 2 if value is not None else i + 1)]
        out.append(Opt(name, None, i, i + 1))
    return out


def scan_argv(argv: Sequence[str], *, stop_at_script: bool = True) -> Scan:
    """Split sbatch's argv (without argv[0]) the way sbatch's getopt_long does.

    Options stop at the first positional word (the script; getopt's ``+`` mode), or at
    ``--``. A lone ``:`` separates heterogeneous job components. Unknown options are
    listed (sbatch will judge them) and taken as flags.
    """
    opts: list[Opt] = []
    unknown: list[str] = []
    components, i = 1, 0
    while i < len(argv):
        arg = argv[i]
        if arg == ":":
            components += 1
            i += 1
        elif arg == "--":
            return Scan(opts, i + 1 if i + 1 < len(argv) else None, components, unknown)
        elif arg.startswith("--"):
            opts.append(_scan_long(argv, i, unknown))
            i = opts[-1].end
        elif arg.startswith("-") and len(arg) > 1:
            found = _scan_short(argv, i, unknown)
            opts.extend(found)
            i = found[-1].end if found else i + 1
        elif stop_at_script:
            return Scan(opts, i, components, unknown)
        else:
            i += 1
    return Scan(opts, None, components, unknown)


class OwnOptions(NamedTuple):
    """psbatch's own settings: from ``--pipeswift-*`` options and ``#PSWIFT`` lines."""

    off: bool = False
    gpus: Optional[tuple[int, int]] = None
    min_micro_batch_size: Optional[int] = None
    allowed_pp: Optional[tuple[int, ...]] = None
    job_class: str = ""
    declared: bool = False  # a #PSWIFT line or --pipeswift option says "this is a Megatron job"
    partitions: tuple[str, ...] = ()  # partitions the job may be moved to beside its own


# an own option took the last word as its value, leaving no script (the compiled front end
# says the same when the Python psbatch cannot start)
LAST_WORD_TAKEN = ("--%s took the last word, %s, as its value, which leaves no script; write --%s=VALUE before"
                   " the script")


def strip_own_options(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Remove ``--pipeswift[-KEY][=VALUE]`` items from the option part of ``argv``.

    Returns the argv sbatch should see and the (KEY, VALUE) pairs found ("" for
    ``--pipeswift=off``). ``--pipeswift-KEY VALUE`` (separate value) is accepted too.
    Words after the script belong to the script and are never touched.

    Raises:
        PsbatchUsageError: an unknown ``--pipeswift-KEY`` (sbatch would refuse an unknown
            option too; a typo of ``--pipeswift=check`` must not submit the job).
    """
    scan = scan_argv(argv)
    own_spans = [o for o in scan.opts if o.name.startswith("pipeswift")]
    if not own_spans:
        return list(argv), []
    for o in own_spans:
        if o.name.rstrip("-") != "pipeswift" and o.name[len("pipeswift-"):] not in OWN_KEYS:
            raise PsbatchUsageError("unknown option --%s (known: %s, --pipeswift=off, --pipeswift=check)"
                                    % (o.name, ", ".join("--pipeswift-" + k for k in OWN_KEYS)))
    last = own_spans[-1]
    if scan.script_index is None and last.end == len(argv) and last.end - last.start == 2:
        try:  # the last word went to an own option as a value it cannot be: it was the script
            own_options([(last.name[len("pipeswift-"):], last.value or "")])
        except PsbatchError:
            raise PsbatchUsageError(LAST_WORD_TAKEN % (last.name, last.value, last.name)) from None
    drop = {i for o in own_spans for i in range(o.start, o.end)}
    pairs = [(o.name[len("pipeswift"):].lstrip("-"), o.value or "") for o in own_spans]
    return [a for i, a in enumerate(argv) if i not in drop], pairs


def _count(text: str) -> int:
    """A count in an own option: at least 1, in digits as the profile token carries it
    (``token.token_int``, what the controller reads back). Raises ValueError."""
    from pipeswift_slurm.core.token import token_int

    value = token_int(text, "value")
    if value < 1:
        raise ValueError("below 1")
    return value


def _parse_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    return _count(lo), _count(hi if sep else lo)


def own_options(pairs: Sequence[tuple[str, str]]) -> OwnOptions:
    """Build OwnOptions from (key, value) pairs (later pairs win).

    Raises:
        PsbatchError: unknown key or a malformed value.
        PsbatchUsageError: a malformed ``partitions`` list.
    """
    values: dict[str, object] = {"declared": bool(pairs)}
    for key, value in pairs:
        try:
            if key == "":
                if value not in ("on", "off"):
                    raise PsbatchError("bad value %r for --pipeswift (on or off; check only on the command line)"
                                       % value)
                values["off"] = value == "off"
            elif key == "gpus":
                lo, hi = _parse_range(value)
                if lo > hi:
                    raise ValueError("empty range")
                values["gpus"] = (lo, hi)
            elif key == "min-micro-batch":
                values["min_micro_batch_size"] = _count(value)
            elif key == "pp":
                values["allowed_pp"] = tuple(_count(p) for p in value.split(","))
            elif key == "class":
                values["job_class"] = value
            elif key == "partitions":
                values["partitions"] = checked_partitions(value, "--pipeswift-partitions")
            else:
                raise PsbatchError("unknown option --pipeswift-%s (known: %s, --pipeswift=off, --pipeswift=check)"
                                   % (key, ", ".join(OWN_KEYS)))
        except ValueError:
            raise PsbatchError("bad value %r for --pipeswift-%s" % (value, key)) from None
    return OwnOptions(**values)  # type: ignore[arg-type]


def checked_partitions(text: str, what: str) -> tuple[str, ...]:
    """The partition names of a comma-separated list, checked as the controller checks the
    profile token's ``parts=`` (``token.partition_names``).

    Raises:
        PsbatchUsageError: an empty or odd name, or too many.
    """
    from pipeswift_slurm.core.token import TokenError, partition_names

    try:
        return partition_names(text, what)
    except TokenError as exc:
        raise PsbatchUsageError(str(exc)) from None


def job_partitions(values: Mapping[str, Optional[str]], own: OwnOptions) -> tuple[str, ...]:
    """The partitions the profile request records (``parts=``): those of ``-p a,b`` when it
    names several, and with ``--pipeswift-partitions`` those of ``-p`` (if given) and the
    option's; () for a job that may run only in the partition it asked for. A ``-p`` list
    the token cannot carry is left out (sbatch judges it; the job is not moved).

    Raises:
        PsbatchUsageError: together they name more partitions than a token carries.
    """
    try:
        asked = checked_partitions(values.get("partition") or "", "-p")
    except PsbatchUsageError:
        asked = ()
    if not own.partitions:
        return asked if len(asked) > 1 else ()
    return checked_partitions(",".join(asked + own.partitions), "-p and --pipeswift-partitions")


def gpu_count(text: Optional[str]) -> Optional[int]:
    """The GPU count of ``[type:]N`` (None when absent or unreadable: ``-4`` or ``a100:x4`` is
    no count, and a job asking for it is submitted as written, for sbatch to judge)."""
    count = (text or "").strip().rpartition(":")[2]
    return int(count) if count.isascii() and count.isdigit() else None


def requested_world(values: dict[str, Optional[str]]) -> tuple[Optional[int], Optional[int]]:
    """(total GPUs, GPUs per node) the job asks for, by the rule the controller reads Slurm's
    view of the job with (``core.gres``); (None, None) without a GPU request, or for GPUs per
    socket (how many sockets a node gives is Slurm's to say), so that such a job goes as
    written. Called for Megatron jobs only (it imports the core).

    ``values`` maps sbatch long option names to values (last one wins). Nodes: the
    minimum of ``-N a[-b]``, default 1; tasks: ``--ntasks``, else nodes x
    ``--ntasks-per-node``.
    """
    from pipeswift_slurm.core.gres import gres_gpu, job_gpus

    m = re.match(r"\d+", values.get("nodes") or "1")
    nodes = max(1, int(m.group(0))) if m else 1
    gres = gres_gpu(values.get("gres") or "")
    counts = {"tres_per_node": gpu_count(values.get("gpus-per-node")) or (gres[0] if gres else None),
              "tres_per_job": gpu_count(values.get("gpus")),
              "tres_per_task": gpu_count(values.get("gpus-per-task")),
              "tres_per_socket": gpu_count(values.get("gpus-per-socket"))}
    tasks = gpu_count(values.get("ntasks"))
    if not tasks and gpu_count(values.get("ntasks-per-node")):
        tasks = nodes * (gpu_count(values.get("ntasks-per-node")) or 1)
    asked = job_gpus(counts, nodes, tasks)
    if asked is None or asked[0] == "tres_per_socket":
        return None, None
    total = asked[1]
    return total, (total // nodes if total % nodes == 0 else None)


_TIME_RE = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def time_limit_s(text: Optional[str]) -> Optional[int]:
    """sbatch's ``--time`` in seconds (None: absent, unlimited or unreadable). Forms, as
    sbatch reads them: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    m = _TIME_RE.fullmatch((text or "").strip())
    if m is None:
        return None
    days, first, second, third = (int(g) if g else None for g in m.groups())
    if days is not None:  # D-H[:M[:S]]
        return ((days * 24 + (first or 0)) * 60 + (second or 0)) * 60 + (third or 0)
    if third is not None:  # H:M:S
        return ((first or 0) * 60 + (second or 0)) * 60 + third
    return (first or 0) * 60 + (second or 0)  # M or M:S


# sbatch's input variables that bear on the GPUs a job asks for and the partitions it may
# run in (its man page, INPUT ENVIRONMENT VARIABLES). There is no SBATCH_COMMENT: sbatch
# ignores it (seen on 22.05; not in 24.11's list either), so a Comment comes from the
# script or the command line only.
_ENV_OPTIONS = {"SBATCH_GPUS": "gpus", "SBATCH_GPUS_PER_NODE": "gpus-per-node",
                "SBATCH_GPUS_PER_TASK": "gpus-per-task", "SBATCH_GRES": "gres", "SBATCH_PARTITION": "partition"}


def effective_options(cmdline: Sequence[Opt], header: Sequence[str],
                      environ: Mapping[str, str]) -> dict[str, Optional[str]]:
    """Option values as sbatch resolves them: script header < environment < command line."""
    values: dict[str, Optional[str]] = {o.name: o.value for o in scan_argv(header, stop_at_script=False).opts}
    values.update({opt: environ[var] for var, opt in _ENV_OPTIONS.items() if environ.get(var)})
    values.update({o.name: o.value for o in cmdline})
    return values
