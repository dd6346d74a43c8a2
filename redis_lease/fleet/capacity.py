"""Capacity planning: how many workers keep the oldest eligible item within an SLO.

The model (every figure in seconds and items per second):

* ``eligible`` items E become eligible evenly over a window W: arrivals at E/W.
* A worker runs ``concurrency`` N handler slots; ``per_worker`` r is the rate of
  one slot (one handler duration is d = 1/r), so a worker finishes N*r items/s.
  With N = 1 (the default) r is simply the worker's rate.
* A retry rate q is the share of attempts that do not finish their item (failed,
  expired, given back). Attempts repeat until one finishes, so an item costs
  a = 1/(1-q) attempts on average (0 <= q < 1).
* K workers finish S = K*N*r/a items/s, first eligible first (FIFO).
* While S < E/W the backlog grows; the oldest eligible item's age grows with it
  and peaks as the backlog drains, at t = E/S, when the last item is finished:
  its wait is E/S - W. When S >= E/W the backlog never grows. Either way an item
  stays eligible while its handler runs, so the peak age, counted from an item
  becoming eligible to its finish, is ``max(0, E/S - W) + d``. (A FIFO queue of
  K*N slots simulated item by item agrees within one handler duration per
  attempt; retry backoff delays are not modelled.) The exporter's
  ``redis_lease_oldest_eligible_age_seconds`` counts to the claim, not the
  finish: about one handler duration less.
* The answer is the smallest K whose peak age is within the SLO, plus
  ``spare_nodes * workers_per_node`` for nodes that may disappear. The nominal
  count ceil((E/W) / (N*r)) is what merely keeps up with arrivals, retries and
  spares left out: the starting point, not the answer.

For a run already under way, :func:`workers_needed` is the count that finishes
the remaining items before the deadline: ceil(remaining * a / (rate * seconds
left)) plus the spares, where the rate is a worker's measured rate. Workers
record their passes with :func:`record_pass`; :func:`measured` reads them back
with the run's retry rate.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import InvalidInput
from ..protocol.connection.clients import as_text
from ..protocol.store.lease_store import LeaseStore
from ..protocol.values import RunStatus

#: The suffix of a run's capacity hash, after the run's record key.
CAPACITY_SUFFIX = ":capacity"
#: The highest retry rate a plan accepts: above it an item costs 100+ attempts.
MAX_RETRY_RATE = 0.99
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h)\s*$")
_RATE_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class CapacityPlan:
    """The answer of :func:`plan` and the arithmetic that led to it."""

    workers: int  # total, spare included
    workers_for_slo: int  # smallest K holding the SLO, no spare
    nominal_workers: int  # ceil(demand / per-worker rate)
    steps: list[tuple[str, str]]  # (label, the arithmetic as text) in order

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data; ``steps`` as a list of {label, arithmetic}."""
        return {
            "workers": self.workers,
            "workers_for_slo": self.workers_for_slo,
            "nominal_workers": self.nominal_workers,
            "steps": [{"label": label, "arithmetic": text} for label, text in self.steps],
        }


def attempts_per_item(retry_rate: float) -> float:
    """Attempts an item costs on average at retry rate q: 1/(1-q)."""
    _check_fraction(retry_rate, "retry rate", MAX_RETRY_RATE)
    return 1.0 / (1.0 - retry_rate)


def peak_age(
    eligible: int,
    window: float,
    workers: int,
    per_worker: float,
    *,
    retry_rate: float = 0.0,
    concurrency: int = 1,
) -> float:
    """Predicted peak oldest-eligible age in seconds: ``max(0, E/S - W) + d``."""
    _check_burst(eligible, window, per_worker, concurrency)
    _check_count(workers, "workers", 1)
    attempts = attempts_per_item(retry_rate)
    return _age(eligible, window, workers, concurrency * per_worker, attempts, 1.0 / per_worker)


def plan(
    eligible: int,
    window: float,
    per_worker: float,
    slo: float,
    *,
    retry_rate: float = 0.0,
    spare_nodes: int = 0,
    workers_per_node: int = 1,
    concurrency: int = 1,
) -> CapacityPlan:
    """The workers that keep the oldest eligible item within ``slo`` during the burst.

    Raises:
        InvalidInput: a figure out of range, or an SLO shorter than one handler
            duration (no number of workers can hold it).
    """
    _check_burst(eligible, window, per_worker, concurrency)
    _check_positive(slo, "SLO")
    _check_count(spare_nodes, "spare nodes", 0)
    _check_count(workers_per_node, "workers per node", 1)
    attempts = attempts_per_item(retry_rate)
    handler = 1.0 / per_worker
    if slo < handler:
        raise InvalidInput(
            f"SLO {_secs(slo)} is shorter than one handler duration {_secs(handler)}: "
            "no worker count holds it; raise the SLO or the per-worker rate"
        )
    demand = eligible / window
    worker_rate = concurrency * per_worker
    nominal = max(1, _ceil(demand / worker_rate))
    service_needed = eligible / (window + slo - handler)
    slo_workers = max(1, _ceil(service_needed * attempts / worker_rate))
    # Settle rounding at the boundary on the model itself.
    while (
        slo_workers > 1
        and _age(eligible, window, slo_workers - 1, worker_rate, attempts, handler) <= slo
    ):
        slo_workers -= 1
    while _age(eligible, window, slo_workers, worker_rate, attempts, handler) > slo:
        slo_workers += 1
    spare = spare_nodes * workers_per_node
    steps = _steps(
        eligible, window, per_worker, slo, retry_rate, concurrency, nominal, slo_workers, spare
    )
    return CapacityPlan(slo_workers + spare, slo_workers, nominal, steps)


