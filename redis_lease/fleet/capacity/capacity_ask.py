"""A capacity plan from what an operator gives (``redis-lease plan-capacity``): durations as
text, a per-worker rate or a handler duration, or the rates a run measured. The arithmetic
itself is :func:`.model.plan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import InvalidInput, NotFound
from ...protocol.store.lease_store import LeaseStore
from ...protocol.validation import check_id
from ..jobs.job import parse_duration
from ..runs.lifecycle import Runs
from .model import CapacityPlan, parse_rate, plan
from .run_capacity import Measured, measured


def seconds_of(text: str, name: str) -> float:
    """A duration above 0 given as text (``5m``, ``90s``), in seconds."""
    seconds = parse_duration(text).total_seconds()
    if seconds <= 0:
        raise InvalidInput(f"{name} {text!r} must be above 0, e.g. 5m")
    return seconds


def measured_run(store: LeaseStore, run_id: str) -> Measured:
    """The rates ``run_id`` measured, for a plan.

    Raises:
        NotFound: the run does not exist (named lost when the tick found it lost).
        InvalidInput: no worker pass of the run handled an item yet.
    """
    check_id(run_id, "run id")
    try:
        measure = measured(store, run_id)
    except NotFound as error:
        raise Runs(store).gone(run_id) or error from None
    if measure is None:
        raise InvalidInput(
            f"run {run_id!r} has no recorded worker passes: give --per-worker instead"
        )
    return measure


@dataclass
class CapacityAsk:
    """What a plan is asked for: ``eligible`` items over ``window``, the oldest eligible
    item's age within ``slo``, at ``per_worker`` items per handler slot (``20/s``) or one
    item per ``handler`` duration (``0.05s``), ``concurrency`` slots per worker; explicit
    figures win over those a run measured (:meth:`plan`). Checked when made.

    Raises:
        InvalidInput: both a rate and a handler duration, or a duration that is not one.
    """

    eligible: int
    window: str
    slo: str
    per_worker: str | None = None
    handler: str | None = None
    retry_rate: float | None = None
    spare_nodes: int = 0
    workers_per_node: int = 1
    concurrency: int | None = None
    window_seconds: float = field(init=False)
    slo_seconds: float = field(init=False)

    def __post_init__(self) -> None:
        if self.per_worker is not None and self.handler is not None:
            raise InvalidInput("give --per-worker or --handler, not both")
        self.window_seconds = seconds_of(self.window, "window")
        self.slo_seconds = seconds_of(self.slo, "SLO")

    def plan(self, measure: Measured | None = None) -> CapacityPlan:
        """The plan, with the figures not given taken from ``measure`` (a run's rates).

        Raises:
            InvalidInput: no rate given or measured, or a figure out of range.
        """
        slots = self.concurrency or (max(1, round(measure.concurrency)) if measure else 1)
        if self.per_worker is not None:
            rate = parse_rate(self.per_worker)
        elif self.handler is not None:
            rate = 1.0 / seconds_of(self.handler, "handler duration")
        elif measure is not None and self.concurrency:
            rate = 1.0 / measure.handler_duration  # another slot count: each at the measured pace
        elif measure is not None:
            rate = measure.per_worker / slots  # the measured worker rate, split over its slots
        else:
            raise InvalidInput("give --per-worker (e.g. 20/s), --handler or --from-run RUN")
        retry_rate = self.retry_rate
        if retry_rate is None:
            retry_rate = measure.retry_rate if measure else 0.0
        return plan(
            self.eligible,
            self.window_seconds,
            rate,
            self.slo_seconds,
            retry_rate=retry_rate,
            spare_nodes=self.spare_nodes,
            workers_per_node=self.workers_per_node,
            concurrency=slots,
        )


__all__ = ["CapacityAsk", "measured_run", "seconds_of"]
