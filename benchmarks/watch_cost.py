"""What checking the fleet's heartbeats costs Redis: 50 FleetWatch threads over 400 shard jobs,
this checkout against another revision (``--ref``), interleaved.

Each round, for each revision in turn (A B A B ...), on one private ``redis-server``
(emptied between rounds): a child process with that revision on its path registers
``--jobs`` shard jobs as its shard jobs do and keeps each sending heartbeats with that
revision's own :class:`LeaseKeeper` (one thread per job, a heartbeat a second), and ``--processes``
child processes run ``--watchers`` :class:`FleetWatch` es between them (each with its
own connection, ticking every second, as ``redis-lease worker`` does). After a warm-up,
``INFO commandstats`` is read at the start and the end of a window; the figures are
commands per second on Redis (a command a script calls counts too, and so does each
script call), split into what the watches sent and what the heartbeats sent, and the ticks
the watches made per second (1.0 each when they keep up). Medians over the rounds; the
ratio this / reference; the load average.

    git worktree add --detach /tmp/ref <rev>
    python benchmarks/watch_cost.py --ref /tmp/ref [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_fleet import log, machine, redis_for  # noqa: E402

#: The key prefix of the measured fleet.
PREFIX = "watchcost"

BEATER = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from redis_lease import LeaseStore
    from redis_lease.fleet import takeover
    from redis_lease.fleet.worker.lease_keeper import LeaseKeeper
    url, jobs = sys.argv[1], int(sys.argv[2])
    store = LeaseStore.from_url(url, prefix="{prefix}", max_connections=jobs + 10)
    keepers = []
    for n in range(jobs):
        rq_id = f"rl-{{n:032x}}"
        job = takeover.ShardJob(rq_id, f"run-{{n % 40}}", n % 16, f"worker-{{n % 50}}",
            f"host:{{n}}:{{rq_id[-8:]}}", "host", 1000 + n, "jobs:job", "q", 600.0)
        beat_key = store.keys.run_beat(job.run_id, rq_id)
        if hasattr(store.keys, "shard_job_registry"):  # the registry at the server's time
            keeper = LeaseKeeper(store, 60, beat_key=beat_key, job_id=rq_id)
            takeover.register(store, job, keeper.beat_value())
        else:  # a beat key with a TTL, then the entry
            keeper = LeaseKeeper(store, 60, beat_key=beat_key)
            keeper.beat()
            takeover.register(store, job)
        keepers.append(keeper)
    for keeper in keepers:
        keeper.start()
        time.sleep(1.0 / jobs)  # spread over the second, as jobs started apart are
    print("ready", flush=True)
    sys.stdin.read()
    """
).format(prefix=PREFIX)

WATCHER = textwrap.dedent(
    """
    import sys, threading, time
    from redis_lease import LeaseStore
    from redis_lease.fleet.worker.watch import FleetWatch
    url, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    watches = []
    for n in range(first, first + count):
        store = LeaseStore.from_url(url, prefix="{prefix}")
        watch = FleetWatch(store, f"watcher-{{n}}", ["q"], say=lambda line: None)
        watches.append(watch)
    ticks = [0] * len(watches)
    def counted(i, watch):
        tick = watch.tick
        def run():
            tick()
            ticks[i] += 1
        return run
    for i, watch in enumerate(watches):
        watch.tick = counted(i, watch)
        watch.start()
        time.sleep(1.0 / len(watches))
    print("ready", flush=True)
    for line in sys.stdin:
        print(sum(ticks), flush=True)
    """
).format(prefix=PREFIX)


def spawn(code: str, checkout: Path, *args: str) -> subprocess.Popen[str]:
    """A child running ``code`` with ``checkout`` first on its path."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    child = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=checkout,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "ready":
        child.kill()
        raise RuntimeError(f"a child of {checkout} did not start: {line!r}")
    return child


def commandstats(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far."""
    return {
        name.removeprefix("cmdstat_"): int(stats["calls"])
        for name, stats in client.info("commandstats").items()
    }


