"""Shared fixtures for every test layer.

Keep the names stable: other test modules rely on ``gpt_argv``, ``profile``, ``a100``,
``cost``, ``tiny_cluster`` and ``clock``.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from pipeswift_slurm.core import hardware
from pipeswift_slurm.core import megatron
from pipeswift_slurm.core import model
from pipeswift_slurm.core.costmodel import CostModel

GPT_ARGV = (
    "--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16",
    "--seq-length", "2048", "--max-position-embeddings", "2048",
    "--global-batch-size", "512", "--bf16", "--train-iters", "1000",
)


@pytest.fixture
def gpt_argv() -> list[str]:
    """A small GPT-style Megatron command line (24 layers, h=2048, a=16, s=2048, gbs=512)."""
    return list(GPT_ARGV)


@pytest.fixture
def profile(gpt_argv: list[str]) -> model.JobProfile:
    """``gpt_argv`` parsed as submitted: tp=pp=cp=dp=1, micro batch 1, M=512."""
    return megatron.profile_from_argv(gpt_argv)


@pytest.fixture
def a100() -> hardware.GpuType:
    return hardware.get_gpu_type("A100-80GB")


@pytest.fixture
def cost(a100: hardware.GpuType) -> CostModel:
    return CostModel(a100)


@pytest.fixture
def tiny_cluster() -> model.ClusterView:
    """Two idle nodes of 8 GPUs each, no jobs, at time 0."""
    nodes = (model.Node("node01", gpus=8), model.Node("node02", gpus=8))
    return model.ClusterView(now=0, nodes=nodes, jobs=())


@dataclass
class Clock:
    """A settable clock (seconds): read ``now`` or call it; ``advance`` moves it forward."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def set(self, now: float) -> None:
        self.now = now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


# ---------------------------------------------------------------- PostgreSQL variants

POSTGRES_URL_ENV = "PIPESWIFT_TEST_POSTGRES_URL"
NO_POSTGRES = ("PostgreSQL variant: no server (set %s, e.g. after tests/pg/postgres.sh up; "
               "tests/run-all.sh does)" % POSTGRES_URL_ENV)


def postgres_url() -> str | None:
    """The test server's URL (a ``postgresql+psycopg://`` URL), or None when unset."""
    import os

    return os.environ.get(POSTGRES_URL_ENV) or None


# Parametrize a fixture or test over both backends: ``@pytest.fixture(params=BACKENDS)``.
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(postgres_url() is None,
                                                                          reason=NO_POSTGRES))]


@contextmanager
def postgres_schema(label: str = "t") -> Iterator[str]:
    """A fresh, empty schema on the test server for one test (or module), dropped after:
    yields a URL whose connections see only that schema (``search_path``), so tests on
    one server stay as independent as tests on their own SQLite files."""
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    base = postgres_url()
    if base is None:
        pytest.skip(NO_POSTGRES)
    name = "%s_%s" % (re.sub(r"[^a-z0-9_]", "_", label.lower())[:40], uuid.uuid4().hex[:12])
    admin = create_engine(base, poolclass=NullPool)
    with admin.begin() as conn:
        conn.execute(text('CREATE SCHEMA "%s"' % name))
    url = make_url(base).update_query_dict({"options": "-csearch_path=%s" % name})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text('DROP SCHEMA "%s" CASCADE' % name))
        admin.dispose()


@contextmanager
def fresh_database(backend: str, folder: Path, label: str = "t") -> Iterator[str]:
    """A URL (PostgreSQL) or file path (SQLite, in ``folder``) of a new, empty database."""
    if backend == "sqlite":
        yield str(folder / "pipeswift.sqlite")
    else:
        with postgres_schema(label) as url:
            yield url


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    """"sqlite" or "postgresql" (skipped without a test server)."""
    return request.param


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request) -> Iterator[str]:
    """A new, empty database of the backend under test: a file path or a URL."""
    with fresh_database(backend, tmp_path, request.node.name) as url:
        yield url


@pytest.fixture(scope="session")
def new_database():
    """``fresh_database`` for fixtures of any scope: ``with new_database(backend, folder,
    label) as url:`` (test modules cannot import conftest reliably; they ask for this)."""
    return fresh_database


@pytest.fixture(scope="module", params=BACKENDS)
def module_backend(request) -> str:
    """``backend`` for module-scoped fixtures (a history built once per module and backend)."""
    return request.param


SQL_DIR = Path(__file__).resolve().parents[1] / "sql"


def admin_sql_rows(db: str, name: str) -> list[dict]:
    """The rows of admin query ``sql/<name>.sql`` (one file for every database) on ``db`` (a
    SQLite path or a URL), as dicts of plain numbers and text. The text goes to the driver
    as it is, with no parameters (as sqlite3 and psql read it: its ``%Y`` is no placeholder)."""
    from decimal import Decimal
    from pipeswift_slurm.store.history import make_engine
    sql = (SQL_DIR / (name.removesuffix(".sql") + ".sql")).read_text()
    engine = make_engine(str(db))
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute(sql)
        keys = [c[0] for c in cursor.description]
        # PostgreSQL's ROUND gives NUMERIC (Decimal); compare as numbers
        return [{k: float(v) if isinstance(v, Decimal) else v for k, v in zip(keys, row)}
                for row in cursor.fetchall()]
    finally:
        raw.close()
        engine.dispose()


@pytest.fixture(scope="session")
def admin_sql():
    """``admin_sql(db, name)``: the rows of admin query ``name`` on ``db`` (``admin_sql_rows``)."""
    return admin_sql_rows
