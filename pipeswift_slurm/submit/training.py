"""Which command of a batch script trains Megatron, and that command routed through
``pipeswift-launch``.

Owns: recognising the training command among the script's commands (``jobscript``
finds them); the Megatron flags the profile token records; rewriting the command's line.
Pure: no I/O. Must not import SQLAlchemy, click, the store or any backend; the core's
flag table is imported only inside ``megatron_words`` (psbatch must start fast).
"""

from __future__ import annotations

import os
import re
from typing import Mapping, Optional, Sequence

from pipeswift_slurm.submit.jobscript import NOT_COMMANDS, Command, find_commands

LAUNCHER = "pipeswift-launch"

SHAPE_FLAGS = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length")
_PRETRAIN_RE = re.compile(r"(?:^|/)pretrain_[A-Za-z0-9_]*\.py$")
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def _flag_names(words: Sequence[str]) -> set[str]:
    return {w.partition("=")[0] for w in words if w.startswith("--")}


def is_training_command(words: Sequence[str]) -> bool:
    """A Megatron training command: runs ``pretrain_*.py``, holds all the model-shape flags,
    or is a torchrun with any of them."""
    if not words or os.path.basename(words[0]) in NOT_COMMANDS:
        return False
    flags = _flag_names(words)
    if all(f in flags for f in SHAPE_FLAGS) or any(_PRETRAIN_RE.search(w) for w in words):
        return True
    launcher = any(os.path.basename(w) in LAUNCHERS or w in LAUNCHERS for w in words[:4])
    return launcher and any(f in flags for f in SHAPE_FLAGS)


def find_training_command(lines: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> Optional[Command]:
    """The first Megatron training command of a script, or None."""
    for cmd in find_commands(lines, environ):
        if is_training_command(cmd.words):
            return cmd
    return None


def prefix_problem(cmd: Command) -> Optional[str]:
    """Why ``pipeswift-launch -- `` cannot go before the command as found (None: it can).
    The prefix goes after leading assignments and prefix words (``exec``, ``time``, ...), so
    it must land on the command's name: not on an option of a prefix word (``time -p``,
    ``exec -a NAME``, ``command -p``), nor before a subshell, a group or a function."""
    first = cmd.words[0] if cmd.words else ""
    if first.startswith("-"):
        return "a prefix word before it has options (%s)" % first
    if first.startswith(("(", "{", "[[")) or "()" in first:
        return "it is inside a subshell, a { } group or a function"
    return None


def routed(cmd: Command) -> bool:
    """Whether the command already runs through the launcher."""
    return any(os.path.basename(w) == LAUNCHER for w in cmd.words[:3])


def megatron_words(words: Sequence[str]) -> list[str]:
    """Only the known Megatron flags and their values (what the profile token records);
    paths (``--save``, ``--load``) are recorded as ``-``: only that they are given."""
    from pipeswift_slurm.core.megatron import FLAGS

    out, i = [], 0
    while i < len(words):
        flag, eq, _ = words[i].partition("=")
        kind = FLAGS.get(flag)
        width = 1 if kind is None or kind == "bool" or eq else (4 if kind == "int3" else 2)
        if kind == "path":
            out.extend([flag + "=-"] if eq else [flag, "-"][:width])
        elif kind is not None:
            out.extend(words[i:i + width])
        i += width
    return out


def rewrite_lines(lines: Sequence[str], cmd: Command) -> list[str]:
    """The script with ``pipeswift-launch -- `` inserted where the training command starts."""
    out = list(lines)
    line = out[cmd.line]
    out[cmd.line] = line[:cmd.offset] + LAUNCHER + " -- " + line[cmd.offset:]
    return out
