"""Prometheus metrics of runs, jobs and providers, read from Redis on each scrape.

Three numbers stay apart: delivery attempts (``redis_lease_claims_total``),
successful state transitions (``redis_lease_commits_total``, outcomes by label)
and the processing rate (``rate()`` of those counters).

Run series carry ``run`` and ``job`` (the run's job, ``""`` for ad-hoc runs). Every open
run of a job is exported (its series never vanish while it is open, so its alerts do not
resolve by themselves), and so are the open runs and the newest ``max_runs`` final runs
among the newest ``SCAN_FACTOR * max_runs`` of the run index; a run whose keys are gone
(its retention ended) has no series:

- ``redis_lease_items{state}``, ``redis_lease_run_state{state}``, ``redis_lease_effects{state}``;
- ages: ``redis_lease_oldest_eligible_age_seconds`` (the SLO metric),
  ``redis_lease_oldest_leased_age_seconds``, ``redis_lease_oldest_unknown_effect_age_seconds``;
- event counters ``redis_lease_<event>_total`` (:data:`EVENT_COUNTERS`),
  ``redis_lease_outcomes_total{outcome}``, ``redis_lease_failed_shard_jobs_total``;
- accounting: ``redis_lease_planned_items``, ``redis_lease_lost_items`` (records that vanished);
- time: ``redis_lease_run_deadline_timestamp_seconds`` and, for an open run the tick has
  sampled, ``redis_lease_run_projected_finish_timestamp_seconds`` (``+Inf`` when nothing
  finished since the last sample);
- workers: ``redis_lease_run_workers_needed`` (when known) and ``redis_lease_run_max_workers``
  (the job's cap, as its last tick recorded it).

By job: ``redis_lease_workers_needed`` (for an autoscaler: the workers that finish the
job's running runs before their deadlines, see :mod:`redis_lease.fleet.capacity.model`),
``redis_lease_workers_needed_unknown_runs``, ``redis_lease_runs_finished_total{state}``,
``redis_lease_missed_runs_total`` and ``redis_lease_lost_runs_total`` (kept in Redis,
:mod:`redis_lease.fleet.runs.job_tallies`), and the histograms
``redis_lease_processing_duration_seconds`` and
``redis_lease_queue_age_seconds`` with ``redis_lease_attempt_log_skipped_total`` (from the
attempt logs, kept by the exporter's process: :mod:`redis_lease.operate.metrics.history`). Also
``redis_lease_data_set_losses_total{kind}`` (:mod:`redis_lease.fleet.loss.data_set_mark`),
``redis_lease_declared_job_unticked{job}`` (a job a live worker declared that no tick leader
ticks), ``redis_lease_tick_leader_token{worker}`` and
``redis_lease_tick_leader_since_seconds{worker}`` (the tick leader, named),
``redis_lease_redis_eviction_danger{policy}``, ``redis_lease_redis_memory_used_bytes`` and
``redis_lease_redis_memory_max_bytes`` (0: no maxmemory), the provider gates'
``redis_lease_provider_*``,
and ``redis_lease_bad_jobs_total{queue,reason}``: RQ jobs
workers failed without running (kept in Redis, :mod:`redis_lease.fleet.worker.bad_jobs`).

A scrape only reads Redis: a user allowed read commands and scripts that only read
can run the exporter.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ...errors import NotFound
from ...fleet.runs.run_states import OPEN_STATES, kept_until_ms
from ...fleet.transport.shard_job_failures import job_failures
from ...fleet.worker.bad_jobs import bad_job_counts
from ...limits import METRICS_RUNS
from ...protocol.connection.clients import as_text
from ...protocol.leases import COUNT_STATES, RunStatus
from ...protocol.store.lease_store import LeaseStore
from . import per_job
from .history import AttemptHistograms, LogStream
from .per_job import WORKERS_NEEDED, WORKERS_NEEDED_UNKNOWN

#: Event counters exported as ``redis_lease_<name>_total``.
EVENT_COUNTERS = {
    "claims": "Delivery attempts: successful claims, takeovers included.",
    "commits": "Items committed done.",
    "takeovers": "Claims that took over an expired lease.",
    "leases_cut": "Leases ended early because their shard job's heartbeats stopped (taken over).",
    "expired": "Leases that expired before their holder finished.",
    "stale_refused": "Writes refused because the writer no longer held the lease.",
    "stale_commits": "Commits refused because the committer no longer held the lease.",
    "retries": "Failed attempts scheduled for a retry.",
    "failures": "Failed attempts reported by handlers.",
    "releases": "Items given back unprocessed (drain, throttling, condition races).",
    "renewals": "Lease renewals.",
    "requeued": "Dead items moved back to pending.",
    "effects_reconciled": "Effects resolved by reconciling an earlier attempt.",
    "late_commits": "Commits accepted after the run's deadline (leases granted before it).",
}
#: Gauges of a run's accounting (redis_lease.protocol.leases.RunStatus), by attribute.
ACCOUNTING_GAUGES = {
    "planned": ("redis_lease_planned_items", "Items planned for the run."),
    "lost": (
        "redis_lease_lost_items",
        "Items planned but in no state any more: their records vanished (eviction, data loss).",
    ),
}
EFFECT_STATES = ("intended", "applied", "failed", "unknown")
AGES = {
    "oldest_eligible_age": "Age of the oldest item that is due and unclaimed.",
    "oldest_leased_age": "Age of the oldest live lease.",
    "oldest_unknown_effect_age": "Age of the oldest effect of unknown outcome.",
}
#: Run gauges read from the run's record: name -> help.
TIMES = {
    "redis_lease_run_deadline_timestamp_seconds": "The run's deadline, Unix time.",
    "redis_lease_run_projected_finish_timestamp_seconds": (
        "When the open run finishes at its recent rate (the tick samples it), Unix time; "
        "+Inf when nothing finished since the last sample."
    ),
    "redis_lease_run_workers_needed": "Workers the run needs to finish by its deadline.",
    "redis_lease_run_max_workers": "The most shard jobs working the run at once (job's cap).",
}
RUN_LABELS = ["run", "job"]
#: The newest ``SCAN_FACTOR * max_runs`` entries of the run index are looked at for open
#: ad-hoc runs and the newest final runs.
SCAN_FACTOR = 4

__all__ = ["EVENT_COUNTERS", "WORKERS_NEEDED", "WORKERS_NEEDED_UNKNOWN", "LeaseCollector"]


class _RunFamilies:
    """The run series of one scrape, filled run by run."""

    def __init__(self) -> None:
        def gauge(name: str, text: str, *extra: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=[*RUN_LABELS, *extra])

        self.items = gauge("redis_lease_items", "Items by state.", "state")
        self.states = gauge("redis_lease_run_state", "1 for the run's current state.", "state")
        self.ages = {n: gauge(f"redis_lease_{n}_seconds", t) for n, t in AGES.items()}
        self.effects = gauge("redis_lease_effects", "Effect records by state.", "state")
        self.outcomes = CounterMetricFamily(
            "redis_lease_outcomes", "Commits by outcome label.", labels=[*RUN_LABELS, "outcome"]
        )
        self.counters = {
            n: CounterMetricFamily(f"redis_lease_{n}", t, labels=RUN_LABELS)
            for n, t in EVENT_COUNTERS.items()
        }
        self.failed_jobs = CounterMetricFamily(
            "redis_lease_failed_shard_jobs",
            "Shard jobs of the run that raised or whose work horse died.",
            labels=RUN_LABELS,
        )
        self.accounting = {a: gauge(n, t) for a, (n, t) in ACCOUNTING_GAUGES.items()}
        self.times = {n: gauge(n, t) for n, t in TIMES.items()}

    def add(self, status: RunStatus, max_workers: int | None) -> None:
        labels = [status.run_id, status.info.get("job", "")]
        for state in COUNT_STATES:
            self.items.add_metric([*labels, state], status.counts[state])
        self.states.add_metric([*labels, status.state], 1)
        for name, family in self.ages.items():
            family.add_metric(labels, getattr(status, f"{name}_seconds"))
        for state in EFFECT_STATES:
            self.effects.add_metric([*labels, state], status.counters.get(f"effects_{state}", 0))
        for name, value in status.counters.items():
            if name.startswith("outcome_"):
                self.outcomes.add_metric([*labels, name.removeprefix("outcome_")], value)
        for name, counter in self.counters.items():
            counter.add_metric(labels, status.counters.get(name, 0))
        self.failed_jobs.add_metric(labels, job_failures(status.info).count)
        for attr, accounting in self.accounting.items():
            accounting.add_metric(labels, getattr(status, attr))
        for time_name, figure in _times(status, max_workers).items():
            self.times[time_name].add_metric(labels, figure)

    def all(self) -> list[Metric]:
        return [
            self.items,
            self.states,
            *self.ages.values(),
            self.effects,
            self.outcomes,
            *self.counters.values(),
            self.failed_jobs,
            *self.accounting.values(),
            *self.times.values(),
        ]


def _times(status: RunStatus, max_workers: int | None) -> dict[str, float]:
    """The run's deadline, projected finish and workers, those its record holds."""
    info, found = status.info, dict[str, float]()
    if info.get("deadline_at", "").isdigit() and int(info["deadline_at"]):
        found["redis_lease_run_deadline_timestamp_seconds"] = int(info["deadline_at"]) / 1000
    if status.state in OPEN_STATES:
        projected = info.get("projected_finish_at", "")
        if _number(info.get("rate_per_s", "")) == 0 and status.unfinished:
            found["redis_lease_run_projected_finish_timestamp_seconds"] = float("inf")
        elif projected.isdigit():
            found["redis_lease_run_projected_finish_timestamp_seconds"] = int(projected) / 1000
    if info.get("workers_needed", "").isdigit():
        found["redis_lease_run_workers_needed"] = int(info["workers_needed"])
    if max_workers is not None:
        found["redis_lease_run_max_workers"] = max_workers
    return found


