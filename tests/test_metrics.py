"""Prometheus metrics read from Redis: items, ages, counters, outcomes and provider gates;
run series by run and job (every open run), deadlines and projected finishes, runs
finished and missed, the attempt-log histograms (from the exporter's first scrape on),
the eviction policy, runs past their retention, and scrapes that only read."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redis_lease import Item, LeaseStore
from redis_lease.fleet.effects.ledger import Throttled
from redis_lease.fleet.effects.provider_gate import ProviderGate
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs import job_tallies, run_ages
from redis_lease.fleet.runs.lifecycle import FINAL_STATES, Runs, to_ms
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.fleet.transport.shard_job_failures import end_failure_streak
from redis_lease.limits import BATCH_MAX, DAY_MS
from redis_lease.operate.metrics.collector import (
    WORKERS_NEEDED,
    WORKERS_NEEDED_UNKNOWN,
    LeaseCollector,
)
from redis_lease.operate.metrics.history import HOLDER_EVENTS, AttemptHistograms, LogStream
from redis_lease.protocol.connection.server_checks import EvictionPolicyWarning
from redis_lease.protocol.store.attempt_log import latest
from tests.exported_metrics import RUN, T0, exercise
from tests.fleet_helpers import NIGHTLY_PATH, configure_nightly
from tests.helpers import scrape, server_ms, text, wait_past
from tests.redis_server import RedisServer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def collect(collector: LeaseCollector) -> Samples:
    """One scrape of ``collector`` (it keeps its histograms between scrapes)."""
    registry = CollectorRegistry()
    registry.register(collector)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }


@pytest.fixture
def nightly(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Job]]:
    """The nightly job on an RQ queue of this test's own."""
    yield from configure_nightly(real_store, monkeypatch, items=6)


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
    job = ("job", "")  # an ad-hoc run: no job
    run = ("run", "r")

    def item_count(state: str) -> float:
        return samples[("redis_lease_items", (job, run, ("state", state)))]

    assert [item_count(s) for s in ("pending", "leased", "done", "dead")] == [3, 1, 1, 0]
    assert samples[("redis_lease_claims_total", (job, run))] == 3
    assert samples[("redis_lease_commits_total", (job, run))] == 1
    assert samples[("redis_lease_retries_total", (job, run))] == 1
    assert samples[("redis_lease_outcomes_total", (job, ("outcome", "released"), run))] == 1
    assert samples[("redis_lease_run_state", (job, run, ("state", "running")))] == 1
    assert samples[("redis_lease_failed_shard_jobs_total", (job, run))] == 0
    # Its age on the server clock: from the claim to the scrape (ms brackets of both).
    leased = samples[("redis_lease_oldest_leased_age_seconds", (job, run))] * 1000
    assert read_from - claimed_to - 1e-6 <= leased <= read_to - claimed_from + 1e-6
    # An ad-hoc run has no deadline, projection or cap: no series rather than a made-up one.
    assert not [key for key in samples if key[0].startswith("redis_lease_run_deadline")]
    assert not [key for key in samples if key[0] == "redis_lease_run_max_workers"]


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


def test_run_series_carry_the_job_its_deadline_projection_and_cap(
    real_store: LeaseStore, nightly: Callable[..., Job]
) -> None:
    exercise(real_store)
    info = Runs(real_store).info(RUN)
    labels = (("job", "nightly"), ("run", RUN))
    samples = scrape(real_store)
    assert samples[("redis_lease_items", (*labels[:1], labels[1], ("state", "done")))] == 1
    assert samples[("redis_lease_items", (*labels[:1], labels[1], ("state", "dead")))] == 1
    assert samples[("redis_lease_stale_commits_total", labels)] == 1
    assert samples[("redis_lease_failed_shard_jobs_total", labels)] == 1
    assert samples[("redis_lease_planned_items", labels)] == 6
    assert samples[("redis_lease_lost_items", labels)] == 0
    deadline = samples[("redis_lease_run_deadline_timestamp_seconds", labels)]
    assert deadline == int(info["deadline_at"]) / 1000 == to_ms(T0.replace(hour=8, second=0)) / 1000
    # 2 items finished in the 10 s between the two ticks: 4 left at 0.2/s, 20 s more.
    projected = samples[("redis_lease_run_projected_finish_timestamp_seconds", labels)]
    assert projected == (to_ms(T0 + timedelta(seconds=30))) / 1000
    assert samples[("redis_lease_run_max_workers", labels)] == 4  # the nightly job's cap
    assert samples[("redis_lease_run_workers_needed", labels)] == int(info["workers_needed"])
    # Nothing finished by the next sample: it never finishes at this rate. (A shard job
    # that ends normally ends the failure streak: the tick samples the rate again.)
    end_failure_streak(real_store, RUN)
    tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(seconds=20))
    samples = scrape(real_store)
    assert math.isinf(samples[("redis_lease_run_projected_finish_timestamp_seconds", labels)])


