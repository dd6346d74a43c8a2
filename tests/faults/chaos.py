"""Seeded chaos: random faults over many runs of the effects job, every run checked.

One :class:`~tests.faults.cluster.Cluster` (a private Redis with ``appendfsync
always``, the proxy, the provider and several RQ worker processes, two of them
on clocks skewed by hours when libfaketime is installed) serves every
iteration. An iteration is one seed: it creates a run of its own (a business
date drawn from the seed), plans one to three faults at random times from the
seed, ticks the run to its end while it injects them, heals every fault, and
checks the run's history, final state, marks and provider log with
:func:`tests.faults.checker.check`. The faults mixed here are those that lose no
acknowledged write: worker SIGSTOP past its lease, SIGKILL and SIGTERM (then a
restart), connections reset, delayed and held, Redis SIGSTOP past the lease
TTL, Redis SIGKILL and restart from its AOF, and ``SCRIPT FLUSH`` once and in a
storm. With ``--redis-cluster`` the lease state lives on a private 3-primary
Redis Cluster (RQ's queues on the private server, no proxy): the worker faults
and ``SCRIPT FLUSH`` (every primary) mix with moving the hash slot of one of the
run's shards to another primary, in steps with work going on between them.
Faults that lose data on purpose (``everysec``, a restart without data,
eviction) have their own tests in ``tests/test_faults_redis.py``.

Run it with ``make chaos N=200 SEED=1`` (or ``python -m tests.faults.chaos``);
a failing seed reproduces with ``make chaos N=1 SEED=<seed> EXAMPLES=0``. With
``--concurrency 16`` every worker runs 16 handlers at once.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

import redis

from redis_lease.demo.provider import ProviderState
from redis_lease.errors import RedisLeaseError
from redis_lease.fleet.runs.lifecycle import FINAL_STATES, Runs
from tests.faults.checker import Violation, check
from tests.faults.cluster import Cluster, faketime_library
from tests.faults.evidence import collect
from tests.faults.recorder import Op, read_ops

#: Lease TTL (s) of the chaos job: faults that outlast it force takeovers.
TTL = 1.0
#: Shards of a run (one shard job each, so this many workers work at once).
SHARDS = 4
#: Seconds the provider takes per call, so that faults meet work in flight.
PROVIDER_LATENCY = 0.05
#: Worker clocks skewed by libfaketime (when installed): hours ahead and behind.
SKEWED_CLOCKS = ("+2h", "-90m")


@dataclass(order=True)
class Action:
    """One step of a fault, due ``at`` seconds after its iteration began."""

    at: float
    order: int
    run: Callable[[], object] = field(compare=False)


#: A fault: what it acts on (one fault at a time per target) and its steps, each
#: (seconds after the iteration began, action).
Fault = tuple[str, list[tuple[float, Callable[[], object]]]]
Planner = Callable[[Cluster, random.Random, float], Fault]


def _worker(cluster: Cluster, rng: random.Random) -> int:
    return rng.randrange(len(cluster.workers))


def pause_worker(cluster: Cluster, rng: random.Random, at: float) -> Fault:
    """SIGSTOP a worker past its lease, then SIGCONT it."""
    index = _worker(cluster, rng)
    hold = TTL * rng.uniform(1.3, 3.0)
    return f"worker {index}", [
        (at, lambda: cluster.pause(index)),
        (at + hold, lambda: cluster.resume(index)),
    ]


def kill_worker(cluster: Cluster, rng: random.Random, at: float) -> Fault:
    """SIGKILL a worker; a supervisor starts a new one a moment later."""
    index = _worker(cluster, rng)
    return f"worker {index}", [
        (at, lambda: cluster.kill(index)),
        (at + rng.uniform(0.1, 1.0), lambda: cluster.restart_worker(index)),
    ]


def term_worker(cluster: Cluster, rng: random.Random, at: float) -> Fault:
    """SIGTERM a worker (it drains); a new one starts after it has gone."""
    index = _worker(cluster, rng)
    return f"worker {index}", [
        (at, lambda: cluster.terminate(index)),
        (at + rng.uniform(1.0, 2.0), lambda: cluster.restart_worker(index)),
    ]


def reset_connections(cluster: Cluster, rng: random.Random, at: float) -> Fault:
    """Reset every worker connection, once or a few times in a row."""
    times = rng.randint(1, 4)
    gaps = [at + n * rng.uniform(0.05, 0.4) for n in range(times)]
    return "network", [(t, cluster.reset_connections) for t in gaps]


def delay_connections(cluster: Cluster, rng: random.Random, at: float) -> Fault:
    """Delay every byte between workers and Redis (up to past the TTL) for a while."""
    seconds = rng.uniform(0.2, TTL * 1.5)
    hold = rng.uniform(0.5, 2.5)
    return "network", [
        (at, lambda: cluster.delay(seconds)),
        (at + hold, lambda: cluster.delay(0)),
    ]


def blackhole(cluster: Cluster, rng: random.Random, at: float) -> Fault:
    """Reset the connections and hold new ones without relaying for a while."""
    seconds = rng.uniform(0.3, 2.0)
    return "network", [
        (at, lambda: cluster.blackhole(seconds)),
        (at, cluster.reset_connections),
        (at + seconds, lambda: None),  # the fault lasts until the proxy relays again
    ]


def pause_redis(cluster: Cluster, rng: random.Random, at: float) -> Fault:
    """SIGSTOP Redis for longer than the lease TTL, then SIGCONT."""
    hold = TTL * rng.uniform(1.1, 2.5)
    return "redis", [(at, cluster.stop_redis), (at + hold, cluster.cont_redis)]


def kill_redis(cluster: Cluster, rng: random.Random, at: float) -> Fault:
    """SIGKILL Redis; restart it from its AOF (``appendfsync always``) a moment later."""
    return "redis", [
        (at, cluster.kill_redis),
        (at + rng.uniform(0.05, 1.0), lambda: cluster.restart_redis()),
    ]


def flush_scripts(cluster: Cluster, rng: random.Random, at: float) -> Fault:
    """``SCRIPT FLUSH`` once, or every 50 ms for up to two seconds (a storm)."""
    count = 1 if rng.random() < 0.5 else rng.randint(10, 40)
    return "redis", [(at + n * 0.05, cluster.script_flush) for n in range(count)]


def move_slot(cluster: Cluster, rng: random.Random, at: float) -> Fault:
    """Move the hash slot of one of the run's shards to another primary (Redis Cluster):
    begin, MIGRATE a few keys at a time with work going on between, then the rest and
    the new owner on every node."""
    slot = cluster.shard_slot(cluster.current_run, rng.randrange(SHARDS))
    pick = rng.randrange(2)
    steps: list[tuple[float, Callable[[], object]]] = [
        (at, lambda: cluster.begin_slot_move(slot, pick=pick))
    ]
    when = at
    for _ in range(rng.randint(1, 3)):
        when += rng.uniform(0.2, 0.6)
        count = rng.randint(1, 3)
        steps.append((when, lambda count=count: cluster.move_slot_keys(slot, count)))  # type: ignore[misc]
    steps.append((when + rng.uniform(0.2, 0.6), lambda: cluster.finish_slot_move(slot)))
    return f"slot {slot}", steps


#: Every fault kind the chaos mixes, by name.
FAULTS: dict[str, Planner] = {
    "pause-worker": pause_worker,
    "kill-worker": kill_worker,
    "term-worker": term_worker,
    "reset-connections": reset_connections,
    "delay-connections": delay_connections,
    "blackhole": blackhole,
    "pause-redis": pause_redis,
    "kill-redis": kill_redis,
    "script-flush": flush_scripts,
}

#: The fault kinds of a run whose lease state is on a Redis Cluster: no proxy and no one
#: server to stop, kill or restart; hash slots move instead.
CLUSTER_FAULTS: dict[str, Planner] = {
    "pause-worker": pause_worker,
    "kill-worker": kill_worker,
    "term-worker": term_worker,
    "script-flush": flush_scripts,
    "move-slot": move_slot,
}

#: What a script call that a Redis Cluster refused while moving slots was recorded with.
CLUSTER_REFUSALS = ("TRYAGAIN", "TTL exhausted", "CLUSTERDOWN", "ClusterDown", "TryAgain")


def cluster_refused(op: Op) -> bool:
    """Whether a recorded operation ended on a cluster's refusal (a slot moving)."""
    error = str(op.get("error", ""))
    return op.type != "ok" and any(sign in error for sign in CLUSTER_REFUSALS)


