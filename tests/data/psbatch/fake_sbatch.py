#!/usr/bin/env python3
"""A stand-in for sbatch in unit tests: appends one JSON line per call to $FAKE_SBATCH_LOG
(argv, the stdin bytes when sbatch would read them, and the script file's text), prints
what sbatch prints, and exits with $FAKE_SBATCH_RC (default 0)."""
import json
import os
import sys

argv = sys.argv[1:]
record = {"argv": argv, "stdin": None, "script": None}
script = next((a for a in argv if not a.startswith("-") and os.path.isfile(a)), None)
if script:
    with open(script, "rb") as fh:
        record["script"] = fh.read().decode("utf-8", "surrogateescape")
    record["script_name"] = os.path.basename(script)
elif not any(a.startswith("--wrap") for a in argv) and not sys.stdin.isatty():
    record["stdin"] = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
with open(os.environ["FAKE_SBATCH_LOG"], "a") as fh:
    fh.write(json.dumps(record) + "\n")
rc = int(os.environ.get("FAKE_SBATCH_RC", "0"))
if rc:
    sys.stderr.write("sbatch: error: fake failure\n")
else:
    sys.stdout.write("42\n" if "--parsable" in argv else "Submitted batch job 42\n")
sys.exit(rc)
