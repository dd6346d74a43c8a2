"""The reservation cleanup, end to end: holds, learners renewing, a cleanup run, a report.

    python3 examples/reservations/run.py [--url redis://127.0.0.1:6379/0] [--holds 400]

It creates seat holds (most already expired), queues one cleanup message per
expired hold (some twice: delivery is at-least-once), then, while the cleanup
run's workers start, learners renew a share of the expired holds: the messages
about those are now stale. The report shows released / renewed / already handled
/ retry and checks every seat: no renewed hold released, no seat released twice.
It deletes every key it made, RQ's queue and jobs too. Any ``python3`` runs it:
where redis_lease is not installed, it runs itself again with the project's ``.venv``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis

HERE = Path(__file__).resolve().parent
JOB_PATH = "reservations:cleanup"
REEXEC_FLAG = "REDIS_LEASE_EXAMPLE_REEXEC"


def use_the_project_venv() -> None:
    """Runs this script again with the project's ``.venv`` when redis_lease is not importable.

    So ``python3 examples/...`` works from any shell once ``make setup`` made the venv.
    """
    try:
        import redis_lease  # noqa: F401
    except ModuleNotFoundError as missing:
        root = Path(__file__).resolve().parents[2]
        venv = root / ".venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        if not venv.exists() or os.environ.get(REEXEC_FLAG):
            sys.exit(
                f"error: {missing.name} is not installed for {sys.executable}: "
                f"run 'make setup' in {root}, then '{venv} {sys.argv[0]}'"
            )
        os.environ[REEXEC_FLAG] = "1"  # once: a broken venv must not loop
        os.execv(venv, [str(venv), str(Path(__file__).resolve()), *sys.argv[1:]])


def create_holds(client: redis.Redis, prefix: str, count: int, now: int) -> list[dict[str, Any]]:
    """Holds on seats of three courses; four in five expired a minute ago."""
    holds = []
    pipe = client.pipeline()
    for n in range(count):
        course, seat = f"course{n % 3}", f"seat{n}"
        expired = n % 5 != 0
        hold = {
            "id": f"h{n}",
            "course": course,
            "seat": seat,
            "state": "held",
            "version": "1",
            "expires_at": str(now - 60_000 if expired else now + 3_600_000),
        }
        pipe.hset(f"{prefix}:hold:h{n}", mapping={k: v for k, v in hold.items() if k != "id"})
        pipe.sadd(f"{prefix}:course:{course}:held", seat)
        holds.append(hold)
    pipe.execute()
    return holds


def queue_messages(client: redis.Redis, prefix: str, holds: list[dict[str, Any]]) -> int:
    """One message per expired hold, every tenth one twice (at-least-once delivery)."""
    now = int(time.time() * 1000)
    messages = []
    for hold in holds:
        if int(hold["expires_at"]) > now:
            continue
        copies = 2 if int(hold["id"][1:]) % 10 == 1 else 1
        for copy in range(copies):
            messages.append(
                json.dumps(
                    {
                        "msg": f"{hold['id']}-m{copy}",
                        "hold": hold["id"],
                        "version": hold["version"],
                        "expires_at": hold["expires_at"],
                    }
                )
            )
    client.rpush(f"{prefix}:messages", *messages)
    return len(messages)


def renew_some(
    client: redis.Redis, prefix: str, holds: list[dict[str, Any]], share: float
) -> list[str]:
    """Learners renew a share of the expired holds after their messages were queued."""
    now = int(time.time() * 1000)
    expired = [h for h in holds if int(h["expires_at"]) <= now]
    chosen = random.Random(7).sample(expired, int(len(expired) * share))
    for hold in chosen:
        client.hset(
            f"{prefix}:hold:{hold['id']}",
            mapping={"expires_at": str(now + 600_000), "version": "2"},
        )
    return [h["id"] for h in chosen]


def main() -> int:
    """Runs the scenario and prints the report; exit 1 if a check fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--holds", type=int, default=400)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    prefix = f"seats-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "RESERVATIONS_PREFIX": prefix,
        "RESERVATIONS_REDIS_URL": args.url,
        "RESERVATIONS_QUEUE": f"{prefix}-cleanup",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    os.environ.update(env)
    sys.path.insert(0, str(HERE))
    import redis
    import reservations

    from redis_lease import LeaseStore, Runs, purge_queue
    from redis_lease.fleet.runs.lifecycle import FINAL_STATES
    from redis_lease.fleet.tick.scheduler_tick import tick

    client = redis.Redis.from_url(args.url)
    store = LeaseStore(client, prefix=f"{prefix}-rl", url=args.url)
    runs = Runs(store)
    now = runs.server_now()
    holds = create_holds(client, prefix, args.holds, int(now.timestamp() * 1000))
    queued = queue_messages(client, prefix, holds)
    run_id, _ = runs.ensure(reservations.cleanup, now.date(), now)
    renewed = renew_some(client, prefix, holds, share=0.25)
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "redis_lease",
                "--url",
                args.url,
                "--prefix",  # the run's: its workers watch and stamp it, and it is cleaned up
                store.prefix,
                "worker",
                "--simple",
                "--queue",
                env["RESERVATIONS_QUEUE"],
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(args.workers)
    ]
    try:
        deadline = time.monotonic() + 120
        while runs.info(run_id)["state"] not in FINAL_STATES and time.monotonic() < deadline:
            tick(store, [JOB_PATH])
            time.sleep(0.2)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=15)
        purge_queue(client, env["RESERVATIONS_QUEUE"])  # RQ's keys carry no prefix of ours
    status = store.status(run_id)
    report = check(client, prefix, holds, renewed, status.counters)
    report.update(
        run_id=run_id,
        state=runs.info(run_id)["state"],
        messages=queued,
        items=status.total,
        done=status.counts["done"],
    )
    cleanup_keys(client, prefix)
    if args.json:
        print(json.dumps(report))
    else:
        for name, value in report.items():
            print(f"{name:>24}: {value}")
    return 0 if report["ok"] else 1


def check(
    client: redis.Redis,
    prefix: str,
    holds: list[dict[str, Any]],
    renewed: list[str],
    events: dict[str, int],
) -> dict[str, Any]:
    """Outcome counts and the seat checks."""
    renewed_set = set(renewed)
    released_renewed = released_twice = wrongly_held = 0
    now = int(time.time() * 1000)
    for hold in holds:
        state = client.hget(f"{prefix}:hold:{hold['id']}", "state")
        course, seat = hold["course"], hold["seat"]
        free = client.sismember(f"{prefix}:course:{course}:free", seat)
        held = client.sismember(f"{prefix}:course:{course}:held", seat)
        if free and held:
            released_twice += 1
        if hold["id"] in renewed_set and state != b"held":
            released_renewed += 1
        was_expired = int(hold["expires_at"]) <= now and hold["id"] not in renewed_set
        if was_expired and state != b"released":
            wrongly_held += 1
    report = {
        "released": events.get("outcome_released", 0),
        "renewed": events.get("outcome_renewed", 0),
        "already_handled": events.get("outcome_already_handled", 0),
        "retry": events.get("releases", 0) + events.get("retries", 0),
        "renewed_holds_released": released_renewed,
        "seats_in_both_sets": released_twice,
        "expired_holds_not_released": wrongly_held,
    }
    report["ok"] = not (released_renewed or released_twice or wrongly_held)
    return report


def cleanup_keys(client: redis.Redis, prefix: str) -> None:
    """Deletes the scenario's keys (holds, seats, messages and the run's keys)."""
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])


if __name__ == "__main__":
    use_the_project_venv()
    sys.exit(main())
