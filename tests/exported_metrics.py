"""A real run that exercises every metric, and the sample names the exporter serves for it.

The alert-rule and Grafana-board tests compare the metric names their queries use with
these. The run is the nightly job's (tests.fleet_jobs), ticked with explicit times: one
item done, one dead, one retried, a stale commit, a failed shard job, a worker pass (so
its need is known), a second tick that samples its rate (so its finish is projected),
then a failed shard job; a worker declares the job it ticks (no worker leads, so it is not
ticked); the exporter's collector scrapes before and after.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, time, timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redis_lease import LeaseStore
from redis_lease.errors import LeaseLost
from redis_lease.fleet.capacity.run_capacity import record_pass
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.fleet.transport.shard_job_failures import record_job_failure
from redis_lease.operate.metrics.collector import LeaseCollector
from redis_lease.protocol.store.declared_jobs import declare_jobs
from tests.fleet_helpers import NIGHTLY_PATH
from tests.helpers import wait_past

#: Tomorrow's nightly run: its deadline lies ahead on the server clock.
DAY = datetime.now(UTC).date() + timedelta(days=1)
T0 = datetime.combine(DAY, time(2, 0, 30), UTC)
RUN = f"nightly:{DAY.isoformat()}"


def exercise(store: LeaseStore) -> LeaseCollector:
    """Works the nightly run as the module says; returns a collector that scraped before
    (an exporter counts only the attempts after its first scrape) and after it."""
    collector = LeaseCollector(store)
    sample_names(collector)
    tick(store, [NIGHTLY_PATH], now=T0)
    store.commit(store.claim(RUN, "night-00000", "w1", ttl=60), {"ok": True})
    store.fail(store.claim(RUN, "night-00001", "w1", ttl=60), "boom", permanent=True)
    store.fail(store.claim(RUN, "night-00002", "w1", ttl=60), "flaky")
    stale = store.claim(RUN, "night-00003", "w1", ttl=0.05)
    wait_past(store.client, stale.expires_at_ms + 1)
    store.claim(RUN, "night-00003", "w2", ttl=60)  # takes the expired lease over
    try:
        store.commit(stale, {"ok": True})
    except LeaseLost:
        pass
    else:
        raise AssertionError("a commit with a stale token was accepted")
    record_pass(store, RUN, handled=2, handler_seconds=1.0, busy_seconds=2.0)
    tick(store, [NIGHTLY_PATH], now=T0 + timedelta(seconds=10))
    record_job_failure(store, RUN, 0, "RuntimeError: the worker died")  # after: no burst then
    declare_jobs(store, "w1#exercise", "w1", {"nightly": NIGHTLY_PATH})
    sample_names(collector)
    return collector


def sample_names(collector: LeaseCollector) -> set[str]:
    """Every sample name in one scrape of ``collector`` (``_total``, ``_bucket``, ...)."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


_PROMQL_WORDS = """abs absent absent_over_time avg avg_over_time bool by ceil changes clamp
clamp_max clamp_min count count_over_time count_values delta deriv exp floor group group_left
group_right histogram_quantile idelta ignoring increase irate label_replace label_values
last_over_time ln log2 log10 max max_over_time min min_over_time offset on or and unless
predict_linear quantile quantile_over_time rate resets round scalar sort sort_desc sqrt
stddev stdvar sum sum_over_time time timestamp topk bottomk vector without inf nan"""
#: PromQL words that are not metric names: functions, aggregations, keywords.
PROMQL_WORDS = frozenset(_PROMQL_WORDS.split())
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_RANGES = re.compile(r"\[[^\]]*\]")
_WORDS = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_DURATION = re.compile(r"^\d")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana query) reads.

    Grafana's ``label_values(metric, label)`` reads ``metric``. Strings, label matchers,
    ``by (...)``-style label lists and range selectors are
    removed first; what is left that is not a PromQL word or a Grafana variable
    (``$job``) is a metric name.
    """
    text = re.sub(r"label_values\(([^,()]+),\s*\w+\)", r"\1", expr)  # Grafana's: metric, label
    text = _STRINGS.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _GROUPINGS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    words = {w for w in _WORDS.findall(text) if w.lower() not in PROMQL_WORDS}
    return {w for w in words if not _DURATION.match(w) and not re.fullmatch(r"e\d*", w)}
