"""A run's capacity as measured: what its workers record of their passes, its retry rate,
and the workers it needs to finish by its deadline.

Workers record their passes with :func:`record_pass` in the run's capacity hash;
:func:`measured` reads them back with the run's retry rate. For a run under way,
:func:`run_need` is the count that finishes the remaining items before the deadline:
ceil(remaining * a / (rate * seconds left)) plus the spares, where the rate is a
worker's measured rate and a the attempts an item costs
(:func:`~redis_lease.fleet.capacity.model.workers_needed`, the model of
:mod:`redis_lease.fleet.capacity.model`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ...errors import InvalidInput
from ...protocol.connection.clients import as_text
from ...protocol.leases import RunStatus
from ...protocol.store.lease_store import LeaseStore
from .model import MAX_RETRY_RATE, attempts_per_item, check_count, duration, figure, workers_needed

#: The suffix of a run's capacity hash, after the run's record key.
CAPACITY_SUFFIX = ":capacity"


@dataclass(frozen=True)
class Measured:
    """What the workers of a run recorded, and the run's retry rate.

    Attributes:
        passes: shard passes recorded.
        handled: items handled in them.
        handler_seconds: seconds spent inside handlers (summed over slots).
        busy_seconds: seconds the workers spent on the passes (wall clock).
        retry_rate: the share of ended attempts that did not finish their item.
    """

    passes: int
    handled: int
    handler_seconds: float
    busy_seconds: float
    retry_rate: float

    @property
    def per_worker(self) -> float:
        """Items a worker finishes per second of work: handled / busy seconds."""
        return self.handled / self.busy_seconds

    @property
    def handler_duration(self) -> float:
        """Seconds one handler call takes on average."""
        return self.handler_seconds / self.handled

    @property
    def concurrency(self) -> float:
        """Handler slots busy at once on average: handler seconds / busy seconds."""
        return self.handler_seconds / self.busy_seconds

    def to_dict(self) -> dict[str, Any]:
        """The measurement and its derived rates as JSON-ready data."""
        return {
            **asdict(self),
            "per_worker": self.per_worker,
            "handler_duration": self.handler_duration,
            "concurrency": self.concurrency,
        }


def capacity_key(store: LeaseStore, run_id: str) -> str:
    """The run's capacity hash (:meth:`~redis_lease.protocol.keys.Keys.run_capacity`)."""
    return store.keys.run_capacity(run_id)


def record_pass(
    store: LeaseStore, run_id: str, handled: int, handler_seconds: float, busy_seconds: float
) -> None:
    """Adds one shard pass of a worker to the run's capacity hash (one round trip)."""
    check_count(handled, "handled", 0)
    _check_non_negative(handler_seconds, "handler seconds")
    _check_non_negative(busy_seconds, "busy seconds")
    key = capacity_key(store, run_id)
    with store.translating_errors(run_id):
        pipe = store.client.pipeline(transaction=False)
        pipe.hincrby(key, "passes", 1)
        pipe.hincrby(key, "handled", handled)
        pipe.hincrbyfloat(key, "handler_seconds", handler_seconds)
        pipe.hincrbyfloat(key, "busy_seconds", busy_seconds)
        pipe.execute()


def measured(store: LeaseStore, run_id: str) -> Measured | None:
    """The run's measured rates; None before any pass handled an item.

    Raises:
        NotFound: the run does not exist.
    """
    return measured_of(store, store.status(run_id))


def measured_of(store: LeaseStore, status: RunStatus) -> Measured | None:
    """:func:`measured` for a status already read (one round trip)."""
    run_id = status.run_id
    with store.translating_errors(run_id):
        raw = store.client.hgetall(capacity_key(store, run_id))
    fields = {as_text(k): as_text(v) for k, v in raw.items()}
    handled = int(fields.get("handled", "0"))
    busy = float(fields.get("busy_seconds", "0"))
    if handled <= 0 or busy <= 0:
        return None
    return Measured(
        passes=int(fields.get("passes", "0")),
        handled=handled,
        handler_seconds=float(fields.get("handler_seconds", "0")),
        busy_seconds=busy,
        retry_rate=retry_rate(status.counters, status.counts),
    )


@dataclass(frozen=True)
class RunNeed:
    """The workers a running run needs to finish by its deadline, and why.

    Attributes:
        workers: the count (spares included), or None when it is unknown.
        basis: the arithmetic, or why the count is unknown.
    """

    workers: int | None
    basis: str


def run_need(
    measure: Measured | None,
    remaining: int,
    seconds_left: float | None,
    *,
    spare_nodes: int = 0,
    workers_per_node: int = 1,
) -> RunNeed:
    """:func:`workers_needed` from a run's measured rates; unknown before any measurement.

    ``seconds_left`` is the time to the run's deadline (None: the run has none).
    """
    if remaining <= 0:
        return RunNeed(0, "no item left to work")
    if seconds_left is None:
        return RunNeed(None, "unknown: the run has no deadline")
    if seconds_left <= 0:
        return RunNeed(None, "unknown: the deadline has passed")
    if measure is None:
        return RunNeed(None, "unknown: no worker has recorded a pass yet")
    workers = workers_needed(
        remaining,
        seconds_left,
        measure.per_worker,
        retry_rate=measure.retry_rate,
        spare_nodes=spare_nodes,
        workers_per_node=workers_per_node,
    )
    spare = spare_nodes * workers_per_node
    basis = (
        f"ceil({remaining:,} items x {attempts_per_item(measure.retry_rate):.4f} attempts / "
        f"({figure(measure.per_worker)}/s per worker x {duration(seconds_left)} left)) "
        f"+ {spare} spare = {workers}"
    )
    return RunNeed(workers, basis)


def retry_rate(events: dict[str, int], counts: dict[str, int]) -> float:
    """The share of ended attempts that did not finish their item.

    Ended attempts are the claims less the leases still held and the items given
    back unstarted (releases: a drain, throttling; no attempt counted); the attempts
    that finished an item are the items done or dead. Capped at :data:`MAX_RETRY_RATE`.
    """
    ended = events.get("claims", 0) - counts.get("leased", 0) - events.get("releases", 0)
    finished = counts.get("done", 0) + counts.get("dead", 0)
    if ended <= 0 or finished <= 0:
        return 0.0
    return min(MAX_RETRY_RATE, max(0.0, 1.0 - finished / ended))


def _check_non_negative(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise InvalidInput(f"{name} must be a number of at least 0, not {value!r}")
    if not math.isfinite(value):
        raise InvalidInput(f"{name} must be finite, not {value!r}")


__all__ = [
    "CAPACITY_SUFFIX",
    "Measured",
    "RunNeed",
    "capacity_key",
    "measured",
    "measured_of",
    "record_pass",
    "retry_rate",
    "run_need",
]
