"""The words a setting that is on or off may be written with (knob values on the command
line, ``PIPESWIFT_EMULATE``, ``PIPESWIFT_PSBATCH_FAST``; the compiled psbatch front end gets
``OFF_WORDS`` from its generated header). Pure."""

from __future__ import annotations

from typing import Optional

ON_WORDS = ("true", "yes", "on", "1")
OFF_WORDS = ("false", "no", "off", "0")


def switch(text: str) -> Optional[bool]:
    """True or False for an on or off word (any case, blanks ignored), None for anything else."""
    word = text.strip().lower()
    return True if word in ON_WORDS else False if word in OFF_WORDS else None
