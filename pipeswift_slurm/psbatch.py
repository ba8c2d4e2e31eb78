"""``psbatch``: a drop-in for ``sbatch`` that opts Megatron pipeline jobs into PipeSwift.

Owns: reading sbatch's argv and ``#SBATCH`` header far enough to find the script, the
GPU request and the comment; recognising the Megatron training command in a script (text
only, never executed; bounded effort); recording the job's profile request in its
Comment (``token.encode_profile``); routing that command through ``pipeswift-launch``;
and running the real ``sbatch`` with stdout, stderr and exit code passed straight
through. Everything it does not own reaches sbatch unchanged, and any failure of its own
logic submits the job exactly as written, with one warning line.

Must not import SQLAlchemy, click, the store or any backend: psbatch never touches a
database, and it must start fast (Megatron parsing is imported only for Megatron jobs).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
from typing import NamedTuple, Optional, Sequence

log = logging.getLogger(__name__)

LAUNCHER = "pipeswift-launch"
MAX_SCRIPT_BYTES = 1 << 20  # bigger scripts go through unchanged (bounded effort)
MAX_LOGICAL_LINES = 400  # physical lines one shell command may span
OWN_PREFIX = "--pipeswift"

# sbatch 22.05-25.11 options (slurm_opt.c), by how they take a value.
_SHORT = {"a": "array", "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task",
          "C": "constraint", "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile",
          "G": "gpus", "i": "input", "J": "job-name", "L": "licenses", "m": "distribution",
          "M": "clusters", "n": "ntasks", "N": "nodes", "o": "output", "p": "partition", "q": "qos",
          "S": "core-spec", "t": "time", "w": "nodelist", "x": "exclude",
          "h": "help", "H": "hold", "k": "no-kill", "O": "overcommit", "Q": "quiet",
          "s": "oversubscribe", "u": "usage", "v": "verbose", "V": "version", "W": "wait"}
_LONG_REQUIRED = frozenset("""
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
_LONG_OPTIONAL = frozenset("exclusive get-user-env nice no-kill propagate".split())
_LONG_FLAGS = frozenset("""
    contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet reboot requeue
    spread-job test-only usage use-min-nodes verbose version wait
    """.split())
_LONG_ALL = _LONG_REQUIRED | _LONG_OPTIONAL | _LONG_FLAGS
_NO_STDIN = frozenset({"help", "usage", "version", "wrap"})  # sbatch reads no script then
_OWN_KEYS = {"gpus": "gpus", "min-micro-batch": "min_micro_batch_size", "pp": "allowed_pp", "class": "job_class"}


class PsbatchError(Exception):
    """psbatch's own logic cannot enrich this job; it is submitted unchanged."""


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
    if text in _LONG_ALL:
        return text
    hits = [n for n in _LONG_ALL if n.startswith(text)]
    return hits[0] if len(hits) == 1 else None


def _scan_long(argv: Sequence[str], i: int, unknown: list[str]) -> Opt:
    body, eq, inline = argv[i][2:].partition("=")
    if body.startswith("pipeswift"):  # psbatch's own: --pipeswift=off, --pipeswift-KEY[=]VALUE
        if eq or body == "pipeswift" or i + 1 >= len(argv):
            return Opt(body, inline if eq else None, i, i + 1)
        return Opt(body, argv[i + 1], i, i + 2)
    name = _long_name(body)
    if name is None:
        unknown.append(argv[i])
        return Opt(body, inline if eq else None, i, i + 1)
    if eq or name not in _LONG_REQUIRED:
        return Opt(name, inline if eq else None, i, i + 1)
    if i + 1 >= len(argv):
        return Opt(name, None, i, i + 1)
    return Opt(name, argv[i + 1], i, i + 2)


def _scan_short(argv: Sequence[str], i: int, unknown: list[str]) -> list[Opt]:
    out, text = [], argv[i]
    for k in range(1, len(text)):
        name = _SHORT.get(text[k])
        if name is None:
            unknown.append("-" + text[k])
            continue
        if name in _LONG_REQUIRED:
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