def test_the_histograms_count_each_attempt_once_across_scrapes(real_store: LeaseStore) -> None:
    real_store.add("h", [Item(f"i{n}") for n in range(6)], shards=2)
    collector = LeaseCollector(real_store)
    collect(collector)  # the exporter's first scrape: attempts from now on are counted
    for n in range(3):
        real_store.commit(real_store.claim("h", f"i{n}", "w"), {"n": n})
    real_store.fail(real_store.claim("h", "i3", "w"), "boom")
    keys = [real_store.keys.attempts("h", shard) for shard in range(2)]

    def expected() -> tuple[int, float, int, float]:
        attempts = latest(real_store.client, keys, 1000)
        ran = [a.duration_seconds or 0.0 for a in attempts if a.event in HOLDER_EVENTS]
        waited = [a.queue_age_seconds or 0.0 for a in attempts if a.event != "refused"]
        return len(ran), sum(ran), len(waited), sum(waited)

    def observed(samples: Samples) -> tuple[int, float, int, float]:
        job = (("job", ""),)
        return (
            int(samples[("redis_lease_processing_duration_seconds_count", job)]),
            samples[("redis_lease_processing_duration_seconds_sum", job)],
            int(samples[("redis_lease_queue_age_seconds_count", job)]),
            samples[("redis_lease_queue_age_seconds_sum", job)],
        )

    first = collect(collector)
    assert observed(first) == pytest.approx(expected())
    assert observed(first)[0] == 4  # three commits and a retry
    assert observed(collect(collector)) == observed(first)  # nothing new: nothing twice
    real_store.commit(real_store.claim("h", "i4", "w"), {"n": 4})
    again = collect(collector)
    assert observed(again) == pytest.approx(expected())
    assert observed(again)[0] == 5
    inf = (("job", ""), ("le", "+Inf"))
    assert again[("redis_lease_processing_duration_seconds_bucket", inf)] == 5


def test_the_histograms_read_a_bounded_number_of_entries_per_scrape(
    real_store: LeaseStore,
) -> None:
    real_store.add("b", [Item(f"i{n}") for n in range(7)], shards=1)
    for n in range(7):
        real_store.commit(real_store.claim("b", f"i{n}", "w"))
    history = AttemptHistograms(max_entries=3, page=2)
    streams = [LogStream(real_store.keys.attempts("b", 0), "j")]
    assert history.update(real_store, []) == 0  # the first scrape: no run yet
    assert [history.update(real_store, streams) for _ in range(4)] == [3, 3, 1, 0]


def test_more_streams_than_the_bound_are_all_read_in_turn(real_store: LeaseStore) -> None:
    for n in range(3):
        real_store.add(f"s{n}", [Item("a")], shards=1)
        real_store.commit(real_store.claim(f"s{n}", "a", "w"))
    history = AttemptHistograms(max_entries=2)
    streams = [LogStream(real_store.keys.attempts(f"s{n}", 0), "j") for n in range(3)]
    assert history.update(real_store, []) == 0  # the first scrape: no run yet
    assert [history.update(real_store, streams) for _ in range(3)] == [2, 1, 0]
    [processing, _queue, _skipped] = history.families()
    count = next(s.value for s in processing.samples if s.name.endswith("_count"))
    assert count == 3


def _processed(samples: Samples, job: str = "") -> float:
    return samples.get(("redis_lease_processing_duration_seconds_count", (("job", job),)), 0)


