"""Kept where it was, because installed schedules name ``redis_lease.tick.tick_entry``: the
code lives in :mod:`redis_lease.fleet.tick.scheduler_tick` and
:mod:`redis_lease.fleet.tick.open_runs`, whose public names this module hands on."""

from .fleet.tick.open_runs import RATE_WINDOW, UNKNOWN, tick_run
from .fleet.tick.scheduler_tick import (
    FAILURE_KINDS,
    TICK_LOCK_SECONDS,
    TickProgress,
    TickResult,
    log,
    tick,
    tick_entry,
    tick_job,
)

__all__ = [
    "FAILURE_KINDS",
    "RATE_WINDOW",
    "TICK_LOCK_SECONDS",
    "UNKNOWN",
    "TickProgress",
    "TickResult",
    "log",
    "tick",
    "tick_entry",
    "tick_job",
    "tick_run",
]
