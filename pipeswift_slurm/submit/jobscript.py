"""A batch script's text as psbatch reads it: ``#SBATCH`` and ``#PSWIFT`` header lines and
its shell commands.

Owns: reading the header (per ``#SBATCH hetjob`` component); a bounded, quote-aware pass
over shell text (continuations, heredocs, plain variable assignments) that yields each
simple command with its words. Which command trains Megatron is ``training``. The script
is text only, never executed. Pure: no I/O.

Must not import SQLAlchemy, click, the store, any backend or the core (psbatch must start
fast).
"""

from __future__ import annotations

import re
import shlex
from typing import Mapping, NamedTuple, Optional, Sequence

MAX_LOGICAL_LINES = 400  # physical lines one shell command may span
# Words that variable substitution may produce over a whole script. A real job script
# expands a few hundred; assignments that each double the last (A2="$A1 $A1") would
# otherwise grow without end. Past it, variables are left as written (unknown).
MAX_EXPANDED_WORDS = 100_000


# ---------------------------------------------------------------- script text


class Script(NamedTuple):
    """What psbatch reads from a batch script's text.

    ``header`` holds the ``#SBATCH`` words per het component (sbatch stops reading them
    at the first command line); ``own`` the ``#PSWIFT`` KEY=VALUE pairs.
    """

    header: list[list[str]]
    own: list[tuple[str, str]]
    version_dependent: bool = False  # a directive that 22.05 and 24.11 read differently


_DIRECTIVE_RE = re.compile("#SBATCH|#SLURM")  # sbatch still reads the old #SLURM lines (and says to change them)


def read_header(lines: Sequence[str]) -> Script:
    """Collect ``#SBATCH`` words (per ``#SBATCH hetjob`` component) and ``#PSWIFT`` pairs."""
    header: list[list[str]] = [[]]
    own: list[tuple[str, str]] = []
    in_header, version_dependent = True, False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#PSWIFT"):
            own.extend(_pswift_pairs(stripped[len("#PSWIFT"):]))
        elif in_header and (magic := _DIRECTIVE_RE.match(line)):
            words, differs = split_directive(line[magic.end():])
            version_dependent |= differs
            if words[:1] in (["hetjob"], ["packjob"]):
                header.append([])
            else:
                header[-1].extend(words)
        elif stripped and not stripped.startswith("#"):
            in_header = False
    return Script(header, own, version_dependent)


def _pswift_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for word in _split_words(text):
        key, eq, value = word.partition("=")
        pairs.append(("", key) if not eq and key in ("on", "off") else (key, value))
    return pairs


_C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale
_C_SPACES = re.compile("[%s]+" % _C_SPACE)
_DIRECTIVE_QUOTING = re.compile(r"[\\'\"#]")


def directive_words(text: str) -> list[str]:
    """The words of an ``#SBATCH`` line after the magic word, as sbatch splits them (its
    ``_get_argument``), which is not the shell's way: ``'`` and ``"`` quote alike, a
    backslash takes the next character as it is, even inside single quotes, but ends the
    word before a blank (22.05; see ``split_directive``); an unquoted ``#`` ends the line;
    and an empty word (``""``) ends it too. An unmatched quote (sbatch refuses the script)
    keeps the words before it."""
    return split_directive(text)[0]


def split_directive(text: str) -> tuple[list[str], bool]:
    """``directive_words``, and whether the words depend on Slurm's version: an unquoted
    backslash before a blank ends the word in 22.05's sbatch, and keeps the blank in the
    word in 24.11's (both measured), so ``--comment=a\\ b`` is the comment ``a`` and an
    invalid directive ``b`` in one, the comment ``a b`` in the other."""
    if _DIRECTIVE_QUOTING.search(text) is None:
        text = text.strip(_C_SPACE)
        return (_C_SPACES.split(text) if text else []), False
    words: list[str] = []
    i, n, differs = 0, len(text), False
    while True:
        while i < n and text[i] in _C_SPACE:
            i += 1
        word: list[str] = []
        quote, escaped = "", False
        while i < n and (quote or text[i] not in _C_SPACE) and text[i] != "\n":
            c = text[i]
            i += 1
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
                continue
            elif quote:
                if c == quote:
                    quote = ""
                    continue
            elif c in "'\"":
                quote = c
                continue
            elif c == "#":
                return (words + ["".join(word)] if word else words), differs
            word.append(c)
        differs |= escaped and i < n and text[i] != "\n"
        if quote or not word:
            return words, differs
        words.append("".join(word))