def test_a_new_exporter_counts_only_the_attempts_after_its_first_scrape(
    real_store: LeaseStore,
) -> None:
    real_store.add("old", [Item(f"i{n}") for n in range(4)], shards=2)
    first = LeaseCollector(real_store)
    collect(first)
    for n in range(3):
        real_store.commit(real_store.claim("old", f"i{n}", "w"))
    assert _processed(collect(first)) == 3
    # A restarted exporter: the logs' history is not new to it (no burst after the reset).
    second = LeaseCollector(real_store)
    assert _processed(collect(second)) == 0
    real_store.commit(real_store.claim("old", "i3", "w"))
    assert _processed(collect(second)) == 1
    # A run that appears after its first scrape is read from its start.
    real_store.add("new", [Item("a"), Item("b")], shards=1)
    for item in ("a", "b"):
        real_store.commit(real_store.claim("new", item, "w"))
    assert _processed(collect(second)) == 3
    assert _processed(collect(first)) == 6


def test_a_final_runs_log_is_not_read_again_once_read_to_its_end(real_store: LeaseStore) -> None:
    real_store.add("f", [Item("a"), Item("b")], shards=1)
    key = real_store.keys.attempts("f", 0)
    history = AttemptHistograms()
    assert history.update(real_store, [LogStream(key, "j")]) == 0
    real_store.commit(real_store.claim("f", "a", "w"))
    assert history.update(real_store, [LogStream(key, "j", final=True)]) == 1
    # Read to its end while final: an entry added now is not looked for...
    real_store.client.xadd(key, {"item": "b", "event": "committed", "queue_ms": 5, "run_ms": 5})
    assert history.update(real_store, [LogStream(key, "j", final=True)]) == 0
    # ...until the run is open again (resumed).
    assert history.update(real_store, [LogStream(key, "j")]) == 1


def test_entries_trimmed_before_they_were_read_are_counted_as_skipped(
    real_store: LeaseStore,
) -> None:
    real_store.add("g", [Item(f"i{n}") for n in range(8)], shards=1)
    key = real_store.keys.attempts("g", 0)
    history = AttemptHistograms()
    assert history.update(real_store, [LogStream(key, "j")]) == 0
    for n in range(2):
        real_store.commit(real_store.claim("g", f"i{n}", "w"))
    assert history.update(real_store, [LogStream(key, "j")]) == 2
    for n in range(2, 8):
        real_store.commit(real_store.claim("g", f"i{n}", "w"))
    real_store.client.xtrim(key, maxlen=2, approximate=False)  # the exporter fell behind
    assert history.update(real_store, [LogStream(key, "j")]) == 2
    processing, _queue, skipped = history.families()
    [count] = [s.value for s in processing.samples if s.name.endswith("_count")]
    assert (count, skipped.samples[0].value) == (4, 4)
    assert skipped.samples[0].name == "redis_lease_attempt_log_skipped_total"
    assert history.update(real_store, [LogStream(key, "j")]) == 0  # nothing counted twice
    assert history.families()[2].samples[0].value == 4


def test_every_open_run_is_exported_however_many_runs_are_newer(
    real_store: LeaseStore, nightly: Callable[..., Job]
) -> None:
    tick(real_store, [NIGHTLY_PATH], now=T0)  # the job's run: open
    real_store.add("adhoc-open", [Item("a")], shards=1)
    runs = Runs(real_store)
    for n in range(4):
        real_store.add(f"later-{n}", [Item("a")], shards=1)
        runs.finalize(f"later-{n}", "test")
    samples = collect(LeaseCollector(real_store, max_runs=2))
    exported = {
        dict(labels)["run"] for name, labels in samples if name == "redis_lease_planned_items"
    }
    assert exported == {RUN, "adhoc-open", "later-2", "later-3"}


def test_runs_finished_series_start_at_zero_for_ad_hoc_runs_and_each_job(
    real_store: LeaseStore, nightly: Callable[..., Job]
) -> None:
    def finished(job: str) -> dict[str, float]:
        samples = scrape(real_store)
        return {
            s: samples[("redis_lease_runs_finished_total", (("job", job), ("state", s)))]
            for s in FINAL_STATES
        }

    assert finished("") == dict.fromkeys(FINAL_STATES, 0)  # before any run ended
    tick(real_store, [NIGHTLY_PATH], now=T0)
    assert finished("nightly") == dict.fromkeys(FINAL_STATES, 0)