class HistoryTail:
    """Reads only what the history files gained since the last read (the workers live on)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: dict[Path, int] = {}

    def new_ops(self) -> list[Op]:
        """The operations recorded since the last call."""
        lines = []
        for path in sorted(self.directory.glob("*.jsonl")):
            with path.open("rb") as handle:
                handle.seek(self.offsets.get(path, 0))
                data = handle.read()
            complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            for line in complete.decode(errors="replace").splitlines():
                try:
                    lines.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return read_ops(lines)


@dataclass
class Outcome:
    """One iteration: its seed, run, faults injected, operations checked, violation if any."""

    seed: int
    run_id: str
    state: str
    faults: list[str]
    operations: int
    seconds: float
    violation: str = ""
    #: From the checked history: leases taken over, stale writes refused, unknown outcomes.
    takeovers: int = 0
    refused: int = 0
    unknown: int = 0
    #: Operations a Redis Cluster refused while a slot moved (TRYAGAIN, ...).
    cluster_refused: int = 0


@dataclass
class Chaos:
    """The runner: one cluster, one iteration per seed."""

    cluster: Cluster

    def __post_init__(self) -> None:
        self.tail = HistoryTail(self.cluster.history)

    def iteration(self, seed: int) -> Outcome:
        """Runs and checks the iteration of ``seed``."""
        rng = random.Random(seed)
        cluster = self.cluster
        runs = Runs(cluster.store)
        business_date = date(2001, 1, 1) + timedelta(days=seed % 36_000)
        now = runs.server_now()
        run_id, _ = runs.ensure(
            cluster.job, business_date, now, deadline=now + timedelta(minutes=10)
        )
        cluster.current_run = run_id
        menu = FAULTS if cluster.redis_cluster is None else CLUSTER_FAULTS
        started = time.monotonic()
        actions: list[Action] = []
        kinds = []
        order = itertools.count()
        busy_until: dict[str, float] = {}
        for _ in range(rng.randint(1, 3)):
            kind = rng.choice(sorted(menu))
            kinds.append(kind)
            target, steps = menu[kind](cluster, rng, rng.uniform(0.1, 1.5))
            # one fault at a time per target: a later one waits for the earlier to heal
            shift = max(0.0, busy_until.get(target, 0.0) + 0.1 - steps[0][0])
            for at, act in steps:
                heapq.heappush(actions, Action(at + shift, next(order), act))
            busy_until[target] = steps[-1][0] + shift

        def step() -> None:
            while actions and actions[0].at <= time.monotonic() - started:
                heapq.heappop(actions).run()

        def done() -> bool:
            if actions:
                return False
            try:
                return runs.info(run_id)["state"] in FINAL_STATES
            except (RedisLeaseError, redis.RedisError):  # Redis restarting: tick again
                return False

        try:
            cluster.drive(run_id, timeout=120, until=done, step=step)
            state, stuck = runs.info(run_id)["state"], ""
        except AssertionError as error:  # the run never ended: a liveness failure
            while actions:  # heal what is still injected before the next seed
                heapq.heappop(actions).run()
            state, stuck = "stuck", f"the run did not end: {error}"
        ops = self.tail.new_ops()
        outcome = Outcome(seed, run_id, state, kinds, len(ops), time.monotonic() - started)
        outcome.cluster_refused = sum(cluster_refused(op) for op in ops)
        if stuck:
            outcome.violation = stuck
            return outcome
        evidence = collect(
            cluster.store,
            run_id,
            cluster.planned(run_id),
            ops=ops,
            applied=dict(cluster.provider.state.applications),
            effects=("payout",),
        )
        try:
            summary = check(evidence)
        except Violation as violation:
            outcome.violation = str(violation)
            return outcome
        outcome.takeovers = summary.takeovers
        outcome.refused = summary.stale_refused
        outcome.unknown = summary.unknown_outcomes
        return outcome


def chaos_cluster(
    directory: Path,
    prefix: str,
    items: int,
    workers: int,
    skew: bool,
    concurrency: int = 1,
    redis_cluster: bool = False,
) -> Cluster:
    """The cluster every iteration runs on (``skew``: two workers on skewed clocks;
    ``concurrency``: handlers per worker at once; ``redis_cluster``: the lease state on a
    private Redis Cluster)."""
    return Cluster(
        directory,
        prefix,
        workers=workers,
        concurrency=concurrency,
        redis_cluster=redis_cluster,
        clocks=SKEWED_CLOCKS if skew else (),
        # The provider honours idempotency keys, as the promise needs: a holder paused
        # past its lease with its request on the way sends it late, and only the key
        # stops a second payout (tests/test_faults_workers.py shows both sides).
        provider=ProviderState(latency=PROVIDER_LATENCY),
        items=items,
        shards=SHARDS,
        ttl=TTL,
        batch_size=4,
        max_attempts=50,
    )


def run(
    seed: int,
    iterations: int,
    items: int,
    workers: int,
    out: Path,
    concurrency: int = 1,
    redis_cluster: bool = False,
) -> int:
    """Runs ``iterations`` seeds from ``seed``; prints each and a summary; 1 on a violation."""
    skew = faketime_library() is not None
    prefix = f"chaos-{uuid.uuid4().hex[:8]}"
    began = time.monotonic()
    outcomes: list[Outcome] = []
    with chaos_cluster(out, prefix, items, workers, skew, concurrency, redis_cluster) as cluster:
        chaos = Chaos(cluster)
        print(
            f"chaos: seeds {seed}..{seed + iterations - 1}, {items} items, {workers} workers "
            f"of concurrency {concurrency}, "
            f"clock skew {'on ' + str(SKEWED_CLOCKS) if skew else 'off (libfaketime missing)'}",
            flush=True,
        )
        for current in range(seed, seed + iterations):
            outcome = chaos.iteration(current)
            outcomes.append(outcome)
            mark = "VIOLATION" if outcome.violation else "ok"
            print(
                f"seed {current}: {mark} {outcome.state} {outcome.operations} ops "
                f"{outcome.seconds:.1f}s faults={','.join(outcome.faults)}",
                flush=True,
            )
            if outcome.violation:
                print(outcome.violation, flush=True)
    injected = Counter(kind for outcome in outcomes for kind in outcome.faults)
    failed = [o.seed for o in outcomes if o.violation]
    print(f"iterations: {len(outcomes)}")
    print(f"operations: {sum(o.operations for o in outcomes)}")
    print(
        f"takeovers: {sum(o.takeovers for o in outcomes)}, refused calls: "
        f"{sum(o.refused for o in outcomes)}, unknown outcomes: {sum(o.unknown for o in outcomes)}"
    )
    if redis_cluster:
        print(f"calls the cluster refused: {sum(o.cluster_refused for o in outcomes)}")
    print("faults by kind: " + ", ".join(f"{k}={n}" for k, n in sorted(injected.items())))
    print(f"violations: {len(failed)}")
    print(f"time: {time.monotonic() - began:.0f}s")
    for bad in failed:
        print(f"reproduce: make chaos N=1 SEED={bad} EXAMPLES=0")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """The command line: ``python -m tests.faults.chaos --seed S --iterations N``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--iterations", "-n", type=int, default=20)
    parser.add_argument("--items", type=int, default=48)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=1, help="handlers per worker at once")
    parser.add_argument(
        "--redis-cluster", action="store_true", help="the lease state on a private Redis Cluster"
    )
    parser.add_argument("--dir", type=Path, default=None, help="keep the files here")
    args = parser.parse_args(argv)
    # SIGTERM ends the run like Ctrl-C: the cluster's processes and files go with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        return run(
            args.seed,
            args.iterations,
            args.items,
            args.workers,
            args.dir,
            args.concurrency,
            args.redis_cluster,
        )
    with tempfile.TemporaryDirectory(prefix="chaos-") as scratch:
        return run(
            args.seed,
            args.iterations,
            args.items,
            args.workers,
            Path(scratch),
            args.concurrency,
            args.redis_cluster,
        )


if __name__ == "__main__":
    sys.exit(main())
