"""Issue 23, claims meet reality: a job's predicted run time never exceeds its own time
limit, and ``class=`` (the calibration key) is derived from the model shape, never taken
from the user's request."""

from __future__ import annotations

from dataclasses import replace

from pipeswift_slurm.core import token
from pipeswift_slurm.core.megatron import default_job_class
from pipeswift_slurm.core.request import request_profile
from pipeswift_slurm.policy import get_policy
from pipeswift_slurm.slurm.controller import Controller
from pipeswift_slurm.slurm.limits import within_time_limit
from test_controller_loop import ARGV, KeepingBackend, estimator, pending  # noqa: E402 (same folder)


def test_class_is_derived_from_the_model_never_taken_from_the_request() -> None:
    asked = token.decode_profile(token.encode_profile(token.ProfileRequest(ARGV, gpus=(1, 8), job_class="tiny")))
    assert asked.job_class == "tiny"  # the token still carries it (older psbatch) ...
    profile = request_profile(asked, world_size=1, cluster_gpus=8)
    assert profile.job_class == default_job_class(profile.shape) != "tiny"  # ... but it keys nothing


def test_predicted_run_time_never_exceeds_the_jobs_own_time_limit() -> None:
    est = estimator()
    profile = request_profile(token.decode_profile(pending(1).comment), world_size=1, cluster_gpus=32)
    raw = est.run_time_s(profile, profile.requested)
    short = replace(pending(1), time_limit_s=int(raw / 4))
    capped = within_time_limit(profile, short, est)
    assert est.run_time_s(capped, profile.requested) <= short.time_limit_s + 1e-6
    assert within_time_limit(capped, short, est) is capped  # idempotent
    long = replace(pending(1), time_limit_s=int(raw * 4))
    assert within_time_limit(capped, long, est).run_time_factor == 1.0  # a longer limit claims nothing


def test_the_controller_plans_with_predictions_within_time_limits() -> None:
    seen = {}

    class Spy:
        name, site_factor_max = "spy", None

        def decide(self, view, profiles, est):  # type: ignore[no-untyped-def]
            seen.update({j: est.run_time_s(p, p.requested) for j, p in profiles.items()})
            return get_policy("pipeswift").decide(view, profiles, est)

    est = estimator()
    job = replace(pending(1), time_limit_s=60)
    Controller(KeepingBackend(4, 8, [job]), Spy(), est).tick()  # type: ignore[arg-type]
    assert 0 < seen[1] <= 60


def test_a_new_time_limit_between_ticks_is_planned_with() -> None:
    """The controller limits a cached profile only when something it depends on changed:
    a limit the admin shortens between ticks still caps the next tick's prediction, and
    one lengthened again frees it."""
    seen: list[float] = []

    class Spy:
        name, site_factor_max = "spy", None

        def decide(self, view, profiles, est):  # type: ignore[no-untyped-def]
            seen.append(est.run_time_s(profiles[1], profiles[1].requested))
            return []

    est = estimator()
    backend = KeepingBackend(4, 8, [replace(pending(1), time_limit_s=10**7)])
    controller = Controller(backend, Spy(), est)  # type: ignore[arg-type]
    controller.tick()
    controller.tick()
    backend.jobs[1] = replace(backend.jobs[1], time_limit_s=60)
    controller.tick()
    backend.jobs[1] = replace(backend.jobs[1], time_limit_s=10**7)
    controller.tick()
    assert seen[0] == seen[1] == seen[3] > 60 >= seen[2] > 0
