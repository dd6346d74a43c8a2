"""The provider gate: a fleet-wide concurrency cap in Redis that adapts to throttling.

Threads and OS processes share one gate; a slot whose holder was killed expires;
a 429 halves the cap and pauses new slots for its Retry-After; successes raise
the cap again one step per full window, never past the max.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redis_lease import LeaseStore
from redis_lease.errors import SlotTimeout
from redis_lease.fleet.effects.ledger import Throttled
from redis_lease.fleet.effects.provider_gate import GateState, ProviderGate
from tests.helpers import server_ms

ROOT = Path(__file__).resolve().parent.parent


def throttle(gate: ProviderGate, retry_after: float = 0.0) -> None:
    """One call that the provider answers with 429."""
    with pytest.raises(Throttled), gate.slot(wait=5):
        raise Throttled("429", retry_after=retry_after)


def succeed(gate: ProviderGate, times: int = 1) -> None:
    """Calls that succeed."""
    for _ in range(times):
        with gate.slot(wait=5):
            pass


def test_state_before_any_call_is_the_configured_cap(store: LeaseStore) -> None:
    gate = ProviderGate(store, "bank", max_concurrency=6, min_concurrency=2)
    assert gate.state() == GateState(
        name="bank",
        cap=6,
        in_use=0,
        min_cap=2,
        max_cap=6,
        throttles=0,
        paused_until_ms=0,
        counters={},
    )


def test_slots_count_in_use_and_free_on_exit(store: LeaseStore) -> None:
    gate = ProviderGate(store, "bank", max_concurrency=2)
    with gate.slot(wait=1):
        assert gate.state().in_use == 1
        with gate.slot(wait=1):
            assert gate.state().in_use == 2
            with pytest.raises(SlotTimeout, match="bank"), gate.slot(wait=0.05):
                pass
    state = gate.state()
    assert (state.in_use, state.cap) == (0, 2)
    assert state.counters["granted"] == 2
    assert state.counters["peak_in_use"] == 2
    assert state.counters["waits"] >= 1


def test_error_frees_the_slot_and_leaves_the_cap(store: LeaseStore) -> None:
    gate = ProviderGate(store, "bank", max_concurrency=4)
    throttle(gate)
    with pytest.raises(ValueError, match="boom"), gate.slot(wait=1):
        raise ValueError("boom")
    state = gate.state()
    assert (state.cap, state.in_use, state.throttles) == (2, 0, 1)
    assert state.counters["successes"] == 0


def test_throttle_halves_the_cap_down_to_the_minimum(store: LeaseStore) -> None:
    gate = ProviderGate(store, "bank", max_concurrency=10, min_concurrency=2)
    caps = []
    for _ in range(4):
        throttle(gate)
        caps.append(gate.state().cap)
    assert caps == [5, 2, 2, 2]
    state = gate.state()
    assert state.throttles == 4
    assert state.counters["cap_changes"] == 2


def test_throttle_pauses_new_slots_for_retry_after(store: LeaseStore) -> None:
    gate = ProviderGate(store, "bank", max_concurrency=8)
    before = server_ms(store.client)
    throttle(gate, retry_after=0.4)
    state = gate.state()
    assert state.cap == 4
    assert before + 400 <= state.paused_until_ms <= server_ms(store.client) + 400
    assert state.paused_until_ms - server_ms(store.client) >= 250  # the checks below fit in
    with pytest.raises(SlotTimeout), gate.slot(wait=0.05):
        pass
    with gate.slot(wait=5):
        granted_at = server_ms(store.client)
    assert granted_at >= state.paused_until_ms


def test_a_later_shorter_throttle_does_not_shorten_the_pause(store: LeaseStore) -> None:
    """Two calls in flight are both throttled: the cap halves twice, the longer pause stays."""
    gate = ProviderGate(store, "bank", max_concurrency=8)
    with pytest.raises(Throttled), gate.slot(wait=1):  # granted before any pause
        throttle(gate, retry_after=30)
        long_pause = gate.state().paused_until_ms
        raise Throttled("429", retry_after=0.1)
    state = gate.state()
    assert state.paused_until_ms == long_pause
    assert (state.cap, state.throttles, state.in_use) == (2, 2, 0)


def test_successes_raise_the_cap_by_one_per_full_window(store: LeaseStore) -> None:
    gate = ProviderGate(store, "bank", max_concurrency=4)
    throttle(gate)
    throttle(gate)
    assert gate.state().cap == 1
    caps = []
    for _ in range(12):
        succeed(gate)
        caps.append(gate.state().cap)
    # a window of 1 success at cap 1, of 2 at cap 2, of 3 at cap 3; then never past 4
    assert caps == [2, 2, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4]
    throttle(gate)
    assert gate.state().cap == 2
    assert gate.state().counters["successes"] == 0  # a throttle restarts the window


def test_cap_holds_across_threads(real_store: LeaseStore) -> None:
    gate = ProviderGate(real_store, "bank", max_concurrency=3)
    lock = threading.Lock()
    inside, peak, errors = 0, 0, []

    def caller() -> None:
        nonlocal inside, peak
        try:
            for _ in range(8):
                with gate.slot(wait=20):
                    with lock:
                        inside += 1
                        peak = max(peak, inside)
                    time.sleep(0.01)  # the call's duration
                    with lock:
                        inside -= 1
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert peak == 3
    state = gate.state()
    assert state.counters["granted"] == 64
    assert state.counters["peak_in_use"] == 3
    assert state.in_use == 0


CALLER = textwrap.dedent(
    """
    import sys, time
    from redis_lease import LeaseStore
    from redis_lease.fleet.effects.provider_gate import ProviderGate

    url, prefix, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = LeaseStore.from_url(url, prefix=prefix)
    gate = ProviderGate(store, "bank", max_concurrency=2, slot_ttl=float(sys.argv[4]))
    inside, seen = f"{prefix}:inside", f"{prefix}:seen"
    store.client.blpop([f"{prefix}:go"], timeout=30)
    store.client.rpush(f"{prefix}:go", "1")
    for _ in range(calls):
        with gate.slot(wait=30):
            store.client.rpush(seen, store.client.incr(inside))
            if calls == 1:
                store.client.rpush(f"{prefix}:holding", "1")
                time.sleep(3600)  # holds the slot until it is killed
            time.sleep(0.01)
            store.client.decr(inside)
    """
)


@pytest.fixture
def callers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started caller processes (killed afterwards)."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def spawn(
    processes: list[subprocess.Popen[bytes]], url: str, prefix: str, calls: int, ttl: float
) -> None:
    """Starts one caller process that makes ``calls`` gated calls."""
    processes.append(
        subprocess.Popen(
            [sys.executable, "-c", CALLER, url, prefix, str(calls), str(ttl)],
            cwd=ROOT,
            start_new_session=True,
        )
    )


def test_cap_holds_across_processes(
    real_store: LeaseStore, redis_url: str, callers: list[subprocess.Popen[bytes]]
) -> None:
    prefix = real_store.prefix
    for _ in range(4):
        spawn(callers, redis_url, prefix, 15, 60.0)
    real_store.client.rpush(f"{prefix}:go", "1")  # each process passes it on
    for process in callers:
        assert process.wait(timeout=120) == 0
    seen = [int(n) for n in real_store.client.lrange(f"{prefix}:seen", 0, -1)]
    assert len(seen) == 60
    assert max(seen) == 2  # never more than the cap, and the cap was reached
    state = ProviderGate(real_store, "bank", max_concurrency=2).state()
    assert state.counters["granted"] == 60 and state.in_use == 0


def test_slot_of_a_killed_holder_expires(
    real_store: LeaseStore, redis_url: str, callers: list[subprocess.Popen[bytes]]
) -> None:
    prefix = real_store.prefix
    # The slot lives 6 s: 3 s for the kill and the reads, 3 s for the checks that it is still
    # taken, room enough on a busy machine (the test fails, not passes, when short of it).
    spawn(callers, redis_url, prefix, 1, 6.0)
    real_store.client.rpush(f"{prefix}:go", "1")
    assert real_store.client.blpop([f"{prefix}:holding"], timeout=30) is not None
    callers[0].send_signal(signal.SIGKILL)
    callers[0].wait(timeout=10)
    gate = ProviderGate(real_store, "bank", max_concurrency=2)
    ((_, expiry),) = real_store.client.zrange(gate.keys[0], 0, -1, withscores=True)
    assert gate.state().in_use == 1
    assert server_ms(real_store.client) < expiry - 3000  # time enough for the next checks
    with gate.slot(wait=0.01):  # the cap is 2: one slot is still free
        pass
    with gate.slot(wait=1), pytest.raises(SlotTimeout), gate.slot(wait=0.05):
        pass  # both taken: the dead holder's slot has not expired yet
    with gate.slot(wait=10), gate.slot(wait=10):
        granted_at = server_ms(real_store.client)
    assert granted_at >= expiry  # the second slot became free when the dead one expired
    assert gate.state().in_use == 0


def test_cap_holds_across_the_tasks_of_one_event_loop(real_store: LeaseStore) -> None:
    """slot_async waits without blocking the loop: the other tasks go on; the cap holds."""
    gate = ProviderGate(real_store, "bank", max_concurrency=3)
    inside, peak, ticks = 0, 0, 0

    async def caller() -> None:
        nonlocal inside, peak
        for _ in range(4):
            async with gate.slot_async(wait=20):
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.01)  # the call's duration
                inside -= 1

    async def ticker(callers: asyncio.Future[Any]) -> None:
        nonlocal ticks
        while not callers.done():  # the loop stays free while callers wait for slots
            ticks += 1
            await asyncio.sleep(0.005)

    async def main() -> None:
        callers = asyncio.gather(*(caller() for _ in range(8)))
        await asyncio.gather(callers, ticker(callers))

    asyncio.run(main())
    assert peak == 3
    assert ticks >= 5
    state = gate.state()
    assert (state.in_use, state.counters["granted"], state.counters["successes"]) == (0, 32, 32)
    assert state.counters["peak_in_use"] == 3


def test_async_throttle_lowers_the_cap_and_times_out_without_a_slot(
    real_store: LeaseStore,
) -> None:
    gate = ProviderGate(real_store, "bank", max_concurrency=4, min_concurrency=1)

    async def main() -> None:
        with pytest.raises(Throttled):
            async with gate.slot_async(wait=5):
                raise Throttled("429", retry_after=0)
        async with gate.slot_async(wait=5), gate.slot_async(wait=5):
            with pytest.raises(SlotTimeout):
                async with gate.slot_async(wait=0.2):
                    pass

    asyncio.run(main())
    state = gate.state()
    # Halved to 2 (the third slot timed out), then a full window of 2 successes: 3.
    assert (state.throttles, state.cap) == (1, 3)