def strip_own_options(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Remove ``--pipeswift[-KEY][=VALUE]`` items from the option part of ``argv``.

    Returns the argv sbatch should see and the (KEY, VALUE) pairs found ("" for
    ``--pipeswift=off``). ``--pipeswift-KEY VALUE`` (separate value) is accepted too.
    Words after the script belong to the script and are never touched.
    """
    own_spans = [o for o in scan_argv(argv).opts if o.name.startswith("pipeswift")]
    if not own_spans:
        return list(argv), []
    drop = {i for o in own_spans for i in range(o.start, o.end)}
    pairs = [(o.name[len("pipeswift"):].lstrip("-"), o.value or "") for o in own_spans]
    return [a for i, a in enumerate(argv) if i not in drop], pairs


def _parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def own_options(pairs: Sequence[tuple[str, str]]) -> OwnOptions:
    """Build OwnOptions from (key, value) pairs (later pairs win).

    Raises:
        PsbatchError: unknown key or a malformed value.
    """
    values: dict[str, object] = {"declared": bool(pairs)}
    for key, value in pairs:
        try:
            if key == "":
                if value not in ("on", "off"):
                    raise ValueError(value)
                values["off"] = value == "off"
            elif key == "gpus":
                lo, hi = _parse_range(value)
                if not 1 <= lo <= hi:
                    raise ValueError("empty range")
                values["gpus"] = (lo, hi)
            elif key == "min-micro-batch":
                values["min_micro_batch_size"] = int(value)
            elif key == "pp":
                values["allowed_pp"] = tuple(int(p) for p in value.split(","))
            elif key == "class":
                values["job_class"] = value
            else:
                raise PsbatchError("unknown option --pipeswift-%s (known: gpus, min-micro-batch, pp, class,"
                                   " --pipeswift=off)" % key)
        except ValueError:
            raise PsbatchError("bad value %r for --pipeswift-%s" % (value, key)) from None
    return OwnOptions(**values)  # type: ignore[arg-type]


# ---------------------------------------------------------------- script text


class Script(NamedTuple):
    """What psbatch reads from a batch script's text.

    ``header`` holds the ``#SBATCH`` words per het component (sbatch stops reading them
    at the first command line); ``own`` the ``#PSWIFT`` KEY=VALUE pairs.
    """

    header: list[list[str]]
    own: list[tuple[str, str]]


def read_header(lines: Sequence[str]) -> Script:
    """Collect ``#SBATCH`` words (per ``#SBATCH hetjob`` component) and ``#PSWIFT`` pairs."""
    header: list[list[str]] = [[]]
    own: list[tuple[str, str]] = []
    in_header = True
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#PSWIFT"):
            own.extend(_pswift_pairs(stripped[len("#PSWIFT"):]))
        elif in_header and line.startswith("#SBATCH"):
            words = _split_words(line[len("#SBATCH"):])
            if words[:1] in (["hetjob"], ["packjob"]):
                header.append([])
            else:
                header[-1].extend(words)
        elif stripped and not stripped.startswith("#"):
            in_header = False
    return Script(header, own)


def _pswift_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for word in _split_words(text):
        key, eq, value = word.partition("=")
        pairs.append(("", key) if not eq and key in ("on", "off") else (key, value))
    return pairs


def _split_words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return text.split("#", 1)[0].split()


def _scan_shell(text: str) -> tuple[bool, list[int], str]:
    """Quote-aware pass over shell text: (incomplete?, segment starts, text without comments).

    Segments are split at top-level ``;``, ``&``, ``|`` (and ``&&``, ``||``). The text
    is incomplete when a quote, a ``(`` or a backslash-newline continues on the next line.
    """
    starts, keep = [0], []
    quote, depth, i, n = "", 0, 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\" and quote == '"' and i + 1 < n:
                keep.append(text[i:i + 2])
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c == "\\":
            if i + 1 >= n:
                return True, starts, "".join(keep)
            keep.append(text[i:i + 2])
            i += 2
            continue
        elif c in "'\"`":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n;&|("):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c in "(":
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif c in ";&|" and depth == 0:
            while i + 1 < n and text[i + 1] in ";&|":
                keep.append(c)
                i += 1
            starts.append(i + 1)
        keep.append(c)
        i += 1
    return bool(quote) or depth > 0, starts, "".join(keep)


class Command(NamedTuple):
    """One simple command of the script: where it starts and its words, variables expanded."""

    line: int  # physical line index
    offset: int  # character offset in that line where a launcher prefix goes
    words: tuple[str, ...]


_ASSIGN = r"[A-Za-z_][A-Za-z0-9_]*=(?:'[^']*'|\"(?:[^\"\\]|\\.)*\"|[^\s'\"])*"
_PREFIX_RE = re.compile(r"\s*(?:(?:%s)\s+)*(?:(?:exec|time|nohup|command|then|do|else|!)\s+)*" % _ASSIGN)
_VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?:\[[@*]\])?\}|([A-Za-z_][A-Za-z0-9_]*))")
_HEREDOC_RE = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")
_NOT_COMMANDS = frozenset("echo printf export declare local readonly typeset set unset cat source . "
                          "if elif while until for case function return eval alias".split())


