"""Registering the tick with rq-scheduler, and pausing a job's schedule.

Two kinds of entries per job, both running :func:`redis_lease.tick.tick_entry`:

- a tick every ``interval`` seconds that plans, dispatches, bursts and finalizes,
  and creates a run once its scheduled time in the job's timezone has come (the
  tick decides by the job's timezone, whenever it runs);
- a one-off tick at the job's next scheduled time, computed in the job's
  timezone and converted to UTC for rq-scheduler. Each tick arms the next one
  (:func:`arm_next`), so the entry follows daylight-saving changes: a job at
  02:00 Europe/Berlin fires at 01:00 UTC in winter and 00:00 UTC in summer.
  rq-scheduler's own cron reads a cron string in UTC (or the scheduler
  machine's zone) and would drift by an hour twice a year.

A tick is idempotent, so an extra or early one changes nothing; if the one-off
entry is lost, the interval tick still creates the run within ``interval``
seconds. The entries are JSON jobs (:class:`~redis_lease.dispatch.JsonJob`);
run the scheduler as ``rqscheduler --url URL -j redis_lease.dispatch.JsonJob``.

The jobs a tick has seen: :func:`job_names`, :func:`job_paths`.

Pausing (:func:`pause`, :func:`resume`) stops the tick's creation of new runs
for one job; runs already made go on. It is recorded in the job's record with
who and when (:func:`pause_state`).
"""

from __future__ import annotations

import getpass
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ...protocol.connection.clients import as_text, server_ms
from ...protocol.leases import from_ms
from ...protocol.store.lease_store import LeaseStore
from ...protocol.validation import check_id

if TYPE_CHECKING:  # the command line's views read pauses without RQ or croniter
    from rq_scheduler import Scheduler

    from ..jobs.job import Job

TICK_FUNC = "redis_lease.tick.tick_entry"
#: Seconds RQ allows one tick.
TICK_TIMEOUT = 300


@dataclass(frozen=True)
class Pause:
    """A job's paused schedule: who paused it and when (server clock, ms)."""

    by: str
    at_ms: int

    def describe(self) -> str:
        """``paused by alice at 2026-12-03T18:40:57.000+00:00`` (UTC, as the CLI prints times)."""
        return f"paused by {self.by} at {from_ms(self.at_ms).isoformat(timespec='milliseconds')}"


def _base_id(store: LeaseStore, job: Job) -> str:
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", f"{store.prefix}-{job.name}")
    return f"rl-tick-{safe}"


def _every_id(store: LeaseStore, job: Job) -> str:
    return f"{_base_id(store, job)}-every"


def _at_id(store: LeaseStore, job: Job, fire: datetime) -> str:
    return f"{_base_id(store, job)}-at-{fire.astimezone(UTC):%Y%m%dT%H%MZ}"


def scheduler_for(store: LeaseStore, job: Job) -> Scheduler:
    """An rq-scheduler Scheduler that writes JSON jobs onto the job's queue."""
    from rq_scheduler import Scheduler

    from ..transport.shard_jobs import JsonJob

    return Scheduler(queue_name=job.options.queue, connection=store.rq, job_class=JsonJob)


def next_fire(job: Job, now: datetime) -> datetime:
    """The job's first scheduled time after ``now``, in the job's timezone."""
    from croniter import croniter

    fire: datetime = croniter(job.options.schedule, now.astimezone(job.zone)).get_next(datetime)
    return fire


def _naive_utc(moment: datetime) -> datetime:
    """What rq-scheduler takes: a naive datetime in UTC."""
    return moment.astimezone(UTC).replace(tzinfo=None)


def install(
    store: LeaseStore, path: str, job: Job, interval: int = 60, now: datetime | None = None
) -> list[str]:
    """Registers (or replaces) the job's tick entries; returns their ids.

    ``now`` (default: the server clock) is when the next scheduled time is counted from.
    """
    scheduler = scheduler_for(store, job)
    remove(store, job)
    every_id = _every_id(store, job)
    scheduler.schedule(
        scheduled_time=_naive_utc(now or _server_now(store)),
        func=TICK_FUNC,
        args=[[path], store.prefix],
        kwargs={"arm": True},
        id=every_id,
        interval=interval,
        repeat=None,
        queue_name=job.options.queue,
        timeout=TICK_TIMEOUT,
        result_ttl=600,
    )
    return [arm_next(store, path, job, now, scheduler), every_id]


def arm_next(
    store: LeaseStore,
    path: str,
    job: Job,
    now: datetime | None = None,
    scheduler: Scheduler | None = None,
) -> str:
    """Makes sure a one-off tick waits at the job's next scheduled time; returns its id.

    Entries of other times still waiting are dropped (deleted). Repeating it changes nothing.
    """
    scheduler = scheduler or scheduler_for(store, job)
    fire = next_fire(job, now or _server_now(store))
    wanted = _at_id(store, job, fire)
    for rq_job in scheduler.get_jobs():
        if rq_job.id.startswith(f"{_base_id(store, job)}-at-") and rq_job.id != wanted:
            scheduler.cancel(rq_job.id)
            rq_job.delete()
    if wanted not in scheduler:
        scheduler.schedule(
            scheduled_time=_naive_utc(fire),
            func=TICK_FUNC,
            args=[[path], store.prefix],
            kwargs={"arm": True},
            id=wanted,
            queue_name=job.options.queue,
            timeout=TICK_TIMEOUT,
            result_ttl=600,
            meta={"cron_string": job.options.schedule, "timezone": job.options.timezone},
        )
    return wanted