def _age(
    eligible: int, window: float, workers: int, worker_rate: float, attempts: float, handler: float
) -> float:
    """The peak age of the module's model: ``max(0, E/S - W) + d``."""
    return max(0.0, eligible / (workers * worker_rate / attempts) - window) + handler


def _steps(
    eligible: int,
    window: float,
    per_worker: float,
    slo: float,
    retry_rate: float,
    concurrency: int,
    nominal: int,
    slo_workers: int,
    spare: int,
) -> list[tuple[str, str]]:
    attempts = attempts_per_item(retry_rate)
    handler = 1.0 / per_worker
    demand = eligible / window
    worker_rate = concurrency * per_worker
    steps = [
        ("nominal demand", f"{eligible:,} items / {_secs(window)} = {_num(demand)}/s"),
    ]
    if concurrency != 1:
        steps.append(
            (
                "per-worker rate",
                f"{concurrency} slots x {_num(per_worker)}/s = {_num(worker_rate)}/s",
            )
        )
    steps += [
        (
            "nominal workers",
            f"ceil({_num(demand)}/s / {_num(worker_rate)}/s) = {nominal} (keeps up, no headroom)",
        ),
        (
            "retry headroom",
            f"1 / (1 - {retry_rate:.4g}) = {attempts:.4f} attempts per item",
        ),
    ]
    for k in sorted({slo_workers - 1, slo_workers} - {0}):
        service = k * worker_rate / attempts
        age = _age(eligible, window, k, worker_rate, attempts, handler)
        verdict = "within" if age <= slo else "over"
        steps.append(
            (
                f"burst at {k} worker{'s' if k > 1 else ''}",
                f"S = {k} x {_num(worker_rate)}/s / {attempts:.4f} = {_num(service)}/s; "
                f"drains in {eligible:,} / {_num(service)}/s = {_secs(eligible / service)}; "
                f"peak age max(0, {_secs(eligible / service)} - {_secs(window)}) + "
                f"{_secs(handler)} = {_secs(age)} ({verdict} the SLO {_secs(slo)})",
            )
        )
    steps += [
        ("workers for the SLO", f"{slo_workers}"),
        ("spare", f"{spare} (spare nodes x workers per node)"),
        ("workers", f"{slo_workers} + {spare} = {slo_workers + spare}"),
    ]
    return steps


def workers_needed(
    remaining: int,
    seconds_left: float,
    per_worker: float,
    *,
    retry_rate: float = 0.0,
    spare_nodes: int = 0,
    workers_per_node: int = 1,
) -> int:
    """Workers that finish ``remaining`` items in ``seconds_left``, spares included.

    ``per_worker`` is a whole worker's rate (its concurrency included). Nothing
    remaining needs no worker (and no spare).

    Raises:
        InvalidInput: a figure out of range (``seconds_left`` must be above 0).
    """
    _check_count(remaining, "remaining items", 0)
    _check_positive(seconds_left, "seconds left")
    _check_positive(per_worker, "per-worker rate")
    _check_count(spare_nodes, "spare nodes", 0)
    _check_count(workers_per_node, "workers per node", 1)
    if remaining == 0:
        return 0
    attempts = attempts_per_item(retry_rate)
    needed = max(1, _ceil(remaining * attempts / (per_worker * seconds_left)))
    return needed + spare_nodes * workers_per_node


# -- measured inputs ----------------------------------------------------------


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
    _check_count(handled, "handled", 0)
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
        f"({_num(measure.per_worker)}/s per worker x {_secs(seconds_left)} left)) + {spare} spare "
        f"= {workers}"
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


# -- parsing and checks -------------------------------------------------------


def parse_rate(text: str) -> float:
    """Items per second from ``20/s``, ``1200/m`` or ``72000/h``."""
    match = _RATE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise InvalidInput(f"invalid rate {text!r}: use a positive number per s, m or h, e.g. 20/s")
    return float(match.group(1)) / _RATE_UNIT_SECONDS[match.group(2)]


def _check_burst(eligible: int, window: float, per_worker: float, concurrency: int) -> None:
    _check_count(eligible, "eligible items", 1)
    _check_positive(window, "window")
    _check_positive(per_worker, "per-worker rate")
    _check_count(concurrency, "concurrency", 1)


def _check_count(value: int, name: str, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidInput(f"{name} must be a whole number of at least {least}, not {value!r}")


def _check_positive(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInput(f"{name} must be a number above 0, not {value!r}")
    if not math.isfinite(value):
        raise InvalidInput(f"{name} must be finite, not {value!r}")


def _check_non_negative(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise InvalidInput(f"{name} must be a number of at least 0, not {value!r}")
    if not math.isfinite(value):
        raise InvalidInput(f"{name} must be finite, not {value!r}")


def _check_fraction(value: float, name: str, most: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most:
        raise InvalidInput(f"{name} must be from 0 to {most}, not {value!r}")


def _ceil(value: float) -> int:
    """Ceiling that ignores float noise just above a whole number (4.0000000001 is 4)."""
    return math.ceil(round(value, 9))


def _num(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def _secs(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds:.0f}s ({seconds / 60:.1f}m)"


__all__ = [
    "CAPACITY_SUFFIX",
    "CapacityPlan",
    "Measured",
    "RunNeed",
    "attempts_per_item",
    "capacity_key",
    "measured",
    "measured_of",
    "parse_rate",
    "peak_age",
    "plan",
    "record_pass",
    "retry_rate",
    "run_need",
    "workers_needed",
]
