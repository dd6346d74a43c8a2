"""Prometheus metrics of runs and providers, read from Redis on each scrape.

Three numbers stay apart: delivery attempts (``redis_lease_claims_total``),
successful state transitions (``redis_lease_commits_total``, outcomes by label)
and the processing rate (``rate()`` of those counters). The SLO metric is
``redis_lease_oldest_eligible_age_seconds``. A run's accounting:
``redis_lease_planned_items``, ``redis_lease_lost_items`` (records that vanished)
and ``redis_lease_late_commits_total`` (commits after the deadline). For an
autoscaler: ``redis_lease_workers_needed`` by job, the workers that finish the
open runs' remaining items before their deadlines (the tick computes it, see
:mod:`redis_lease.capacity`), and ``redis_lease_workers_needed_unknown_runs``,
the running runs whose need is not known yet (no worker has recorded a pass).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .connection import as_text
from .errors import NotFound
from .gate import ProviderGate
from .lease import COUNT_STATES
from .store import LeaseStore

#: Event counters exported as ``redis_lease_<name>_total``.
EVENT_COUNTERS = {
    "claims": "Delivery attempts: successful claims, takeovers included.",
    "commits": "Items committed done.",
    "takeovers": "Claims that took over an expired lease.",
    "expired": "Leases that expired before their holder finished.",
    "stale_refused": "Writes refused because the writer no longer held the lease.",
    "stale_commits": "Commits refused because the committer no longer held the lease.",
    "retries": "Failed attempts scheduled for a retry.",
    "failures": "Failed attempts reported by handlers.",
    "releases": "Items given back unprocessed (drain, throttling, condition races).",
    "renewals": "Lease renewals.",
    "requeued": "Dead items moved back to pending.",
    "effects_reconciled": "Effects settled by reconciling an earlier attempt.",
    "late_commits": "Commits accepted after the run's deadline (leases granted before it).",
}
#: Gauges of a run's accounting (redis_lease.lease.RunStatus), by attribute.
ACCOUNTING_GAUGES = {
    "planned": ("redis_lease_planned_items", "Items planned for the run."),
    "lost": (
        "redis_lease_lost_items",
        "Items planned but in no state any more: their records vanished (eviction, data loss).",
    ),
}
EFFECT_STATES = ("intended", "applied", "failed", "unknown")
#: The gauge an autoscaler scales on: workers needed by job, summed over its running runs.
WORKERS_NEEDED = "redis_lease_workers_needed"
WORKERS_NEEDED_UNKNOWN = "redis_lease_workers_needed_unknown_runs"


class LeaseCollector(Collector):
    """Collects the metrics of the newest ``max_runs`` runs and of every provider gate."""

    def __init__(self, store: LeaseStore, max_runs: int = 50) -> None:
        self.store = store
        self.max_runs = max_runs

    def collect(self) -> Iterator[Metric]:
        """One scrape: O(shards) reads per run."""
        items = GaugeMetricFamily("redis_lease_items", "Items by state.", labels=["run", "state"])
        states = GaugeMetricFamily(
            "redis_lease_run_state", "1 for the run's current state.", labels=["run", "state"]
        )
        ages = {
            name: GaugeMetricFamily(f"redis_lease_{name}_seconds", text, labels=["run"])
            for name, text in (
                ("oldest_eligible_age", "Age of the oldest item that is due and unclaimed."),
                ("oldest_leased_age", "Age of the oldest live lease."),
                ("oldest_unknown_effect_age", "Age of the oldest effect of unknown outcome."),
            )
        }
        effects = GaugeMetricFamily(
            "redis_lease_effects", "Effect records by state.", labels=["run", "state"]
        )
        outcomes = CounterMetricFamily(
            "redis_lease_outcomes", "Commits by outcome label.", labels=["run", "outcome"]
        )
        counters = {
            name: CounterMetricFamily(f"redis_lease_{name}", text, labels=["run"])
            for name, text in EVENT_COUNTERS.items()
        }
        accounting = {
            attr: GaugeMetricFamily(name, text, labels=["run"])
            for attr, (name, text) in ACCOUNTING_GAUGES.items()
        }
        for run_id in self.store.run_ids()[-self.max_runs :]:
            try:
                status = self.store.status(run_id)
            except NotFound:
                continue
            for state in COUNT_STATES:
                items.add_metric([run_id, state], status.counts[state])
            states.add_metric([run_id, status.state], 1)
            ages["oldest_eligible_age"].add_metric([run_id], status.oldest_eligible_age_seconds)
            ages["oldest_leased_age"].add_metric([run_id], status.oldest_leased_age_seconds)
            ages["oldest_unknown_effect_age"].add_metric(
                [run_id], status.oldest_unknown_effect_age_seconds
            )
            for state in EFFECT_STATES:
                effects.add_metric([run_id, state], status.counters.get(f"effects_{state}", 0))
            for name, value in status.counters.items():
                if name.startswith("outcome_"):
                    outcomes.add_metric([run_id, name.removeprefix("outcome_")], value)
            for name, family in counters.items():
                family.add_metric([run_id], status.counters.get(name, 0))
            for attr, gauge in accounting.items():
                gauge.add_metric([run_id], getattr(status, attr))
        yield from (items, states, *ages.values(), effects, outcomes, *counters.values())
        yield from accounting.values()
        yield from self._needs()
        yield from self._providers()

    def _needs(self) -> Iterable[Metric]:
        """Workers needed by job: the sum over its running runs whose need is known.

        A job with no running run needs 0. A job whose running runs are all
        unknown has no ``workers_needed`` series: nothing is invented.
        """
        needed = GaugeMetricFamily(
            WORKERS_NEEDED,
            "Workers that finish the job's running runs before their deadlines, spares included.",
            labels=["job"],
        )
        unknown = GaugeMetricFamily(
            WORKERS_NEEDED_UNKNOWN,
            "Running runs of the job whose need is unknown (no worker pass recorded yet).",
            labels=["job"],
        )
        keys = self.store.keys
        with self.store.translating_errors():
            jobs = sorted(as_text(j) for j in self.store.client.smembers(keys.jobs))
            for job in jobs:
                runs = sorted(
                    as_text(r) for r in self.store.client.smembers(keys.job_open_runs(job))
                )
                pipe = self.store.client.pipeline(transaction=False)
                for run_id in runs:
                    pipe.hmget(keys.run(run_id), ["state", "workers_needed"])
                total, missing, known = 0, 0, False
                for state, value in pipe.execute() if runs else []:
                    if state is None or as_text(state) != "running":
                        continue
                    text = as_text(value) if value is not None else ""
                    if text.isdigit():
                        total, known = total + int(text), True
                    else:
                        missing += 1
                if known or not missing:
                    needed.add_metric([job], total)
                unknown.add_metric([job], missing)
        return [needed, unknown]

    def _providers(self) -> Iterable[Metric]:
        cap = GaugeMetricFamily("redis_lease_provider_cap", "Current cap.", labels=["provider"])
        used = GaugeMetricFamily(
            "redis_lease_provider_slots_in_use", "Slots held now.", labels=["provider"]
        )
        throttles = CounterMetricFamily(
            "redis_lease_provider_throttles", "Throttle answers seen.", labels=["provider"]
        )
        pattern = f"{self.store.prefix}:provider:{{*}}:state"
        for key in self.store.client.scan_iter(match=pattern, count=500):
            name = (key.decode() if isinstance(key, bytes) else key).split("{", 1)[1].split("}")[0]
            state = ProviderGate(self.store, name, max_concurrency=1).state()
            cap.add_metric([name], state.cap)
            used.add_metric([name], state.in_use)
            throttles.add_metric([name], state.throttles)
        return [cap, used, throttles]
