"""The scheduler tick: create due runs, plan them, dispatch shard work, burst, finalize.

A tick starts work; it does not do it. It is idempotent: two ticks at once, or a
tick every minute, change nothing twice. Every decision is recorded with its
reason in the run's event log (``redis-lease status RUN`` shows them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import Any

import redis
from redis.exceptions import LockError
from rq import get_current_job

from . import dispatch
from .errors import LeaseError
from .jobs import Job, load_job
from .runs import Decision, Runs, to_ms
from .store import LeaseStore

#: Seconds between completion-rate samples used to project a run's finish.
RATE_WINDOW = 5.0
TICK_LOCK_SECONDS = 60


def tick(
    store: LeaseStore, job_paths: Sequence[str], now: datetime | None = None
) -> list[Decision]:
    """One tick for each job path (``package.module:attr``); returns the decisions made."""
    runs = Runs(store)
    moment = now or runs.server_now()
    decisions: list[Decision] = []
    for path in job_paths:
        decisions += tick_job(store, runs, path, load_job(path), moment)
    return decisions


def tick_job(store: LeaseStore, runs: Runs, path: str, job: Job, now: datetime) -> list[Decision]:
    """One tick of one job, under a per-job lock (a concurrent tick skips)."""
    lock = store.client.lock(
        f"{store.keys.job(job.name)}:tick", timeout=TICK_LOCK_SECONDS, blocking=False
    )
    with store.errors():
        if not lock.acquire(blocking=False):
            return []
    try:
        registered = _register(store, path, job, now)
        decisions = _create_due_runs(store, runs, job, now, registered)
        for run_id in runs.open_runs(job.name):
            decisions += _tick_run(store, runs, path, job, run_id, now)
        return decisions
    finally:
        # Expired (another tick may have taken over), or Redis is gone: the body's error wins.
        with contextlib.suppress(LockError, redis.RedisError):
            lock.release()


def _register(store: LeaseStore, path: str, job: Job, now: datetime) -> datetime:
    key = store.keys.job(job.name)
    with store.errors():
        pipe = store.client.pipeline(transaction=False)
        record: dict[Any, Any] = {"path": path, **job.settings()}
        pipe.hset(key, mapping=record)
        pipe.hsetnx(key, "registered_at", str(to_ms(now)))
        pipe.sadd(store.keys.jobs, job.name)
        pipe.hget(key, "registered_at")
        registered_ms = int(pipe.execute()[-1])
    return datetime.fromtimestamp(registered_ms / 1000, now.tzinfo)


def _create_due_runs(
    store: LeaseStore, runs: Runs, job: Job, now: datetime, registered: datetime
) -> list[Decision]:
    opts = job.options
    grace = timedelta(seconds=opts.catch_up_grace)
    since = max(now - timedelta(days=opts.catch_up_days), registered - grace)
    fires = job.fire_times(since, now)
    if not fires:
        return []
    dates_key = store.keys.job_dates(job.name)
    with store.errors():
        pipe = store.client.pipeline(transaction=False)
        for fire in fires:
            pipe.zscore(dates_key, _business_date(job, fire).isoformat())
        seen = pipe.execute()
    todo = [fire for fire, score in zip(fires, seen, strict=True) if score is None]
    if not todo:
        return []
    on_time = [fire for fire in todo if now - fire <= grace]
    if opts.catch_up == "all":
        chosen = todo
    elif opts.catch_up == "latest":
        chosen = [todo[-1]] if todo[-1] == fires[-1] else []
    else:
        chosen = on_time
    decisions: list[Decision] = []
    skipped = [fire for fire in todo if fire not in chosen]
    if skipped:
        with store.errors():
            store.client.zadd(
                dates_key, {_business_date(job, f).isoformat(): 0 for f in skipped}, nx=True
            )
            store.client.hset(
                store.keys.job(job.name),
                "last_catch_up",
                f"skipped {len(skipped)} missed dates (policy {opts.catch_up}): "
                + ", ".join(_business_date(job, f).isoformat() for f in skipped),
            )
    for fire in chosen:
        business_date = _business_date(job, fire)
        late = fire not in on_time
        # A run started late keeps its full window: its deadline moves with its start.
        window = job.deadline_for(business_date, fire) - fire
        run_id, created = runs.ensure(
            job, business_date, now if late else fire, (now if late else fire) + window
        )
        if created:
            reason = (
                f"missed at {fire.isoformat()} while nothing ticked; caught up (policy "
                f"{opts.catch_up})"
                if late
                else f"scheduled at {fire.isoformat()}"
            )
            if skipped and late:
                reason += f"; skipped {len(skipped)} older dates"
            decisions.append(runs.event(run_id, "catch_up" if late else "create", reason))
    return decisions


def _business_date(job: Job, fire: datetime) -> date:
    return fire.astimezone(job.zone).date()


def _tick_run(
    store: LeaseStore, runs: Runs, path: str, job: Job, run_id: str, now: datetime
) -> list[Decision]:
    decisions: list[Decision] = []
    info = runs.info(run_id)
    if info["state"] == "planning":
        try:
            planned = runs.plan(job, run_id)
        except Exception as error:  # recorded on the run by plan(); the tick goes on
            decisions.append(Decision("finalize", run_id, f"failed: planning error: {error!r}"))
            return decisions
        if planned is None:
            return decisions
        decisions.append(Decision("plan", run_id, f"planned {planned} items"))
        info = runs.info(run_id)
    if info["state"] != "running":
        return decisions
    per_shard = store.shard_counts(run_id)
    unfinished = sum(c["pending"] + c["leased"] for c in per_shard)
    deadline_ms = int(info.get("deadline_at", "0"))
    now_ms = to_ms(now)
    if unfinished == 0:
        final = runs.finalize(run_id, "every item finished")
        return decisions + ([final] if final else [])
    if deadline_ms and now_ms >= deadline_ms:
        final = runs.finalize(run_id, "deadline passed with items unfinished")
        return decisions + ([final] if final else [])
    return decisions + _dispatch(
        store, runs, path, job, run_id, info, per_shard, now_ms, deadline_ms
    )


def _dispatch(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    run_id: str,
    info: dict[str, str],
    per_shard: list[dict[str, int]],
    now_ms: int,
    deadline_ms: int,
) -> list[Decision]:
    opts = job.options
    live = dispatch.live_jobs(store, run_id)
    total_live = sum(len(ids) for ids in live.values())
    enqueued = 0
    for shard, counts in enumerate(per_shard):
        if counts["pending"] + counts["leased"] == 0:
            continue
        have = len(live.get(shard, []))
        while have < opts.workers_per_shard and total_live < opts.max_workers:
            dispatch.enqueue_shard(store, path, opts.queue, run_id, shard, opts.shard_budget)
            have, total_live, enqueued = have + 1, total_live + 1, enqueued + 1
    decisions: list[Decision] = []
    if enqueued:
        decisions.append(
            runs.event(run_id, "dispatch", f"enqueued {enqueued} shard jobs where no job was live")
        )
    burst = _burst(store, runs, path, job, run_id, info, per_shard, now_ms, deadline_ms, total_live)
    return decisions + ([burst] if burst else [])


def _burst(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    run_id: str,
    info: dict[str, str],
    per_shard: list[dict[str, int]],
    now_ms: int,
    deadline_ms: int,
    total_live: int,
) -> Decision | None:
    """Adds shard jobs (up to max_workers) when the projected finish passes the deadline."""
    opts = job.options
    done = sum(c["done"] + c["dead"] for c in per_shard)
    remaining = sum(c["pending"] + c["leased"] for c in per_shard)
    sample_at, sample_done = int(info.get("sample_at", "0")), int(info.get("sample_done", "0"))
    if sample_at and now_ms - sample_at < RATE_WINDOW * 1000:
        return None
    with store.errors(run_id):
        store.client.hset(
            store.keys.run(run_id), mapping={"sample_at": now_ms, "sample_done": done}
        )
    if not sample_at or not deadline_ms:
        return None
    rate = (done - sample_done) / ((now_ms - sample_at) / 1000)
    projected_ms = now_ms + remaining / rate * 1000 if rate > 0 else float("inf")
    fields: dict[Any, Any] = {"rate_per_s": f"{rate:.3f}"}
    if projected_ms != float("inf"):
        fields["projected_finish_at"] = int(projected_ms)
    with store.errors(run_id):
        store.client.hset(store.keys.run(run_id), mapping=fields)
    if projected_ms <= deadline_ms or total_live >= opts.max_workers:
        return None
    busiest = sorted(range(len(per_shard)), key=lambda s: -per_shard[s]["pending"])
    targets = [s for s in busiest if per_shard[s]["pending"] > 0][: opts.max_workers - total_live]
    if not targets:
        return None
    for shard in targets:
        dispatch.enqueue_shard(store, path, opts.queue, run_id, shard, opts.shard_budget)
    when = "never at this rate" if rate <= 0 else f"in {(projected_ms - now_ms) / 1000:.0f}s"
    return runs.event(
        run_id,
        "burst",
        f"projected finish {when} passes the deadline in {(deadline_ms - now_ms) / 1000:.0f}s "
        f"at {rate:.2f} items/s; +{len(targets)} shard jobs (cap {opts.max_workers})",
    )


def tick_entry(job_paths: list[str], prefix: str = "rl") -> list[str]:
    """The RQ job that rq-scheduler (or ``rq cron``) runs: one tick on the job's connection."""
    rq_job = get_current_job()
    if rq_job is None:
        raise LeaseError("tick_entry runs inside an RQ worker; call tick() directly")
    return [str(d) for d in tick(LeaseStore(rq_job.connection, prefix=prefix), job_paths)]
