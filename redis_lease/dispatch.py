"""Kept where it was, because command lines name ``redis_lease.dispatch.JsonJob``
(``rqscheduler -j``, ``rq worker --job-class``) and users' code imports it: the code
lives in :mod:`redis_lease.fleet.shard_jobs` and
:mod:`redis_lease.fleet.worker.rq_worker`, whose public names this module hands on."""

from .fleet.shard_jobs import (
    LIVE_STATUSES,
    MISSING_GRACE_MS,
    SHARD_FUNC,
    TIMEOUT_MARGIN,
    JsonJob,
    JsonQueue,
    enqueue_shard,
    job_error,
    json_cron_jobs,
    live_jobs,
    log,
    purge_queue,
    queue,
    stopped_job_why,
    why_stopped,
)
from .fleet.worker.rq_worker import (
    ACCESS_CHECK_RUN,
    SUBSCRIBE_WAIT,
    LeaseWorker,
    SimpleLeaseWorker,
    check_worker_access,
)

__all__ = [
    "ACCESS_CHECK_RUN",
    "LIVE_STATUSES",
    "MISSING_GRACE_MS",
    "SHARD_FUNC",
    "SUBSCRIBE_WAIT",
    "TIMEOUT_MARGIN",
    "JsonJob",
    "JsonQueue",
    "LeaseWorker",
    "SimpleLeaseWorker",
    "check_worker_access",
    "enqueue_shard",
    "job_error",
    "json_cron_jobs",
    "live_jobs",
    "log",
    "purge_queue",
    "queue",
    "stopped_job_why",
    "why_stopped",
]
