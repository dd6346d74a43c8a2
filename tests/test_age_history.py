"""A run's oldest eligible age over time: read order, the least interval between samples,
the cap, expiry with the run's other keys, and no sample (nor key) once the run is final."""

from __future__ import annotations

from datetime import timedelta

from redis_lease import Item, LeaseStore
from redis_lease.fleet.runs import run_ages
from redis_lease.fleet.runs.lifecycle import Runs


def _run(store: LeaseStore, run_id: str = "aged") -> str:
    store.add(run_id, [Item("a"), Item("b")], shards=1)
    return run_id


def test_samples_read_oldest_first_and_the_newest_when_limited(real_store: LeaseStore) -> None:
    run_id = _run(real_store)
    start = 1_800_000_000_000
    for n in range(5):
        if n == 2:
            real_store.commit(real_store.claim(run_id, "a", "w"))
        status = real_store.status(run_id)
        assert run_ages.record(real_store, status, start + n * run_ages.MIN_INTERVAL_MS)
    samples = run_ages.read(real_store, run_id)
    assert [s.at_ms for s in samples] == [start + n * 10_000 for n in range(5)]
    assert [(s.done, s.unfinished) for s in samples] == [(0, 2)] * 2 + [(1, 1)] * 3
    newest = run_ages.read(real_store, run_id, limit=2)
    assert [s.at_ms for s in newest] == [start + 30_000, start + 40_000]


def test_samples_closer_than_the_least_interval_are_skipped(real_store: LeaseStore) -> None:
    run_id = _run(real_store)
    status = real_store.status(run_id)
    start = 1_800_000_000_000
    assert run_ages.record(real_store, status, start)
    assert not run_ages.record(real_store, status, start + run_ages.MIN_INTERVAL_MS - 1)
    assert run_ages.record(real_store, status, start + run_ages.MIN_INTERVAL_MS)
    assert len(run_ages.read(real_store, run_id)) == 2


def test_the_series_keeps_about_its_cap(real_store: LeaseStore) -> None:
    run_id = _run(real_store)
    status = real_store.status(run_id)
    start = 1_800_000_000_000
    count = run_ages.CAP + 300
    for n in range(count):
        run_ages.record(real_store, status, start + n * run_ages.MIN_INTERVAL_MS)
    length = real_store.client.xlen(run_ages.key(real_store, run_id))
    # MAXLEN ~ trims whole nodes of the stream (100 entries by default): a little over the cap.
    assert run_ages.CAP <= length < run_ages.CAP + 200
    samples = run_ages.read(real_store, run_id)
    assert len(samples) == run_ages.CAP
    assert samples[-1].at_ms == start + (count - 1) * run_ages.MIN_INTERVAL_MS


def test_the_series_expires_with_the_run_and_is_kept_on_resume(real_store: LeaseStore) -> None:
    run_id = _run(real_store)
    key = run_ages.key(real_store, run_id)
    assert run_ages.record(real_store, real_store.status(run_id), 1_800_000_000_000)
    assert real_store.client.pttl(key) == -1  # an open run's series does not expire
    runs = Runs(real_store)
    runs.finalize(run_id, "test")
    record_ttl = real_store.client.pttl(real_store.keys.run(run_id))
    series_ttl = real_store.client.pttl(key)
    assert record_ttl > 0 and abs(series_ttl - record_ttl) < 1000
    runs.resume(run_id, runs.server_now() + timedelta(hours=1))
    assert real_store.client.pttl(key) == -1
    assert len(run_ages.read(real_store, run_id)) == 1


def test_no_sample_is_added_once_the_run_is_final(real_store: LeaseStore) -> None:
    run_id = _run(real_store)
    status = real_store.status(run_id)  # read while open, as a tick does
    Runs(real_store).finalize(run_id, "test")
    key = run_ages.key(real_store, run_id)
    real_store.client.delete(key)  # the series did not exist when the run was retired
    # The sample comes after the retirement: no key without a time to live is left.
    assert not run_ages.record(real_store, status, 1_800_000_000_000)
    assert not real_store.client.exists(key)


def test_a_sample_takes_the_time_to_live_of_the_runs_record(real_store: LeaseStore) -> None:
    run_id = _run(real_store)
    status = real_store.status(run_id)
    real_store.client.pexpire(real_store.keys.run(run_id), 60_000)
    assert run_ages.record(real_store, status, 1_800_000_000_000)
    ttl = real_store.client.pttl(run_ages.key(real_store, run_id))
    assert 59_000 < ttl <= 60_000
    real_store.client.delete(real_store.keys.run(run_id))  # its record gone: no sample
    assert not run_ages.record(real_store, status, 1_800_000_020_000)
