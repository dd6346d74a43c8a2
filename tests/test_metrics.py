"""Prometheus metrics read from Redis: items, ages, counters, outcomes and provider gates."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redis_lease import Item, LeaseStore
from redis_lease.effects import Throttled
from redis_lease.gate import ProviderGate
from redis_lease.metrics import WORKERS_NEEDED, WORKERS_NEEDED_UNKNOWN, LeaseCollector
from tests.helpers import scrape, server_ms, wait_past


def test_metrics_follow_the_run(store: LeaseStore) -> None:
    store.add("r", [Item(f"i{n}") for n in range(5)], shards=2)
    first = store.claim("r", "i0", "w")
    store.commit(first, {"ok": True}, label="released")
    second = store.claim("r", "i1", "w")
    store.fail(second, "boom")
    claimed_from = server_ms(store.client)
    store.claim("r", "i2", "w")
    claimed_to = server_ms(store.client)
    wait_past(store.client, claimed_to + 50)  # the live lease is some 50 ms old
    read_from = server_ms(store.client)
    samples = scrape(store)
    read_to = server_ms(store.client)
    run = ("run", "r")

    def item_count(state: str) -> float:
        return samples[("redis_lease_items", (run, ("state", state)))]

    assert [item_count(s) for s in ("pending", "leased", "done", "dead")] == [3, 1, 1, 0]
    assert samples[("redis_lease_claims_total", (run,))] == 3
    assert samples[("redis_lease_commits_total", (run,))] == 1
    assert samples[("redis_lease_retries_total", (run,))] == 1
    assert samples[("redis_lease_outcomes_total", (("outcome", "released"), run))] == 1
    assert samples[("redis_lease_run_state", (run, ("state", "running")))] == 1
    # Its age on the server clock: from the claim to the scrape (ms brackets of both).
    leased = samples[("redis_lease_oldest_leased_age_seconds", (run,))] * 1000
    assert read_from - claimed_to - 1e-6 <= leased <= read_to - claimed_from + 1e-6


def test_metrics_show_a_throttled_provider(store: LeaseStore) -> None:
    gate = ProviderGate(store, "pay", max_concurrency=8)
    try:
        with gate.slot(wait=1):
            raise Throttled("429", retry_after=0.01)
    except Throttled:
        pass
    samples = scrape(store)
    assert samples[("redis_lease_provider_cap", (("provider", "pay"),))] == 4
    assert samples[("redis_lease_provider_throttles_total", (("provider", "pay"),))] == 1
    assert samples[("redis_lease_provider_slots_in_use", (("provider", "pay"),))] == 0


def test_workers_needed_is_a_gauge_by_job(store: LeaseStore) -> None:
    registry = CollectorRegistry()
    registry.register(LeaseCollector(store))
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
    }
    for name in (WORKERS_NEEDED, WORKERS_NEEDED_UNKNOWN):
        assert families[name].type == "gauge"
        assert families[name].samples == []  # no job ticked yet: no series