def _split_words(text: str) -> list[str]:
    try:
        return shell_words(text) if "#" not in text else shlex.split(text, comments=True)
    except ValueError:
        return text.split("#", 1)[0].split()


_OUTSIDE_QUOTES = re.compile(r"[\\'\"`#();&|]")  # the characters _scan_shell acts on
_INSIDE_QUOTES = {'"': re.compile(r'[\\"]'), "'": re.compile("'"), "`": re.compile("`")}


def _scan_shell(text: str) -> tuple[bool, list[int], str]:
    """Quote-aware pass over shell text: (incomplete?, segment starts, text without comments).

    Segments are split at top-level ``;``, ``&``, ``|`` (and ``&&``, ``||``; not at the
    ``&`` of a redirection: ``2>&1``, ``&>log``). The text
    is incomplete when a quote, a ``(`` or a backslash-newline continues on the next line.
    Runs of other characters are copied whole.
    """
    starts, keep = [0], []
    quote, depth, i, n = "", 0, 0, len(text)
    while i < n:
        found = (_INSIDE_QUOTES[quote] if quote else _OUTSIDE_QUOTES).search(text, i)
        if found is None:
            keep.append(text[i:])
            break
        if found.start() > i:
            keep.append(text[i:found.start()])
            i = found.start()
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
        elif c in ";&|" and depth == 0 and not (c == "&" and ((i and text[i - 1] in "<>")
                                                            or (i + 1 < n and text[i + 1] == ">"))):
            # (``>&``, ``<&`` and ``&>`` are redirections, not separators)
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
_ASSIGN_RE = re.compile(_ASSIGN)
_ASSIGNMENT_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
PREFIX_WORDS = ("exec", "time", "nohup", "command", "then", "do", "else", "!")  # before a command's name
_PREFIX_RE = re.compile(r"\s*(?:(?:%s)\s+)*(?:(?:%s)\s+)*" % (_ASSIGN, "|".join(map(re.escape, PREFIX_WORDS))))
_VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?:\[[@*]\])?\}|([A-Za-z_][A-Za-z0-9_]*))")
_HEREDOC_RE = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")
ASSIGN_COMMANDS = ("export", "declare", "local", "readonly", "typeset")  # X=value after these too
NOT_COMMANDS = frozenset("echo printf export declare local readonly typeset set unset cat source . "
                         "if elif while until for case function return eval alias".split())


def _scanned_lines(lines: Sequence[str]) -> list[tuple[int, str, tuple[bool, list[int], str]]]:
    """(first physical line, text, its ``_scan_shell``) of each shell command line; heredoc
    bodies skipped."""
    out: list[tuple[int, str, tuple[bool, list[int], str]]] = []
    i = 0
    while i < len(lines):
        text, j = lines[i], i + 1
        scan = _scan_shell(text)
        while scan[0] and j < len(lines) and j - i < MAX_LOGICAL_LINES:
            text += "\n" + lines[j]
            j += 1
            scan = _scan_shell(text)
        out.append((i, text, scan))
        heredoc = _HEREDOC_RE.search(text) if "<<" in text and "<<<" not in text else None
        if heredoc:
            while j < len(lines) and lines[j].strip() != heredoc.group(1):
                j += 1
            j += 1
        i = j
    return out


class _Vars:
    """Shell variables as psbatch knows them: the script's plain assignments, over the
    submit environment (an unquoted ``$X`` splits on blanks; split only when used). Every
    substitution spends its words from ``MAX_EXPANDED_WORDS``; once spent, a variable reads
    as unknown, so reading a script stays bounded whatever its assignments."""

    def __init__(self, environ: Optional[Mapping[str, str]]) -> None:
        self.assigned: dict[str, list[str]] = {}
        self.environ = environ or {}
        self.words_left = MAX_EXPANDED_WORDS

    def get(self, name: str) -> Optional[list[str]]:
        words = self.assigned.get(name)
        if words is None and name in self.environ:
            words = self.environ[name].split()
        if words is not None:
            if len(words) > self.words_left:
                self.words_left = 0
                return None
            self.words_left -= len(words)
        return words