def one_round(
    url: str, checkout: Path, jobs: int, watchers: int, processes: int, window: float
) -> dict[str, Any]:
    """One measurement of one revision."""
    client = redis.Redis.from_url(url)
    client.flushall()
    beater = spawn(BEATER, checkout, url, str(jobs))
    children = []
    try:
        per = -(-watchers // processes)
        for first in range(0, watchers, per):
            count = min(per, watchers - first)
            children.append(spawn(WATCHER, checkout, url, str(first), str(count)))
        time.sleep(3.0)  # warm-up: every watch and keeper ticking

        def ticks() -> int:
            total = 0
            for child in children:
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write("\n")
                child.stdin.flush()
                total += int(child.stdout.readline())
            return total

        before, ticks_before, started = commandstats(client), ticks(), time.monotonic()
        time.sleep(window)
        after, ticks_after, ended = commandstats(client), ticks(), time.monotonic()
        seconds = ended - started
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        delta = {k: v for k, v in delta.items() if v > 0 and k != "info"}
        # Beats alone: measured with the watches stopped, for the same window.
        for child in children:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        children = []
        time.sleep(1.5)
        quiet_before, quiet_started = commandstats(client), time.monotonic()
        time.sleep(window)
        quiet_after, quiet_ended = commandstats(client), time.monotonic()
        quiet = {k: quiet_after.get(k, 0) - quiet_before.get(k, 0) for k in quiet_after}
        quiet = {k: v for k, v in quiet.items() if v > 0 and k != "info"}
        total = sum(delta.values()) / seconds
        beats = sum(quiet.values()) / (quiet_ended - quiet_started)
        return {
            "commands_per_s": round(total),
            "beats_commands_per_s": round(beats),
            "watch_commands_per_s": round(total - beats),
            "watch_ticks_per_s": round((ticks_after - ticks_before) / seconds, 1),
            "by_command_per_s": {k: round(v / seconds) for k, v in sorted(delta.items())},
        }
    finally:
        for child in [beater, *children]:
            with_group_killed(child)


def with_group_killed(child: subprocess.Popen[str]) -> None:
    """Kills a child's process group and waits for it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", type=Path, required=True, help="a checkout of the reference")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--watchers", type=int, default=50)
    parser.add_argument("--processes", type=int, default=5, help="processes for the watchers")
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--url", default=None, help="a Redis nothing else uses (default: private)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    sides = {"reference": args.ref.resolve(), "this": ROOT}
    found: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as folder, redis_for(args.url, Path(folder)) as (url, _):
        client = redis.Redis.from_url(url)
        for n in range(args.rounds):
            order = list(sides) if n % 2 == 0 else list(reversed(sides))
            for side in order:
                figures = one_round(
                    url, sides[side], args.jobs, args.watchers, args.processes, args.window
                )
                found[side].append(figures)
                log(
                    f"round {n + 1} {side}: {figures['commands_per_s']} commands/s "
                    f"(watches {figures['watch_commands_per_s']}, "
                    f"beats {figures['beats_commands_per_s']}), "
                    f"{figures['watch_ticks_per_s']} ticks/s"
                )
        server = machine(client)
    keys = ("commands_per_s", "watch_commands_per_s", "beats_commands_per_s", "watch_ticks_per_s")
    medians = {
        side: {k: statistics.median(r[k] for r in rounds) for k in keys}
        for side, rounds in found.items()
    }
    result = {
        "jobs": args.jobs,
        "watchers": args.watchers,
        "rounds": args.rounds,
        "window_s": args.window,
        "medians": medians,
        "ratio_this_to_reference": {
            k: round(medians["this"][k] / medians["reference"][k], 3)
            for k in keys
            if medians["reference"][k]
        },
        "rounds_measured": found,
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "machine": server,
        "reference": str(sides["reference"]),
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for side in sides:
            print(side, medians[side])
        print("this / reference", result["ratio_this_to_reference"])
        print("load average", result["load_average"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
