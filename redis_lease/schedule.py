"""Registering the tick with rq-scheduler.

Two entries per job: the job's own cron schedule (rq-scheduler reads cron in
the scheduler machine's local time, not the job's timezone; the tick itself
decides by the job's timezone whether a run is due), and a tick every
``interval`` seconds that plans, dispatches, bursts and finalizes between
nightly starts. Both run :func:`redis_lease.tick.tick_entry`;
a tick is idempotent, so an extra or early one changes nothing. The entries are
JSON jobs (:class:`~redis_lease.dispatch.JsonJob`); run the scheduler as
``rqscheduler --url URL -j redis_lease.dispatch.JsonJob``.
"""

from __future__ import annotations

import re
import warnings
from datetime import UTC, datetime
from typing import Any

from rq_scheduler import Scheduler

from .dispatch import JsonJob
from .jobs import Job
from .store import LeaseStore

TICK_FUNC = "redis_lease.tick.tick_entry"


def _entry_ids(store: LeaseStore, job: Job) -> tuple[str, str]:
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", f"{store.prefix}-{job.name}")
    return f"rl-tick-{safe}-cron", f"rl-tick-{safe}-every"


def scheduler_for(store: LeaseStore, job: Job) -> Scheduler:
    """An rq-scheduler Scheduler that writes JSON jobs onto the job's queue."""
    return Scheduler(queue_name=job.options.queue, connection=store.client, job_class=JsonJob)


def install(store: LeaseStore, path: str, job: Job, interval: int = 60) -> list[str]:
    """Registers (or replaces) the job's tick entries; returns their ids."""
    scheduler = scheduler_for(store, job)
    remove(store, job)
    cron_id, every_id = _entry_ids(store, job)
    args: list[Any] = [[path], store.prefix]
    with warnings.catch_warnings():
        # rq-scheduler calls crontab's next() without default_utc, which warns on every call.
        warnings.filterwarnings("ignore", message="Version 0.22.0", category=FutureWarning)
        scheduler.cron(
            job.options.schedule,
            func=TICK_FUNC,
            args=args,
            id=cron_id,
            queue_name=job.options.queue,
            timeout=300,
            result_ttl=600,
            use_local_timezone=False,
        )
    scheduler.schedule(
        scheduled_time=datetime.now(UTC).replace(tzinfo=None),
        func=TICK_FUNC,
        args=args,
        id=every_id,
        interval=interval,
        repeat=None,
        queue_name=job.options.queue,
        timeout=300,
        result_ttl=600,
    )
    return [cron_id, every_id]


def remove(store: LeaseStore, job: Job) -> int:
    """Removes the job's tick entries; returns how many there were."""
    scheduler = scheduler_for(store, job)
    removed = 0
    for entry in _entry_ids(store, job):
        if entry in scheduler:
            scheduler.cancel(entry)
            removed += 1
    return removed


def entries(store: LeaseStore, job: Job) -> list[dict[str, str]]:
    """The job's registered tick entries with their next run time (UTC)."""
    scheduler = scheduler_for(store, job)
    wanted = set(_entry_ids(store, job))
    rows = []
    for rq_job, when in scheduler.get_jobs(with_times=True):
        if rq_job.id in wanted:
            rows.append(
                {
                    "id": rq_job.id,
                    "next": when.isoformat(),
                    "cron": str(rq_job.meta.get("cron_string") or ""),
                    "interval": str(rq_job.meta.get("interval") or ""),
                }
            )
    return rows