def _expand(words: Sequence[str], env: _Vars) -> list[str]:
    """Substitute known variables: a word that is exactly ``$X`` becomes X's words."""
    out: list[str] = []
    for word in words:
        if "$" not in word:
            out.append(word)
            continue
        m = _VAR_RE.fullmatch(word)
        known = env.get(m.group(1) or m.group(2)) if m else None
        if known is not None:
            out.extend(known)
        else:
            out.append(_VAR_RE.sub(lambda v: " ".join(env.get(v.group(1) or v.group(2)) or [v.group(0)]), word))
    return out


def _record_assignment(words: list[str], env: _Vars) -> bool:
    """Remember ``X=value``, ``export X=value`` and ``X=( ... )``; True if the line is one."""
    while words and words[0] in ASSIGN_COMMANDS:
        words = words[1:]
        while words and words[0].startswith("-"):  # the command's own options: declare -a, export -n
            words = words[1:]
    m = _ASSIGNMENT_RE.match(words[0]) if words else None
    if not m:
        return False
    name, first = m.groups()
    if first.startswith("("):
        items = [first[1:]] + words[1:]
        if items and items[-1].endswith(")"):
            items[-1] = items[-1][:-1]
        env.assigned[name] = _expand([w for w in items if w], env)
    elif len(words) == 1:
        env.assigned[name] = _expand(first.split(), env)
    else:
        return False  # X=1 cmd ...: an assignment for one command
    return True


# shlex.split's words (POSIX mode) as whole-word regexes: runs of plain characters,
# backslash escapes, single-quoted and double-quoted runs; its whitespace is " \t\r\n"
_WORD_RE = re.compile(r"""(?:[^ \t\r\n'"\\]+|\\.|'[^']*'|"(?:[^"\\]|\\.)*")+""", re.S)
_BARE_RE = re.compile(r"""[^ \t\r\n'"\\]+""")
_PIECE_RE = re.compile(r"""\\(.)|'([^']*)'|"((?:[^"\\]|\\.)*)"|([^'"\\]+)""", re.S)
_DQ_ESCAPE_RE = re.compile(r'\\([\\"])')  # inside "...", a backslash escapes only " and itself
_NOT_BLANK_RE = re.compile(r"[^ \t\r\n]")


def _unquote(word: str) -> str:
    if not ("'" in word or '"' in word or "\\" in word):
        return word
    out = []
    for m in _PIECE_RE.finditer(word):
        escaped, single, double, bare = m.groups()
        if double is not None:
            out.append(_DQ_ESCAPE_RE.sub(r"\1", double))
        else:
            out.append(escaped if escaped is not None else single if single is not None else bare)
    return "".join(out)


def shell_words(code: str) -> list[str]:
    """``shlex.split(code)`` (the same words and the same ValueError), found by regexes
    instead of shlex's character-by-character reader (faster on long lines)."""
    if not ("'" in code or '"' in code or "\\" in code):
        return _BARE_RE.findall(code)
    words = _WORD_RE.findall(code)
    if _NOT_BLANK_RE.search(_WORD_RE.sub("", code)):  # an unclosed quote or a trailing backslash
        return shlex.split(code)  # raises shlex's own ValueError
    return [_unquote(w) for w in words]


def find_commands(lines: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> list[Command]:
    """Every simple command of the script with its words (known variables expanded).

    Variables come from the script's own plain assignments and from ``environ`` (the
    submit environment, which the job inherits); others stay as written. Nothing runs.
    """
    env = _Vars(environ)
    out: list[Command] = []
    for first, text, (_, starts, kept) in _scanned_lines(lines):
        bounds = starts + [len(text) + 1]
        for k, start in enumerate(starts):
            segment = text[start:bounds[k + 1] - 1]
            code = (kept if len(starts) == 1 else _scan_shell(segment)[2]).replace("\\\n", " ")
            try:
                words = shell_words(code)
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
    while i < len(words) and (_ASSIGN_RE.fullmatch(words[i]) or words[i] in PREFIX_WORDS):
        i += 1
    return words[i:]
