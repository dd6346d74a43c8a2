"""Kept where it was, because stored shard jobs name ``redis_lease.worker.process_shard``
and logging configurations the ``redis_lease.worker`` logger: the code lives in
:mod:`redis_lease.fleet.worker.shard_job`, whose public names this module hands on."""

from typing import Any

from .deprecation import renamed_attribute
from .fleet.worker import shard_job
from .fleet.worker.shard_job import (
    CONCURRENCY_ENV,
    ActiveLease,
    HandlerResult,
    LeaseKeeper,
    ShardReport,
    concurrency_override,
    log,
    process_shard,
    work_shard,
    worker_name,
)

__all__ = [
    "CONCURRENCY_ENV",
    "ActiveLease",
    "HandlerResult",
    "LeaseKeeper",
    "ShardReport",
    "concurrency_override",
    "log",
    "process_shard",
    "work_shard",
    "worker_name",
]


def __getattr__(name: str) -> Any:
    """``Outcome``, the old name of :class:`HandlerResult`, with a DeprecationWarning."""
    return renamed_attribute(__name__, name, shard_job.RENAMED, globals())
