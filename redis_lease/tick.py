"""The tick's RQ job, under the path RQ stores: ``redis_lease.tick.tick_entry``.

RQ keeps a job's function as ``<module>.<name>``. Schedules installed by release 0.9.0
(``schedule install``, rq-scheduler, ``rq cron``) store this path, and this release stores
it too (:data:`~redis_lease.fleet.tick.schedule.TICK_FUNC`, and any code that enqueues
:func:`tick_entry` itself), so that workers of both releases run each other's ticks while
a fleet is upgraded. The tick is :mod:`redis_lease.fleet.tick.scheduler_tick`.
docs/upgrading.md says which release drops this module.
"""

from __future__ import annotations

from rq import get_current_job

from .errors import RedisLeaseError
from .fleet.tick.scheduler_tick import tick_and_arm
from .fleet.transport.shard_jobs import close_job_store, job_store
from .limits import DEFAULT_PREFIX

__all__ = ["tick_entry"]


def tick_entry(job_paths: list[str], prefix: str = DEFAULT_PREFIX, arm: bool = False) -> list[str]:
    """The RQ job that rq-scheduler (or ``rq cron``) runs: one tick on the job's connection.

    With ``arm`` (the entries ``schedule install`` makes) it then makes sure a one-off
    tick waits at each job's next scheduled time, in the job's timezone, while the job's
    schedule is installed (:func:`~redis_lease.fleet.tick.scheduler_tick.tick_and_arm`).

    Returns:
        The tick's decisions, as text.

    Raises:
        RedisLeaseError: outside an RQ worker; or after the whole tick, when some work
            failed (so the RQ job is marked failed); each failure is in its run's event log.
    """
    rq_job = get_current_job()
    if rq_job is None:
        raise RedisLeaseError("tick_entry runs inside an RQ worker; call tick() directly")
    store = job_store(rq_job.connection, prefix)
    try:
        return tick_and_arm(store, job_paths, arm)
    finally:
        close_job_store(store, rq_job.connection)