def _bad_jobs(store: LeaseStore) -> Metric:
    """RQ jobs workers failed without running, by queue and reason (every reason of a
    queue that had one)."""
    family = CounterMetricFamily(
        "redis_lease_bad_jobs",
        "RQ jobs a worker failed without running: RQ could not read their hash or data (a "
        "pickled job, garbage; reason unreadable) or their function did not import "
        "(unimportable). Each is in its queue's RQ failed registry.",
        labels=["queue", "reason"],
    )
    for (queue, reason), count in sorted(bad_job_counts(store).items()):
        family.add_metric([queue, reason], count)
    return family


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _expired(status: RunStatus) -> bool:
    """A run with no record (its keys expired), or final and past its retention."""
    if not status.info:
        return True
    until = kept_until_ms(status.info)
    return until is not None and until <= status.now_ms


class LeaseCollector(Collector):
    """Collects the metrics of every open run and the newest ``max_runs`` final runs, of
    every job seen by a tick, of the server's eviction policy and of every provider gate.

    The attempt-log histograms accumulate in this object across scrapes (see
    :mod:`redis_lease.operate.metrics.history`): keep one collector per exporter process.
    """

    def __init__(self, store: LeaseStore, max_runs: int = METRICS_RUNS) -> None:
        self.store = store
        self.max_runs = max_runs
        self.history = AttemptHistograms()

    def collect(self) -> Iterator[Metric]:
        """One scrape: O(shards) reads per run, and a bounded read of new attempt-log entries."""
        jobs = per_job.job_names(self.store)
        runs = self._statuses(jobs)
        caps = self._caps({s.info.get("job", "") for s in runs} - {""})
        families = _RunFamilies()
        for status in runs:
            families.add(status, caps.get(status.info.get("job", "")))
        yield from families.all()
        yield from per_job.needs(self.store, jobs)
        yield from per_job.tallies(self.store, jobs)
        yield per_job.data_set_losses(self.store)
        yield from per_job.unticked(self.store)
        streams = [
            LogStream(
                self.store.keys.attempts(s.run_id, shard),
                s.info.get("job", ""),
                s.state not in OPEN_STATES,
            )
            for s in runs
            for shard in range(s.shards)
        ]
        self.history.update(self.store, streams)
        yield from self.history.families()
        yield per_job.eviction(self.store)
        yield from per_job.memory(self.store)
        yield from per_job.providers(self.store)
        yield _bad_jobs(self.store)

    def _statuses(self, jobs: list[str]) -> list[RunStatus]:
        """The runs to export that still have their keys, oldest first."""
        found = []
        for run_id in self._run_ids(jobs):
            try:
                status = self.store.status(run_id)
            except NotFound:
                continue
            if not _expired(status):
                found.append(status)
        return found

    def _run_ids(self, jobs: list[str]) -> list[str]:
        """Every job's open runs; among the newest ``SCAN_FACTOR * max_runs`` of the run
        index, the open runs (ad-hoc ones too) and the newest ``max_runs`` final ones."""
        keys, scan = self.store.keys, SCAN_FACTOR * self.max_runs
        with self.store.translating_errors():
            pipe = self.store.client.pipeline(transaction=False)
            start, end = (-scan, -1) if scan > 0 else (1, 0)  # 1..0: none
            pipe.zrange(keys.runs, start, end)
            for job in jobs:
                pipe.smembers(keys.job_open_runs(job))
            raw_newest, *open_sets = pipe.execute()
            newest = [as_text(r) for r in raw_newest]
            pipe = self.store.client.pipeline(transaction=False)
            for run_id in newest:
                pipe.hget(keys.run(run_id), "state")
            states = [as_text(s) if s else "" for s in (pipe.execute() if newest else [])]
        chosen = {as_text(r) for members in open_sets for r in members}
        finals = 0
        for run_id, state in reversed(list(zip(newest, states, strict=True))):
            if state in OPEN_STATES:
                chosen.add(run_id)
            elif state and finals < self.max_runs:  # no state: no record, nothing to show
                chosen.add(run_id)
                finals += 1
        order = {run_id: n for n, run_id in enumerate(newest)}
        return sorted(chosen, key=lambda r: (order.get(r, -1), r))

    def _caps(self, jobs: set[str]) -> dict[str, int]:
        """Each job's ``max_shard_jobs``, as its last tick recorded it (``max_workers`` in a
        record an earlier version wrote)."""
        names = sorted(jobs)
        with self.store.translating_errors():
            pipe = self.store.client.pipeline(transaction=False)
            for job in names:
                pipe.hmget(self.store.keys.job(job), ["max_shard_jobs", "max_workers"])
            replies = pipe.execute() if names else []
        caps = {
            job: new if new is not None else old
            for job, (new, old) in zip(names, replies, strict=True)
        }
        return {job: int(raw) for job, raw in caps.items() if raw is not None and raw.isdigit()}
