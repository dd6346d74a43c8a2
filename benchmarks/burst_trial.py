"""One trial of the burst: feed the items over W, keep shard jobs dispatched, sample the age.

A trial starts its consumers (``benchmarks.burst_fleet``) on the benchmark's private
Redis, works one run of ``benchmarks.burst_jobs:burst_job`` and deletes every key it made.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import redis
from rich.progress import Progress
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer

from benchmarks.bench_fleet import log
from benchmarks.burst_fleet import Consumers
from benchmarks.burst_jobs import (
    BACKOFF_BASE,
    BACKOFF_CAP,
    JOB_PATH,
    MAX_ATTEMPTS,
    Settings,
    make_job,
)
from benchmarks.burst_model import Scenario, Trial, arrivals
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport import shard_jobs
from redis_lease.protocol.connection.clients import as_text
from redis_lease.protocol.leases import Item
from redis_lease.protocol.replies import Snapshot
from redis_lease.protocol.store import run_status
from redis_lease.protocol.store.lease_store import LeaseStore

#: Seconds between two rounds of feeding and dispatching.
LOOP_SECONDS = 0.1
#: Seconds between two samples of the oldest eligible age.
SAMPLE_SECONDS = 0.25
#: A trial gives up after W + this many times the time its consumers need at half speed.
TIMEOUT_FACTOR = 2.0


@dataclass
class Bench:
    """The trials of one benchmark run on its private Redis."""

    url: str
    client: redis.Redis
    scenario: Scenario
    folder: Path
    progress: Progress
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    count: int = 0

    @property
    def prefix(self) -> str:
        """Every redis-lease key of this benchmark starts with it."""
        return f"burst-{self.tag}"

    def trial(self, workers: int, drained: bool) -> Trial:
        """Runs one burst with ``workers`` consumers (one drained at W/2 when ``drained``)."""
        self.count += 1
        settings = Settings(
            queue=f"burst-{self.tag}-{self.count}",
            shards=workers,
            handler_ms=self.scenario.handler_ms,
            retry_rate=self.scenario.retry_rate,
        )
        job = make_job(settings)
        store = LeaseStore(self.client, prefix=self.prefix, url=self.url)
        folder = self.folder / f"trial-{self.count}"
        folder.mkdir()
        consumers = Consumers(self.url, self.prefix, settings, folder)
        label = Trial(workers, drained, []).label
        task = self.progress.add_task(label, total=self.scenario.eligible, age=0.0)
        business_date = date.fromordinal(730_000 + self.count)
        try:
            consumers.start(workers)
            consumers.wait_registered(self.client)
            trial = Trial(workers, drained, [])
            self._burst(store, job, business_date, consumers, trial, task)
        finally:
            codes = consumers.stop()
            self._clean(store, settings.queue, job.run_id(business_date))
        trial.exit_codes = codes
        log(
            f"{trial.label}: peak oldest eligible age {trial.peak:.2f}s "
            f"(SLO {self.scenario.slo:g}s), done after {trial.seconds:.1f}s, run {trial.state}"
        )
        return trial

    def _burst(
        self,
        store: LeaseStore,
        job: Job,
        business_date: date,
        consumers: Consumers,
        trial: Trial,
        task: Any,
    ) -> None:
        """Feeds the items over W, keeps shard jobs dispatched, samples the age until done."""
        scenario, runs = self.scenario, Runs(store)
        run_id, _ = runs.ensure(job, business_date, runs.server_now())
        deadline_ms = int(runs.info(run_id)["deadline_at"])
        need = scenario.eligible / (trial.workers * scenario.per_worker * 0.5)
        timeout = scenario.window + TIMEOUT_FACTOR * need + 30
        fed, next_sample = 0, 0.0
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            due = arrivals(elapsed, scenario.eligible, scenario.window)
            if due > fed:
                _feed(runs, run_id, range(fed, due), scenario.eligible, deadline_ms)
                fed = due
            if trial.drained and trial.drained_at is None and elapsed >= scenario.window / 2:
                consumers.drain_one()
                trial.drained_at = round(elapsed, 3)
            info, shards = run_status.read(store, run_id)
            status = run_status.summary(run_id, info, shards)
            age = status.oldest_eligible_age_seconds
            finished = fed == scenario.eligible and status.finished >= scenario.eligible
            if elapsed >= next_sample or finished:
                trial.samples.append((elapsed, age))
                next_sample = elapsed + SAMPLE_SECONDS
                self.progress.update(task, completed=status.finished, age=age)
            if finished or elapsed > timeout:
                trial.timed_out = not finished
                break
            _check_no_failed_job(self.client, job.options.queue)
            enqueued, stalled = _dispatch(store, job, run_id, shards)
            trial.dispatched += enqueued
            trial.stalled_job_seconds = max(trial.stalled_job_seconds, stalled)
            time.sleep(max(0.0, LOOP_SECONDS - (time.monotonic() - started - elapsed)))
        trial.seconds = elapsed
        runs.finalize(run_id, "burst over")
        status = store.status(run_id)
        trial.done, trial.dead = status.counts["done"], status.counts["dead"]
        trial.claims = status.counters.get("claims", 0)
        trial.retries = status.counters.get("retries", 0)
        trial.state = runs.info(run_id)["state"]

    def _clean(self, store: LeaseStore, queue: str, run_id: str) -> None:
        """Deletes the trial's RQ queue and jobs, and every redis-lease key of the benchmark.

        Shard jobs the run still lists, and jobs left in RQ's intermediate list (taken
        off the queue by a consumer that stopped before starting them), are named to
        ``purge_queue``, which finds only the queue's list and registries.
        """
        stranded = self.client.lrange(f"rq:queue:{queue}:intermediate", 0, -1)
        listed = self.client.hkeys(store.keys.run_jobs(run_id))
        extra = tuple(sorted({as_text(rq_id) for rq_id in [*stranded, *listed]}))
        shard_jobs.purge_queue(self.client, queue, extra)
        keys = list(self.client.scan_iter(match=f"{self.prefix}:*", count=1000))
        for start in range(0, len(keys), 1000):
            self.client.delete(*keys[start : start + 1000])


def _feed(runs: Runs, run_id: str, numbers: range, eligible: int, deadline_ms: int) -> None:
    """Adds items ``numbers`` to the run; after the last one the run counts as planned."""
    runs.store.add(
        run_id,
        [Item(f"r{n:07d}", {"n": n}) for n in numbers],
        max_attempts=MAX_ATTEMPTS,
        backoff_base=BACKOFF_BASE,
        backoff_cap=BACKOFF_CAP,
        deadline_ms=deadline_ms,
    )
    if numbers.stop == eligible:
        runs.transition(
            run_id,
            "planning",
            "running",
            f"fed {eligible} items over the burst window",
            planned="1",
            planned_items=eligible,
        )


def _check_no_failed_job(client: redis.Redis, queue_name: str) -> None:
    """Raises RuntimeError naming the error when a shard job failed (it never should)."""
    failed = shard_jobs.queue(client, queue_name).failed_job_registry
    ids = failed.get_job_ids(0, 0, cleanup=False)
    if not ids:
        return
    rq_job = RQJob.fetch(ids[0], connection=client, serializer=JSONSerializer)
    result = rq_job.latest_result()
    error = (result.exc_string or "").strip().splitlines() if result else []
    raise RuntimeError(
        f"shard job {ids[0]} failed: {error[-1] if error else 'no error recorded'} "
        "(a worker or protocol change mid-run? run again)"
    )


def _dispatch(
    store: LeaseStore, job: Job, run_id: str, shards: list[Snapshot]
) -> tuple[int, float]:
    """Enqueues a shard job for each shard with due items (or leases) and no live job.

    Returns the jobs enqueued and how long (seconds) the longest-missing shard job has
    been taken off its queue without starting (0 when none is, or none was checked).
    """
    wanted = [
        shard
        for shard, snap in enumerate(shards)
        if (snap.first_due_ms is not None and snap.first_due_ms <= snap.now_ms)
        or snap.counts["leased"]
    ]
    if not wanted:
        return 0, 0.0
    live = shard_jobs.live_jobs(store, run_id)  # also brings the run's missing jobs up to date
    pipe = store.client.pipeline(transaction=False)
    pipe.hgetall(store.keys.run_jobs_missing(run_id))
    pipe.hkeys(store.keys.run_jobs(run_id))
    missing, listed = pipe.execute()
    # A job that ended is no longer listed, but may linger among the missing: skip it.
    now_ms = max(snap.now_ms for snap in shards)
    stalled = max(
        ((now_ms - int(since)) / 1000 for rq_id, since in missing.items() if rq_id in listed),
        default=0.0,
    )
    enqueued = 0
    for shard in wanted:
        if not live.get(shard):
            opts = job.options
            shard_jobs.enqueue_shard(
                store, JOB_PATH, opts.queue, run_id, shard, opts.shard_budget_seconds
            )
            enqueued += 1
    return enqueued, max(0.0, stalled)
