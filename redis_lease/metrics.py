"""Kept where it was, because users' code imports it: the code lives in
:mod:`redis_lease.operate.metrics.collector`, whose public names this module hands on."""

from .operate.metrics.collector import (
    ACCOUNTING_GAUGES,
    AGES,
    EFFECT_STATES,
    EVENT_COUNTERS,
    RUN_LABELS,
    SCAN_FACTOR,
    TIMES,
    WORKERS_NEEDED,
    WORKERS_NEEDED_UNKNOWN,
    LeaseCollector,
)

__all__ = [
    "ACCOUNTING_GAUGES",
    "AGES",
    "EFFECT_STATES",
    "EVENT_COUNTERS",
    "RUN_LABELS",
    "SCAN_FACTOR",
    "TIMES",
    "WORKERS_NEEDED",
    "WORKERS_NEEDED_UNKNOWN",
    "LeaseCollector",
]