def installed(store: LeaseStore, job: Job) -> bool:
    """True while the job's interval tick is registered (``schedule install``, not removed)."""
    return _every_id(store, job) in scheduler_for(store, job)


def remove(store: LeaseStore, job: Job) -> int:
    """Removes (deletes) the job's tick entries; returns how many there were."""
    scheduler = scheduler_for(store, job)
    base = _base_id(store, job)
    removed = 0
    for rq_job in scheduler.get_jobs():
        if rq_job.id.startswith(f"{base}-"):
            scheduler.cancel(rq_job.id)
            rq_job.delete()
            removed += 1
    return removed


def entries(store: LeaseStore, job: Job) -> list[dict[str, str]]:
    """The job's registered tick entries: the next time each runs, in the job's zone and UTC."""
    scheduler = scheduler_for(store, job)
    base = _base_id(store, job)
    rows = []
    for rq_job, when in scheduler.get_jobs(with_times=True):
        if rq_job.id.startswith(f"{base}-"):
            moment = when.replace(tzinfo=UTC) if when.tzinfo is None else when
            rows.append(
                {
                    "id": rq_job.id,
                    "next": local_time(moment, job),
                    "next_utc": moment.astimezone(UTC).isoformat(timespec="seconds"),
                    "cron": str(rq_job.meta.get("cron_string") or ""),
                    "timezone": job.options.timezone if rq_job.meta.get("cron_string") else "",
                    "interval": str(rq_job.meta.get("interval") or ""),
                }
            )
    return sorted(rows, key=lambda row: row["next_utc"])


def local_time(moment: datetime, job: Job) -> str:
    """A time in the job's timezone with its zone: ``2026-03-29 03:00 CEST (+02:00)``."""
    local = moment.astimezone(job.zone)
    offset = local.strftime("%z")
    return f"{local:%Y-%m-%d %H:%M} {local.tzname()} ({offset[:3]}:{offset[3:]})"


def _server_now(store: LeaseStore) -> datetime:
    with store.translating_errors():
        return from_ms(server_ms(store.client))


# -- pausing ----------------------------------------------------------------------------


def default_user() -> str:
    """The OS user running this process (``unknown`` when it cannot be told)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def pause(store: LeaseStore, job_name: str, by: str | None = None) -> Pause:
    """Stops the tick creating new runs of the job; records who and when; returns the pause.

    Idempotent: pausing a paused job keeps (and returns) the first record. The
    record is written and read back in one transaction, so a resume at the same
    moment comes before or after it, never between.
    """
    who = check_id(by or default_user(), "--by")
    key = store.keys.job(job_name)
    with store.translating_errors():
        at_ms = server_ms(store.client)
        store.client.sadd(store.keys.jobs, job_name)
        pipe = store.client.pipeline(transaction=True)  # one key: one slot on a cluster
        pipe.hsetnx(key, "paused_by", who)
        pipe.hsetnx(key, "paused_at", str(at_ms))
        pipe.hmget(key, ["paused_by", "paused_at"])
        paused_by, paused_at = pipe.execute()[-1]
    return Pause(as_text(paused_by or who), int(paused_at or at_ms))


def resume(store: LeaseStore, job_name: str) -> Pause | None:
    """Lets the tick create the job's runs again; returns the pause it ended (None if none).

    Scheduled times that passed while paused were skipped (``last_catch_up`` says
    which); ``redis-lease backfill`` makes their runs.
    """
    ended = pause_state(store, job_name)
    with store.translating_errors():
        store.client.hdel(store.keys.job(job_name), "paused_by", "paused_at")
    return ended


def job_names(store: LeaseStore) -> list[str]:
    """Every job a tick (or a pause) has seen, sorted."""
    with store.translating_errors():
        return sorted(as_text(j) for j in store.client.smembers(store.keys.jobs))


def job_paths(store: LeaseStore) -> list[str]:
    """The import paths a tick recorded of the jobs it has seen, by job name."""
    names = job_names(store)
    with store.translating_errors():
        paths = [store.client.hget(store.keys.job(name), "path") for name in names]
    return [as_text(p) for p in paths if p]


def pause_state(store: LeaseStore, job_name: str) -> Pause | None:
    """The job's pause (who, when), or None when its schedule runs."""
    return pause_states(store, [job_name]).get(job_name)


def pause_states(store: LeaseStore, job_names: list[str]) -> dict[str, Pause]:
    """The paused ones among ``job_names`` (one round trip)."""
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        for name in job_names:
            pipe.hmget(store.keys.job(name), ["paused_by", "paused_at"])
        replies: list[Any] = pipe.execute()
    return {
        name: Pause(as_text(by), int(at or 0))
        for name, (by, at) in zip(job_names, replies, strict=True)
        if by is not None
    }