def logical_lines(lines: Sequence[str]) -> list[tuple[int, str]]:
    """(first physical line, text) of each shell command line; heredoc bodies skipped."""
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        text, j = lines[i], i + 1
        while _scan_shell(text)[0] and j < len(lines) and j - i < MAX_LOGICAL_LINES:
            text += "\n" + lines[j]
            j += 1
        out.append((i, text))
        heredoc = _HEREDOC_RE.search(text) if "<<<" not in text else None
        if heredoc:
            while j < len(lines) and lines[j].strip() != heredoc.group(1):
                j += 1
            j += 1
        i = j
    return out


def _expand(words: Sequence[str], env: dict[str, list[str]]) -> list[str]:
    """Substitute known variables: a word that is exactly ``$X`` becomes X's words."""
    out: list[str] = []
    for word in words:
        m = _VAR_RE.fullmatch(word)
        name = m and (m.group(1) or m.group(2))
        if name and name in env:
            out.extend(env[name])
        else:
            out.append(_VAR_RE.sub(lambda v: " ".join(env.get(v.group(1) or v.group(2), [v.group(0)])), word))
    return out


def _record_assignment(words: list[str], env: dict[str, list[str]]) -> bool:
    """Remember ``X=value``, ``export X=value`` and ``X=( ... )``; True if the line is one."""
    while words and words[0] in ("export", "declare", "local", "readonly", "typeset"):
        words = [w for w in words[1:] if not w.startswith("-")]
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", words[0], re.S) if words else None
    if not m:
        return False
    name, first = m.groups()
    if first.startswith("("):
        items = [first[1:]] + words[1:]
        if items and items[-1].endswith(")"):
            items[-1] = items[-1][:-1]
        env[name] = _expand([w for w in items if w], env)
    elif len(words) == 1:
        env[name] = _expand(first.split(), env)
    else:
        return False  # X=1 cmd ...: an assignment for one command
    return True


def find_commands(lines: Sequence[str], environ: Optional[dict[str, str]] = None) -> list[Command]:
    """Every simple command of the script with its words (known variables expanded).

    Variables come from the script's own plain assignments and from ``environ`` (the
    submit environment, which the job inherits); others stay as written. Nothing runs.
    """
    env = {k: v.split() for k, v in (environ or {}).items()}  # unquoted $X splits on blanks
    out: list[Command] = []
    for first, text in logical_lines(lines):
        _, starts, _ = _scan_shell(text)
        bounds = starts + [len(text) + 1]
        for k, start in enumerate(starts):
            segment = text[start:bounds[k + 1] - 1]
            code = _scan_shell(segment)[2].replace("\\\n", " ")
            try:
                words = shlex.split(code)
            except ValueError:
                continue
            if not words or _record_assignment(list(words), env):
                continue
            offset = start + _PREFIX_RE.match(segment).end()  # type: ignore[union-attr]
            line = first + text.count("\n", 0, offset)
            offset -= text.rfind("\n", 0, offset) + 1
            out.append(Command(line, offset, tuple(_strip_prefix(_expand(words, env)))))
    return out


def _strip_prefix(words: list[str]) -> list[str]:
    i = 0
    while i < len(words) and (re.fullmatch(_ASSIGN, words[i]) or words[i] in
                              ("exec", "time", "nohup", "command", "then", "do", "else", "!")):
        i += 1
    return words[i:]


# ---------------------------------------------------------------- Megatron jobs

_SHAPE_FLAGS = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length")
_PRETRAIN_RE = re.compile(r"(?:^|/)pretrain_[A-Za-z0-9_]*\.py$")
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def _flag_names(words: Sequence[str]) -> set[str]:
    return {w.partition("=")[0] for w in words if w.startswith("--")}