def test_counted_ends_leave_at_their_own_expiry(real_store: LeaseStore) -> None:
    key = job_tallies.counted_runs_key(real_store, "j")
    now = server_ms(real_store.client)
    assert job_tallies.count_finished(real_store, "j", "long", "failed", 1, retention_days=30)
    kept_until = real_store.client.zscore(key, "long@1")
    assert kept_until is not None and kept_until >= now + 31 * DAY_MS
    real_store.client.zadd(key, {"past@1": now - 1})  # an end whose own expiry passed
    # A run of the same job with a shorter retention prunes only by each entry's expiry.
    assert job_tallies.count_finished(real_store, "j", "short", "failed", 2, retention_days=1)
    assert real_store.client.zscore(key, "past@1") is None
    assert real_store.client.zscore(key, "long@1") == kept_until
    assert not job_tallies.count_finished(real_store, "j", "long", "failed", 1, retention_days=30)


def test_missed_dates_past_one_calls_bound_are_all_marked_and_counted_once(
    real_store: LeaseStore,
) -> None:
    """The script takes at most BATCH_MAX dates a call; more are sent in several calls."""
    days = [f"d{n:05d}" for n in range(BATCH_MAX + 2)]
    real_store.client.zadd(real_store.keys.job_dates("j"), {days[-1]: 5})  # a run was made
    assert job_tallies.count_missed(real_store, "j", days) == days[:-1]
    assert job_tallies.count_missed(real_store, "j", days) == []
    assert job_tallies.read(real_store, ["j"])["j"].missed == BATCH_MAX + 1


def test_a_slow_run_has_a_finite_projected_finish(
    real_store: LeaseStore, nightly: Callable[..., Job]
) -> None:
    tick(real_store, [NIGHTLY_PATH], now=T0)  # plans 6 items and samples the rate
    real_store.commit(real_store.claim(RUN, "night-00000", "w1", ttl=60))
    later = T0 + timedelta(hours=1)
    tick(real_store, [NIGHTLY_PATH], now=later)  # 1 item an hour: 5 left, 5 hours
    labels = (("job", "nightly"), ("run", RUN))
    projected = scrape(real_store)[("redis_lease_run_projected_finish_timestamp_seconds", labels)]
    assert projected == pytest.approx(to_ms(later + timedelta(hours=5)) / 1000, abs=0.01)


def test_runs_finished_are_counted_once_by_job_and_state(
    real_store: LeaseStore, nightly: Callable[..., Job]
) -> None:
    runs = Runs(real_store)
    real_store.add("adhoc-1", [Item("a")], shards=1)
    real_store.add("adhoc-2", [Item("a")], shards=1)
    assert runs.finalize("adhoc-1", "test") is not None
    assert runs.finalize("adhoc-1", "test again") is None  # already final: not counted again
    assert runs.cancel("adhoc-2")
    samples = scrape(real_store)
    adhoc = {
        s: samples[("redis_lease_runs_finished_total", (("job", ""), ("state", s)))]
        for s in FINAL_STATES
    }
    assert adhoc == {"succeeded": 0, "partial": 0, "failed": 1, "canceled": 1}
    # A run finalized by the tick, then made final again after a resume: each end counts
    # (an alert on a resumed run that fails again fires again), each once.
    tick(real_store, [NIGHTLY_PATH], now=T0)
    real_store.commit(real_store.claim(RUN, "night-00000", "w1", ttl=60))
    tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(hours=6))
    assert runs.info(RUN)["state"] == "partial"
    key = ("redis_lease_runs_finished_total", (("job", "nightly"), ("state", "partial")))
    assert scrape(real_store)[key] == 1
    runs.resume(RUN, T0 + timedelta(days=2))
    wait_past(real_store.client, int(runs.info(RUN)["state_at"]) + 1)  # a later end
    assert runs.finalize(RUN, "again") is not None
    assert runs.finalize(RUN, "again") is None
    runs.retire_if_final(RUN, runs.info(RUN))  # a repair of the same end counts nothing
    assert scrape(real_store)[key] == 2
    assert scrape(real_store)[("redis_lease_missed_runs_total", (("job", "nightly"),))] == 0


