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
left)) plus the spares. The rates a run's workers measure, and the count it needs
from them, are in :mod:`redis_lease.fleet.capacity.run_capacity`. Nothing here reads Redis.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidInput
from ...limits import MAX_RETRY_RATE

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
    check_count(workers, "workers", 1)
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
    check_count(spare_nodes, "spare nodes", 0)
    check_count(workers_per_node, "workers per node", 1)
    attempts = attempts_per_item(retry_rate)
    handler = 1.0 / per_worker
    if slo < handler:
        raise InvalidInput(
            f"SLO {duration(slo)} is shorter than one handler duration {duration(handler)}: "
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
        (
            "nominal demand",
            f"{eligible:,} items / {duration(window)} = {figure(demand)}/s",
        ),
    ]
    if concurrency != 1:
        steps.append(
            (
                "per-worker rate",
                f"{concurrency} slots x {figure(per_worker)}/s = {figure(worker_rate)}/s",
            )
        )
    steps += [
        (
            "nominal workers",
            f"ceil({figure(demand)}/s / {figure(worker_rate)}/s) = {nominal} "
            "(keeps up, no headroom)",
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
                f"S = {k} x {figure(worker_rate)}/s / {attempts:.4f} = {figure(service)}/s; "
                f"drains in {eligible:,} / {figure(service)}/s = {duration(eligible / service)}; "
                f"peak age max(0, {duration(eligible / service)} - {duration(window)}) + "
                f"{duration(handler)} = {duration(age)} ({verdict} the SLO {duration(slo)})",
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
    check_count(remaining, "remaining items", 0)
    _check_positive(seconds_left, "seconds left")
    _check_positive(per_worker, "per-worker rate")
    check_count(spare_nodes, "spare nodes", 0)
    check_count(workers_per_node, "workers per node", 1)
    if remaining == 0:
        return 0
    attempts = attempts_per_item(retry_rate)
    needed = max(1, _ceil(remaining * attempts / (per_worker * seconds_left)))
    return needed + spare_nodes * workers_per_node


# -- parsing and checks -------------------------------------------------------


def parse_rate(text: str) -> float:
    """Items per second from ``20/s``, ``1200/m`` or ``72000/h``."""
    match = _RATE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise InvalidInput(f"invalid rate {text!r}: use a positive number per s, m or h, e.g. 20/s")
    return float(match.group(1)) / _RATE_UNIT_SECONDS[match.group(2)]


def _check_burst(eligible: int, window: float, per_worker: float, concurrency: int) -> None:
    check_count(eligible, "eligible items", 1)
    _check_positive(window, "window")
    _check_positive(per_worker, "per-worker rate")
    check_count(concurrency, "concurrency", 1)


def check_count(value: int, name: str, least: int) -> None:
    """Raises InvalidInput unless ``value`` is a whole number (not a bool) of at least
    ``least``; ``name`` names it in the message."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidInput(f"{name} must be a whole number of at least {least}, not {value!r}")


def _check_positive(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInput(f"{name} must be a number above 0, not {value!r}")
    if not math.isfinite(value):
        raise InvalidInput(f"{name} must be finite, not {value!r}")


def _check_fraction(value: float, name: str, most: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most:
        raise InvalidInput(f"{name} must be from 0 to {most}, not {value!r}")


def _ceil(value: float) -> int:
    """Ceiling that ignores float noise just above a whole number (4.0000000001 is 4)."""
    return math.ceil(round(value, 9))


def figure(value: float) -> str:
    """A figure as the plan's steps show it: whole with thousands separators, else 2 decimals."""
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def duration(seconds: float) -> str:
    """Seconds as the plan's steps show them: ms below 1 s, minutes added from 2 min."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds:.0f}s ({seconds / 60:.1f}m)"


__all__ = [
    "MAX_RETRY_RATE",
    "CapacityPlan",
    "attempts_per_item",
    "parse_rate",
    "peak_age",
    "plan",
    "workers_needed",
]