def is_training_command(words: Sequence[str]) -> bool:
    """A Megatron training command: runs ``pretrain_*.py``, holds all the model-shape flags,
    or is a torchrun with any of them."""
    if not words or os.path.basename(words[0]) in _NOT_COMMANDS:
        return False
    flags = _flag_names(words)
    if all(f in flags for f in _SHAPE_FLAGS) or any(_PRETRAIN_RE.search(w) for w in words):
        return True
    launcher = any(os.path.basename(w) in _LAUNCHERS or w in _LAUNCHERS for w in words[:4])
    return launcher and any(f in flags for f in _SHAPE_FLAGS)


def find_training_command(lines: Sequence[str], environ: Optional[dict[str, str]] = None) -> Optional[Command]:
    """The first Megatron training command of a script, or None."""
    for cmd in find_commands(lines, environ):
        if is_training_command(cmd.words):
            return cmd
    return None


def routed(cmd: Command) -> bool:
    """Whether the command already runs through the launcher."""
    return any(os.path.basename(w) == LAUNCHER for w in cmd.words[:3])


def megatron_words(words: Sequence[str]) -> list[str]:
    """Only the known Megatron flags and their values (what the profile token records)."""
    from .megatron import FLAGS

    out, i = [], 0
    while i < len(words):
        flag, eq, _ = words[i].partition("=")
        kind = FLAGS.get(flag)
        width = 1 if kind is None or kind == "bool" or eq else (4 if kind == "int3" else 2)
        if kind is not None:
            out.extend(words[i:i + width])
        i += width
    return out


def rewrite_lines(lines: Sequence[str], cmd: Command) -> list[str]:
    """The script with ``pipeswift-launch -- `` inserted where the training command starts."""
    out = list(lines)
    line = out[cmd.line]
    out[cmd.line] = line[:cmd.offset] + LAUNCHER + " -- " + line[cmd.offset:]
    return out


def _count(text: Optional[str]) -> Optional[int]:
    """The GPU count of ``[type:]N`` (None when absent or unreadable)."""
    if not text:
        return None
    m = re.search(r"(\d+)$", text.strip())
    return int(m.group(1)) if m else None


def _gres_gpus(text: Optional[str]) -> Optional[int]:
    for item in (text or "").split(","):
        parts = item.strip().split(":")
        if parts[0] in ("gpu", "gres/gpu"):
            m = re.match(r"\d+", parts[-1]) if len(parts) > 1 else None
            return int(m.group(0)) if m else 1
    return None


