"""The package's architecture holds: import-linter's contracts (setup.cfg [importlinter]),
modules of a readable size, and no module reaching into another module's private names."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pipeswift_slurm"
MAX_MODULE_LINES = 410  # "about 400": split a module by job, not by size, past this

needs_linter = pytest.mark.skipif(importlib.util.find_spec("importlinter") is None,
                                  reason="import-linter not installed (the dev extra)")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code, "--config", str(root / "setup.cfg"), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, check=False)


@needs_linter
def test_import_contracts_are_kept() -> None:
    out = _lint_imports(ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "broken" not in out.stdout.split("Contracts:")[-1].split("\n")[0].replace("0 broken", "")


@needs_linter
@pytest.mark.parametrize("module, line", [
    ("core/model.py", "import pipeswift_slurm.store.history\n"),       # the core reaching up
    ("policy/fifo.py", "import sqlalchemy\n"),                         # a policy doing I/O
    ("store/schema.py", "import pipeswift_slurm.slurm.controller\n"),   # a layer below importing above
])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str) -> None:
    shutil.copytree(PACKAGE, tmp_path / "pipeswift_slurm", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")
    target = tmp_path / "pipeswift_slurm" / module
    target.write_text(line + target.read_text())
    out = _lint_imports(tmp_path)
    assert out.returncode != 0, out.stdout[-2000:]
    assert "BROKEN" in out.stdout


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_too_long() -> None:
    long = ["%s: %d lines" % (p.relative_to(ROOT), n) for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "split these by job: %s" % long


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_another_modules_private_names() -> None:
    found = []
    for path in _modules():
        own = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("pipeswift_slurm"):
                continue
            if node.module == own:
                continue
            found += ["%s imports %s.%s" % (own, node.module, a.name) for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found


def test_test_modules_have_names_of_their_own() -> None:
    """pytest imports tests/unit, tests/integration and tests/e2e (no packages) into one
    namespace: two test files of one name stop the whole run at collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert not sorted({n for n in names if names.count(n) > 1})
