"""The capacity planner's answers to the burst's questions, next to the measured ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.burst_model import Scenario, Trial
from redis_lease.fleet.capacity import model


@dataclass(frozen=True)
class Answer:
    """The planner's worker count for a question, and the measured one."""

    question: str
    planner: int
    measured: int | None

    @property
    def difference(self) -> int | None:
        """Measured less planned (None when nothing measured held the SLO)."""
        return None if self.measured is None else self.measured - self.planner

    @property
    def agrees(self) -> bool:
        """True when the two counts are within one worker of each other."""
        return self.difference is not None and abs(self.difference) <= 1

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready data."""
        return {**asdict(self), "difference": self.difference, "within_one": self.agrees}


def measured_rate(searched: Sequence[Trial]) -> float | None:
    """A consumer's attempts per second, from the one-consumer trial (busy throughout)."""
    single = [t for t in searched if t.workers == 1 and not t.timed_out and t.attempt_rate > 0]
    return single[0].attempt_rate if single else None


def planner_at_rate(scenario: Scenario, rate: float) -> dict[str, Any]:
    """The planner's answer when told the per-consumer rate measured here, not the nominal."""
    args = (scenario.eligible, scenario.window, rate, scenario.slo)
    return {
        "per_worker": round(rate, 3),
        "plan": model.plan(*args, retry_rate=scenario.retry_rate).to_dict(),
        "plan_one_spare": model.plan(
            *args, retry_rate=scenario.retry_rate, spare_nodes=1
        ).to_dict(),
    }


def planner_view(scenario: Scenario) -> dict[str, Any]:
    """The planner's answers for the scaled scenario: plain, with one spare, predicted peaks."""
    args = (scenario.eligible, scenario.window, scenario.per_worker, scenario.slo)
    plain = model.plan(*args, retry_rate=scenario.retry_rate)
    spare = model.plan(*args, retry_rate=scenario.retry_rate, spare_nodes=1)
    full = model.plan(
        scenario.eligible_full,
        scenario.window_full,
        scenario.per_worker,
        scenario.slo_full,
        retry_rate=scenario.retry_rate,
        spare_nodes=1,
    )
    peaks = {
        str(k): round(
            model.peak_age(
                scenario.eligible,
                scenario.window,
                k,
                scenario.per_worker,
                retry_rate=scenario.retry_rate,
            ),
            3,
        )
        for k in range(1, scenario.max_workers + 1)
    }
    return {
        "plan": plain.to_dict(),
        "plan_one_spare": spare.to_dict(),
        "plan_full_scale_one_spare": full.to_dict(),
        "predicted_peak": peaks,
    }