def requested_world(values: dict[str, Optional[str]]) -> tuple[Optional[int], Optional[int]]:
    """(total GPUs, GPUs per node) the job asks for; (None, None) without a GPU request.

    ``values`` maps sbatch long option names to values (last one wins). Nodes: the
    minimum of ``-N a[-b]``, default 1.
    """
    m = re.match(r"\d+", values.get("nodes") or "1")
    nodes = max(1, int(m.group(0))) if m else 1
    per_node = _count(values.get("gpus-per-node")) or _gres_gpus(values.get("gres"))
    total = _count(values.get("gpus"))
    if total:
        return total, (total // nodes if total % nodes == 0 else None)
    if per_node:
        return nodes * per_node, per_node
    per_task = _count(values.get("gpus-per-task"))
    tasks = _count(values.get("ntasks"))
    if per_task and not tasks and _count(values.get("ntasks-per-node")):
        tasks = nodes * (_count(values.get("ntasks-per-node")) or 1)
    if per_task:
        total = per_task * (tasks or 1)
        return total, (total // nodes if total % nodes == 0 else None)
    return None, None


_ENV_OPTIONS = {"SBATCH_GPUS": "gpus", "SBATCH_GPUS_PER_NODE": "gpus-per-node",
                "SBATCH_GPUS_PER_TASK": "gpus-per-task", "SBATCH_COMMENT": "comment"}


def effective_options(cmdline: Sequence[Opt], header: Sequence[str],
                      environ: dict[str, str]) -> dict[str, Optional[str]]:
    """Option values as sbatch resolves them: script header < environment < command line."""
    values: dict[str, Optional[str]] = {o.name: o.value for o in scan_argv(header, stop_at_script=False).opts}
    values.update({opt: environ[var] for var, opt in _ENV_OPTIONS.items() if environ.get(var)})
    values.update({o.name: o.value for o in cmdline})
    return values


def build_request(words: Sequence[str], values: dict[str, Optional[str]], own: OwnOptions,
                  environ: dict[str, str]) -> str:
    """Validate the training command with the core and return the profile token.

    Raises:
        megatron.MegatronArgError: the Megatron arguments are invalid for this job.
    """
    from .megatron import profile_from_argv
    from .token import ProfileRequest, encode_profile

    world, per_node = requested_world(values)
    gpus_per_node = per_node or _count(environ.get("PIPESWIFT_GPUS_PER_NODE")) or 8
    profile_from_argv(list(words), world_size=world, gpus_per_node=gpus_per_node, gpu_range=own.gpus,
                      min_micro_batch_size=own.min_micro_batch_size, allowed_pp=own.allowed_pp,
                      job_class=own.job_class)
    return encode_profile(ProfileRequest(tuple(megatron_words(words)), own.gpus,
                                         own.min_micro_batch_size, own.allowed_pp, own.job_class))


# ---------------------------------------------------------------- submission

_MARKERS = ("--num-layers", "pretrain_", "#PSWIFT")


class Plan(NamedTuple):
    """What to hand sbatch: its argv (no argv[0]) and the script text, when rewritten."""

    argv: list[str]
    text: Optional[str]


def plan_job(argv: Sequence[str], pairs: Sequence[tuple[str, str]], text: str,
             environ: dict[str, str]) -> Optional[Plan]:
    """Enrich a Megatron job; None when the job is not one (or opted out).

    Raises:
        PsbatchError, megatron.MegatronArgError: the job says it is a Megatron job but
            psbatch cannot enrich it (the caller submits it unchanged with a warning).
    """
    if not pairs and not any(m in text for m in _MARKERS):
        return None
    lines = text.split("\n")
    script = read_header(lines)
    own = own_options(list(script.own) + list(pairs))
    if own.off:
        return None
    scan = scan_argv(argv)
    cmd = find_training_command(lines, environ)
    if scan.components > 1 or len(script.header) > 1:
        if own.declared or cmd:
            raise PsbatchError("heterogeneous jobs are not opted in to PipeSwift")
        return None
    if cmd is None:
        if own.declared:
            raise PsbatchError("no Megatron training command found in the script")
        return None
    values = effective_options(scan.opts, script.header[0], environ)
    token = build_request(cmd.words, values, own, environ)
    comment = values.get("comment")
    new_text = text if routed(cmd) else "\n".join(rewrite_lines(lines, cmd))
    return Plan(_with_options(argv, scan, comment + " " + token if comment else token,
                              new_text), new_text)


def _with_options(argv: Sequence[str], scan: Scan, comment: str, text: str) -> list[str]:
    """argv with every ``--comment`` (and ``--wrap``) replaced by one new one, in front."""
    drop = {i for o in scan.opts if o.name in ("comment", "wrap") for i in range(o.start, o.end)}
    front = ["--comment=" + comment]
    if any(o.name == "wrap" for o in scan.opts):
        front.append("--wrap=" + text)
    return front + [a for i, a in enumerate(argv) if i not in drop]


def find_sbatch(environ: dict[str, str]) -> Optional[str]:
    """The real sbatch: ``$PIPESWIFT_SBATCH``, else the first ``sbatch`` on PATH that is
    not psbatch itself."""
    wanted = environ.get("PIPESWIFT_SBATCH") or "sbatch"
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.sep in wanted:
        return wanted if os.path.isfile(wanted) and os.access(wanted, os.X_OK) else None
    for folder in environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", wanted)
        if os.path.isfile(path) and os.access(path, os.X_OK) and os.path.realpath(path) != me:
            return path
    return None


def _warn(message: str) -> None:
    sys.stderr.write("psbatch: warning: %s; submitted unchanged\n" % message)
    sys.stderr.flush()


def _run(sbatch: str, argv: list[str], stdin: Optional[bytes], script: Optional[tuple[int, str, str]]) -> int:
    """Run sbatch with stdout/stderr passed through; exec it when nothing needs cleanup."""
    if stdin is None and script is None:
        os.execv(sbatch, ["sbatch"] + argv)  # argv[0] as typed: sbatch's messages name it
    import subprocess
    import tempfile

    folder = None
    try:
        if script is not None:
            index, name, text = script
            folder = tempfile.mkdtemp(prefix="psbatch-")
            path = os.path.join(folder, name)
            with open(path, "wb") as fh:
                fh.write(text.encode("utf-8", "surrogateescape"))
            argv = argv[:index] + [path] + argv[index + 1:]
        return subprocess.run(["sbatch"] + argv, executable=sbatch, input=stdin, check=False).returncode
    finally:
        if folder:
            for entry in os.listdir(folder):
                os.unlink(os.path.join(folder, entry))
            os.rmdir(folder)


class Source(NamedTuple):
    """Where the job's script comes from: its text, and stdin bytes psbatch consumed."""

    text: Optional[str]
    stdin: Optional[bytes]


def read_source(argv: Sequence[str], stdin: object) -> Source:
    """Read the script as sbatch would: ``--wrap``, the script file, or stdin.

    Stdin is read only when sbatch would read it too and it is not a terminal.
    """
    scan = scan_argv(argv)
    wraps = [o.value for o in scan.opts if o.name == "wrap"]
    if wraps:
        return Source(wraps[-1] or "", None)
    if scan.script_index is not None:
        try:
            with open(argv[scan.script_index], "rb") as fh:
                data = fh.read(MAX_SCRIPT_BYTES + 1)
        except OSError:
            return Source(None, None)  # sbatch reports it
        return Source(None if len(data) > MAX_SCRIPT_BYTES else data.decode("utf-8", "surrogateescape"), None)
    if scan.unknown or any(o.name in _NO_STDIN for o in scan.opts) or stdin is None or stdin.isatty():  # type: ignore[attr-defined]
        return Source(None, None)
    data = stdin.buffer.read()  # type: ignore[attr-defined]
    text = data.decode("utf-8", "surrogateescape") if len(data) <= MAX_SCRIPT_BYTES else None
    return Source(text, data)


def submit(raw: Sequence[str], environ: dict[str, str], stdin: object = None) -> int:
    """Submit like sbatch, enriching a Megatron job; returns sbatch's exit code."""
    argv, pairs = list(raw), []
    warning, plan, source = None, None, Source(None, None)
    try:
        argv, pairs = strip_own_options(raw)
        source = read_source(argv, stdin)
        if source.text is not None:
            plan = plan_job(argv, pairs, source.text, environ)
        elif pairs:
            warning = "cannot read the job script"
    except Exception as exc:  # a submission is never lost to psbatch's own bugs
        log.debug("psbatch could not enrich the job", exc_info=True)
        warning = _describe(exc)
        plan = None
    sbatch = find_sbatch(environ)
    if sbatch is None:
        sys.stderr.write("psbatch: error: sbatch not found (set PIPESWIFT_SBATCH or PATH)\n")
        return 127
    if warning:
        _warn(warning)
    if plan is None:
        return _run(sbatch, argv, source.stdin, None)
    scan = scan_argv(plan.argv)
    if scan.script_index is None or any(o.name == "wrap" for o in scan.opts):
        stdin_bytes = None if any(o.name == "wrap" for o in scan.opts) else \
            (plan.text or "").encode("utf-8", "surrogateescape")
        return _run(sbatch, plan.argv, stdin_bytes, None)
    name = os.path.basename(plan.argv[scan.script_index]) or "script"
    return _run(sbatch, plan.argv, None, (scan.script_index, name, plan.text or ""))


def _describe(exc: Exception) -> str:
    from .megatron import MegatronArgError

    if isinstance(exc, MegatronArgError):
        return "Megatron job not opted in to PipeSwift: invalid Megatron arguments (%s)" % exc
    if isinstance(exc, PsbatchError):
        return "Megatron job not opted in to PipeSwift: %s" % exc
    return "psbatch internal error (%s: %s)" % (type(exc).__name__, exc)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point: ``psbatch [sbatch options] [--pipeswift-*] [script [args]]``."""
    if os.environ.get("PIPESWIFT_DEBUG"):
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    try:
        return submit(sys.argv[1:] if argv is None else argv, dict(os.environ), sys.stdin)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
