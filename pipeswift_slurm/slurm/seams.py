"""The seams the controller tick runs through, as Protocols: the history store it records
into (``HistoryStore``, one transaction per tick through a ``TickWriter``), a backend that
applies a tick's decisions in one batch (``BatchingBackend``), and the calibration step
that ends a tick (``Calibration``). ``store.history.Store`` and the backends implement
them; tests pass fakes. No SQLAlchemy here (the controller must not import it).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence, runtime_checkable

from pipeswift_slurm.core.estimator import Estimator
from pipeswift_slurm.core.model import ClusterView, Decision, ExecConfig, Job, JobProfile
from pipeswift_slurm.slurm.backends import Backend, BackendError


class TickWriter(Protocol):
    """One tick's writes, inside the tick's transaction (``store.tick.TickTx``)."""

    tick_id: int

    def save_snapshot(self, view: ClusterView) -> Any: ...

    def mark_vanished(self, job_ids: Iterable[int], now: Optional[float] = None) -> int: ...

    def profile_texts(self, job_ids: Iterable[int]) -> dict[int, str]: ...

    def upsert_profiles(self, items: Sequence[tuple[int, str, Optional[JobProfile], Optional[str]]]) -> None: ...

    def set_predicted_runs(self, predicted_run_s: Mapping[int, float]) -> None: ...

    def set_runs(self, runs: Mapping[int, Any]) -> None: ...

    def record_decisions(self, decisions: Sequence[Decision], applied: Optional[Mapping[int, Optional[bool]]] = None,
                         errors: Optional[Mapping[int, str]] = None, awaiting_outcome: bool = False) -> None: ...

    def awaiting_intents(self) -> list[tuple[int, int, Decision]]: ...

    def settle_intents(self, outcomes: Mapping[int, tuple[int, Optional[bool], str]]) -> None: ...

    def finish(self, status: str = "ok", error: Optional[str] = None, duration_s: Optional[float] = None,
               **counts: int) -> None: ...


class HistoryStore(Protocol):
    """What the controller needs of the history (``store.history.Store``)."""

    def tick(self, now: float, policy: str, dry_run: bool = False) -> AbstractContextManager[TickWriter]: ...

    def record_failed_tick(self, now: float, policy: str, dry_run: bool, error: str) -> int: ...

    def record_outcomes(self, tick_id: int, outcomes: Mapping[int, tuple[Optional[bool], Optional[str], bool]],
                        status: str, error: Optional[str], duration_s: float) -> None: ...

    def history_fields(self, now: float, jobs: Iterable[Job]) -> dict[int, dict[str, Any]]: ...


@runtime_checkable
class BatchingBackend(Backend, Protocol):
    """A backend that applies many decisions in one call, one outcome per item (None:
    applied; a BackendError otherwise)."""

    def apply_many(self, items: Sequence[tuple[Decision, Job]]) -> list[Optional[BackendError]]: ...


class Calibration(Protocol):
    """The step that ends every recorded tick: learn from finished jobs and return the
    estimator for the next tick (the same object when nothing changed, which keeps the
    policy's caches)."""

    def refit(self, now: float, estimator: Estimator) -> Estimator: ...

    def measured(self, jobs: Iterable[Job], profile_of: Callable[[Job], Optional[JobProfile]],
                 iter_time_s: Callable[[JobProfile, ExecConfig], float], now: float) -> None:
        """Take in the launchers' measured iteration times of ``jobs`` (before ``refit``)."""
        ...

    def user_factor(self, user: str) -> float:
        """The correction (>= 1) of ``user``'s claimed run times; 1 when none is kept."""
        ...
