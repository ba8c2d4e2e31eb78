"""Every command the README and docs/ show is real and tested (issue 28, the docs check).

From the code blocks of README.md and docs/*.md, every ``pipeswift ...``, ``psbatch ...``
and ``pipeswift-launch ...`` command line is read: its subcommand path (``pipeswift
report waits``) and its long options. Each documented option must exist (in the click
command, in psbatch's own ``--pipeswift*`` options, in the launcher's usage), and each
subcommand and option must appear in some test under tests/ (the test sources are
searched for the subcommand's words, quoted, and the option); sbatch's own options that
psbatch passes through are left to the passthrough tests. A failure lists them all.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import click
import pytest

from pipeswift_slurm.cli.main import pipeswift
from pipeswift_slurm.submit.sbatch_args import PsbatchError, own_options

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("pipeswift", "psbatch", "pipeswift-launch")
STOP = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "&", "#", "--"}
LAUNCH_OPTIONS = ("--emulate", "--local-gpus")  # pipeswift-launch's own (launcher.parse_options)


@dataclass(frozen=True)
class Documented:
    """One documented command: where, the subcommand path, and its long options."""

    where: str
    path: tuple[str, ...]
    options: tuple[str, ...]


def code_lines(text: str) -> list[str]:
    """The lines of the fenced code blocks (continuation lines joined), then the inline
    code spans of the prose that start with one of the programs."""
    lines, inside, joined, prose = [], False, "", []
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside, joined = not inside, ""
            continue
        if inside:
            joined += line.rstrip().removesuffix("\\") + " "
            if not line.rstrip().endswith("\\"):
                lines.append(joined.strip())
                joined = ""
        else:
            prose.append(line)
    spans = re.findall(r"`([^`]+)`", " ".join(prose))
    return lines + [s for s in spans if s.split()[0].rsplit("/", 1)[-1] in PROGRAMS]


def split(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.split()


def resolve(words: list[str]) -> tuple[tuple[str, ...], Optional[click.Command]]:
    """The pipeswift subcommand path at the start of ``words`` and its click command."""
    command: click.Command = pipeswift
    path: list[str] = []
    for word in words:
        if not isinstance(command, click.Group) or word not in command.commands:
            break
        command, path = command.commands[word], path + [word]
    return tuple(path), command


def documented() -> list[Documented]:
    found = []
    for doc in DOCS:
        for n, line in enumerate(code_lines(doc.read_text())):
            words = split(line)
            for i, word in enumerate(words):
                program = word.rsplit("/", 1)[-1]
                if program not in PROGRAMS or (i + 1 < len(words) and words[i + 1].rsplit("/", 1)[-1] in PROGRAMS):
                    continue  # not a program, or cron's user name before the program
                rest = []
                for w in words[i + 1:]:
                    if w in STOP or w.startswith(("|", ">", "#")):
                        break
                    rest.append(w)
                if program == "pipeswift":
                    path, _ = resolve([w for w in rest if not w.startswith("-")][:2])
                    path = ("pipeswift",) + path
                else:
                    path = (program,)
                options = tuple(dict.fromkeys(w.split("=", 1)[0] for w in rest if w.startswith("--") and len(w) > 2))
                if program == "psbatch" and "--pipeswift=check" in rest:
                    path = ("psbatch", "--pipeswift=check")
                found.append(Documented("%s (code %d)" % (doc.name, n + 1), path, options))
    return found


def option_exists(cmd: Documented) -> bool:
    """Whether every documented option exists for its command."""
    return not missing_options(cmd)


def missing_options(cmd: Documented) -> list[str]:
    program = cmd.path[0]
    if program == "pipeswift":
        _, command = resolve(list(cmd.path[1:]))
        # a group shown with "..." (``pipeswift report ... --format json``): any of its commands
        commands = list(command.commands.values()) if isinstance(command, click.Group) else [command]
        known = {o for c in commands for p in c.params for o in p.opts + p.secondary_opts} | {"--help"}
        return [o for o in cmd.options if o not in known]
    if program == "psbatch":
        missing = []
        for option in cmd.options:
            if not option.startswith("--pipeswift"):
                continue  # sbatch's own, passed through
            key = option.removeprefix("--pipeswift").removeprefix("-")
            try:
                own_options([(key, "on" if key == "" else "8")])
            except PsbatchError as exc:
                if "unknown option" in str(exc):
                    missing.append(option)
        return missing
    return [o for o in cmd.options if o not in LAUNCH_OPTIONS]


def sources_of_tests() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py") if p.name != Path(__file__).name)


def exercised(cmd: Documented, sources: str) -> list[str]:
    """What of ``cmd`` no test mentions: its subcommand words, then each option."""
    missing = []
    words = [w for w in cmd.path[1:] if not w.startswith("-")]
    for word in words:
        if not re.search(r"""["']%s["']""" % re.escape(word), sources):
            missing.append(" ".join(cmd.path))
            break
    for option in cmd.options:
        if cmd.path[0] == "psbatch" and not option.startswith("--pipeswift"):
            continue  # sbatch's own option, passed through unchanged (the passthrough tests)
        if option not in sources:
            missing.append("%s %s" % (" ".join(cmd.path), option))
    return missing


COMMANDS = documented()


def test_the_docs_show_commands_at_all():
    paths = {c.path for c in COMMANDS}
    assert ("pipeswift", "report", "all") in paths and ("psbatch", "--pipeswift=check") in paths
    assert len(COMMANDS) > 20


def test_every_documented_option_exists():
    bad = sorted({"%s: %s %s" % (c.where, " ".join(c.path), o) for c in COMMANDS for o in missing_options(c)})
    assert not bad, "documented options the command does not have:\n" + "\n".join(bad)


def test_every_documented_command_and_option_is_exercised_by_a_test():
    sources = sources_of_tests()
    bad = sorted({m for c in COMMANDS for m in exercised(c, sources)})
    assert not bad, "documented but exercised by no test under tests/:\n" + "\n".join(bad)


@pytest.mark.parametrize("text, path, options", [
    ("```sh\npipeswift report waits --db h.sqlite --since -1d | head\n```", ("pipeswift", "report", "waits"),
     ("--db", "--since")),
    ("```\nsudo /usr/local/bin/pipeswift controller tick \\\n  --dry-run\n```", ("pipeswift", "controller", "tick"),
     ("--dry-run",)),
])
def test_the_extraction_itself(text, path, options, tmp_path, monkeypatch):
    doc = tmp_path / "x.md"
    doc.write_text(text)
    monkeypatch.setitem(globals(), "DOCS", [doc])
    [found] = documented()
    assert (found.path, found.options) == (path, options)


def test_a_missing_option_and_an_untested_command_are_caught():
    fake = Documented("x.md", ("pipeswift", "report", "waits"), ("--db", "--no-such-option"))
    assert missing_options(fake) == ["--no-such-option"]
    assert exercised(fake, '"report" "waits" --db') == ["pipeswift report waits --no-such-option"]
    assert exercised(fake, '"report" --db --no-such-option') == ["pipeswift report waits"]