def test_a_run_made_final_but_not_counted_is_counted_by_the_next_tick(
    real_store: LeaseStore, nightly: Callable[..., Job]
) -> None:
    runs = Runs(real_store)
    tick(real_store, [NIGHTLY_PATH], now=T0)
    # What a crash right after the state change leaves: final, still listed open, uncounted.
    assert runs.transition(RUN, ("running",), "canceled", "crash after this")
    key = ("redis_lease_runs_finished_total", (("job", "nightly"), ("state", "canceled")))
    assert scrape(real_store)[key] == 0
    tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(minutes=1))
    assert RUN not in runs.open_runs("nightly")
    assert scrape(real_store)[key] == 1
    runs.retire_if_final(RUN, runs.info(RUN))  # a second repair counts nothing
    assert scrape(real_store)[key] == 1


def test_a_run_whose_keys_are_gone_has_no_series(real_store: LeaseStore) -> None:
    real_store.add("kept", [Item("a")], shards=1)
    real_store.add("gone", [Item("a")], shards=1)
    collector = LeaseCollector(real_store)
    assert ("redis_lease_planned_items", (("job", ""), ("run", "gone"))) in collect(collector)
    # Its retention ended: every key of the run expired; the run index still lists it.
    real_store.client.delete(*real_store.client.keys(f"{real_store.prefix}:*gone*"))
    assert "gone" in real_store.run_ids()
    samples = collect(collector)  # the store still knows its shard count: nothing shown
    assert not [key for key in samples if ("run", "gone") in key[1]]
    assert ("redis_lease_planned_items", (("job", ""), ("run", "kept"))) in samples
    # Final, and its record says its retention ended (the keys not expired yet): none either.
    Runs(real_store).finalize("kept", "test")
    state_at = int(Runs(real_store).info("kept")["state_at"])
    real_store.client.hset(
        real_store.keys.run("kept"),
        mapping={"retention_days": "1", "state_at": str(state_at - 86_400_000)},
    )
    assert not [key for key in collect(collector) if ("run", "kept") in key[1]]


def test_a_scrape_only_reads_redis(private_redis: Callable[..., RedisServer]) -> None:
    server = private_redis()
    admin = LeaseStore.from_url(server.url, prefix="ro")
    reader = None
    try:
        admin.add("r", [Item("a"), Item("b")], shards=2)
        admin.commit(admin.claim("r", "a", "w"))
        # Read commands, and scripts whose calls are reads (ACL checks each call).
        rules = [
            "+@read",
            "+@connection",
            "+@scripting",
            "+@transaction",
            "+time",
            "+config|get",
            "-@write",
        ]
        admin.client.acl_setuser(
            "reader", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=rules
        )
        reader = LeaseStore.from_url(server.url.replace("://", "://reader:pw@"), prefix="ro")
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.client.set("ro:probe", "1")
        collector = LeaseCollector(reader)
        collect(collector)
        admin.commit(admin.claim("r", "b", "w"))
        samples = collect(collector)
        assert samples[("redis_lease_items", (("job", ""), ("run", "r"), ("state", "done")))] == 2
        assert _processed(samples) == 1
        assert not admin.client.exists(run_ages.key(admin, "r"))  # nothing sampled
    finally:
        admin.client.close()
        if reader is not None:
            reader.client.close()


def test_an_evicting_memory_policy_is_a_gauge(
    real_store: LeaseStore, private_redis: Callable[..., RedisServer]
) -> None:
    server = private_redis(**{"maxmemory-policy": "allkeys-lru"})
    with pytest.warns(EvictionPolicyWarning):
        evicting = LeaseStore.from_url(server.url, prefix="ev")
    try:
        danger = scrape(evicting)
    finally:
        evicting.client.close()
    assert danger[("redis_lease_redis_eviction_danger", (("policy", "allkeys-lru"),))] == 1
    policy = text(real_store.client.config_get("maxmemory-policy")["maxmemory-policy"])
    safe = scrape(real_store)[("redis_lease_redis_eviction_danger", (("policy", policy),))]
    assert safe == (0 if policy == "noeviction" else 1)
