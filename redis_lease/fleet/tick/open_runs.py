"""What a tick does to each open run: plans it, dispatches shard jobs where work remains,
adds a burst when the projected finish passes the deadline, and finalizes it once its
deadline has passed or no item is left to work.

Each running run also gets the workers it needs to finish by its deadline
(:mod:`redis_lease.fleet.capacity.run_capacity`), for the exporter's ``redis_lease_workers_needed``.
Every decision is recorded with its reason in the run's event log.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from ...errors import NotFound, PlanningDeferred, RedisLeaseError
from ...messages import count_of
from ...protocol.leases import RunStatus
from ...protocol.store.lease_store import LeaseStore
from ..capacity import run_capacity
from ..jobs.job import Job
from ..runs import run_ages
from ..runs.lifecycle import Decision, PlanProgress, Runs, to_ms
from ..runs.run_states import FAILED, PLANNING, RUNNING
from ..transport import shard_jobs
from ..transport.shard_job_failures import FAILURE_STREAK_LIMIT, hold_dispatch, job_failures

log = logging.getLogger("redis_lease.tick")

#: Seconds between completion-rate samples used to project a run's finish.
RATE_WINDOW = 5.0
#: ``workers_needed`` of a run whose need cannot be computed yet.
UNKNOWN = "unknown"


def tick_run(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    run_id: str,
    now: datetime,
    progress: PlanProgress | None = None,
) -> list[Decision]:
    """Plans, finalizes or dispatches one open run; a run whose record went missing since
    this tick looked for lost runs is left to the next tick's look. ``progress`` is told
    the items planned so far while the run is planned."""
    try:
        info = runs.info(run_id)
    except NotFound:
        return []
    decisions: list[Decision] = []
    if info["state"] == PLANNING:
        if int(info.get("planning_retry_at", "0") or 0) > to_ms(now):
            return []  # a transient planner error: planned again after its back-off
        planned, done = _plan(runs, job, run_id, progress, to_ms(now))
        if planned is None or not done:
            return [planned] if planned else []
        decisions.append(planned)
    elif runs.retire_if_final(run_id, info) or info["state"] != RUNNING:
        return decisions
    status, per_shard = store.status_by_shard(run_id)
    deadline_ms = int(status.info.get("deadline_at", "0"))
    now_ms = to_ms(now)
    run_ages.record(store, status, now_ms)
    if deadline_ms and now_ms >= deadline_ms:
        final = runs.finalize(run_id, "deadline passed")
    elif status.unfinished == 0:
        final = runs.finalize(run_id, "no item left to work")
    else:
        work = _dispatch(store, runs, path, job, status, per_shard, now_ms, deadline_ms)
        try:  # after the dispatch, and never undoing it: a figure for autoscalers
            _publish_need(store, job, status, now_ms, deadline_ms)
        except RedisLeaseError as error:
            log.warning("could not publish workers_needed of run %r: %s", run_id, error)
        return decisions + work
    return decisions + ([final] if final else [])


def _publish_need(
    store: LeaseStore, job: Job, status: RunStatus, now_ms: int, deadline_ms: int
) -> None:
    """Records the workers the run needs to finish by its deadline, for the exporter.

    ``workers_needed`` in the run's record is a count, or ``unknown`` (no
    deadline, or no worker has recorded a pass yet); ``workers_needed_basis``
    says why, ``workers_needed_at`` when (the tick's clock, ms).
    """
    opts = job.options
    need = run_capacity.run_need(
        run_capacity.measured_of(store, status),
        status.unfinished,
        (deadline_ms - now_ms) / 1000 if deadline_ms else None,
        spare_nodes=opts.spare_nodes,
        workers_per_node=opts.workers_per_node,
    )
    fields: dict[Any, Any] = {
        "workers_needed": UNKNOWN if need.workers is None else str(need.workers),
        "workers_needed_basis": need.basis,
        "workers_needed_at": str(now_ms),
    }
    with store.translating_errors(status.run_id):
        store.client.hset(store.keys.run(status.run_id), mapping=fields)


def _plan(
    runs: Runs, job: Job, run_id: str, progress: PlanProgress | None, now_ms: int
) -> tuple[Decision | None, bool]:
    """Plans the run; (None, False) when another planner holds it.

    Returns a ``plan`` decision and True once the run is planned; a ``plan_retry`` decision
    and False when a transient planner error left it planning, to be planned again after a
    back-off; a ``finalize`` one and False when planning failed the run. An interruption
    that leaves the run planning (Redis, say) raises, for the next tick to plan again.
    """
    try:
        planned = runs.plan(job, run_id, progress, now_ms)
    except PlanningDeferred as deferred:  # recorded in the run's decisions already
        return Decision("plan_retry", run_id, deferred.message), False
    except Exception:
        info = runs.info(run_id)
        if info["state"] != FAILED:
            raise
        return Decision("finalize", run_id, f"failed: {info.get('reason', '')}"), False
    if planned is None:
        return None, False
    return Decision("plan", run_id, f"planned {planned} items"), True


def _dispatch(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    status: RunStatus,
    per_shard: list[dict[str, int]],
    now_ms: int,
    deadline_ms: int,
) -> list[Decision]:
    """Enqueues a shard job where work remains and no live job is on the shard.

    After :data:`FAILURE_STREAK_LIMIT` shard jobs of the run failed in a row, it
    backs off (:func:`~redis_lease.fleet.transport.shard_job_failures.hold_dispatch`); no burst is
    added while shard jobs fail.
    """
    opts = job.options
    run_id = status.run_id
    live = shard_jobs.live_jobs(store, run_id)  # counts the failed jobs it finds on the run
    status.info.update(runs.info(run_id))
    total_live = sum(len(ids) for ids in live.values())
    decisions: list[Decision] = []
    cap, probing = opts.max_shard_jobs, False
    failures = job_failures(status.info)
    if failures.streak >= FAILURE_STREAK_LIMIT:
        held, backoff = hold_dispatch(store, runs, status.info, run_id, now_ms)
        decisions += [backoff] if backoff else []
        if held:
            return decisions
        cap, probing = 1, True  # the back-off ended: one shard job tries again
    enqueued = 0
    for shard, counts in enumerate(per_shard):
        if RunStatus.unfinished_of(counts) == 0:
            continue
        have = len(live.get(shard, []))
        while have < opts.workers_per_shard and total_live < cap:
            shard_jobs.enqueue_shard(
                store, path, opts.queue, run_id, shard, opts.shard_budget_seconds
            )
            have, total_live, enqueued = have + 1, total_live + 1, enqueued + 1
    if enqueued:
        reason = f"enqueued {count_of(enqueued, 'shard job')} where no job was live"
        if probing:
            reason += f" (trying again after {failures.streak} failed shard jobs)"
        decisions.append(runs.record_decision(run_id, "dispatch", reason))
    if failures.streak:
        return decisions  # no burst capacity for work that fails
    burst = _burst(store, runs, path, job, status, per_shard, total_live, now_ms, deadline_ms)
    return decisions + ([burst] if burst else [])


def _burst(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    status: RunStatus,
    per_shard: list[dict[str, int]],
    total_live: int,
    now_ms: int,
    deadline_ms: int,
) -> Decision | None:
    """Adds shard jobs (up to max_shard_jobs) when the projected finish passes the deadline.

    The rate is of finished items (done or dead: no longer work); the work left is
    the unfinished items. Both come from :class:`~redis_lease.protocol.leases.RunStatus`.
    Work that fails gets no burst: when attempts failed since the last sample and
    none committed, more shard jobs would only fail the same way.
    """
    opts = job.options
    run_id = status.run_id
    info = status.info
    sample_at, sample_done = int(info.get("sample_at", "0")), int(info.get("sample_done", "0"))
    if sample_at and now_ms - sample_at < RATE_WINDOW * 1000:
        return None
    commits, failures = status.counters.get("commits", 0), status.counters.get("failures", 0)
    sample: dict[Any, Any] = {
        "sample_at": now_ms,
        "sample_done": status.finished,
        "sample_commits": commits,
        "sample_failures": failures,
    }
    with store.translating_errors(run_id):
        store.client.hset(store.keys.run(run_id), mapping=sample)
    if not sample_at or not deadline_ms:
        return None
    failing = failures > int(info.get("sample_failures", "0")) and commits == int(
        info.get("sample_commits", "0")
    )
    rate = (status.finished - sample_done) / ((now_ms - sample_at) / 1000)
    projected_ms = now_ms + status.unfinished / rate * 1000 if rate > 0 else float("inf")
    fields: dict[Any, Any] = {"rate_per_s": f"{rate:.6g}"}  # a slow run's rate is not 0
    if projected_ms != float("inf"):
        fields["projected_finish_at"] = int(projected_ms)
    with store.translating_errors(run_id):
        store.client.hset(store.keys.run(run_id), mapping=fields)
    if projected_ms <= deadline_ms or total_live >= opts.max_shard_jobs or failing:
        return None
    busiest = sorted(range(len(per_shard)), key=lambda s: -per_shard[s]["pending"])
    targets = [s for s in busiest if per_shard[s]["pending"] > 0][
        : opts.max_shard_jobs - total_live
    ]
    if not targets:
        return None
    for shard in targets:
        shard_jobs.enqueue_shard(store, path, opts.queue, run_id, shard, opts.shard_budget_seconds)
    when = "never at this rate" if rate <= 0 else f"in {(projected_ms - now_ms) / 1000:.0f}s"
    return runs.record_decision(
        run_id,
        "burst",
        f"projected finish {when} passes the deadline in {(deadline_ms - now_ms) / 1000:.0f}s "
        f"at {rate:.2f} items/s; +{len(targets)} shard jobs (cap {opts.max_shard_jobs})",
    )


__all__ = ["RATE_WINDOW", "UNKNOWN", "tick_run"]
