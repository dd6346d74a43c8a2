"""Retries and a run's end: how long a run with transient errors takes, this checkout
against another revision (``--ref``), interleaved.

Each round, on one private ``redis-server`` (``tests/redis_server.py``: a free loopback
port, emptied before each measurement), for each revision and each variant: three
``redis-lease worker --job retry_jobs:retry_job`` processes at their defaults (forking,
concurrency 1, a tick every 60 s by the tick leader) and nothing else. The job
(``benchmarks/retry_jobs.py``) is due when they start (its 00:00 UTC schedule has
passed; catch-up ``latest``), so the leader's first tick creates, plans and dispatches
the day's run: ``--items`` items over ``--shards`` shards, a ``--sleep-ms`` handler.
Variants: ``clean`` (no errors), and ``errors``: the first attempt of ``--error-pct``
per cent of the items (the same items every time, chosen by a hash of the id) raises a
plain exception, retried after the job's back-off (``backoff_base_seconds``
``--backoff``; the first retry waits 0.5 to 1 times it, with jitter). Figures per round:

- ``start_s``: seconds from starting the workers to the run's state ``succeeded``, as
  seen by polling ``LeaseStore.status`` every 0.1 s (the issue's figure);
- ``created_s``: from the run's creation to its end (``created_at`` to ``state_at`` in
  the run record, the server's clock);
- ``end_lag_s``: from the last item's commit (the latest ``done_at``) to the run's end;
- ``retry_gap_s``: the longest wait of a retried item: from its failed attempt's raise
  to its next attempt's start, both written by the handler into Redis;
- ``retry_gap_median_s``: the median of those waits;
- ``backoff_s``: the longest back-off the server gave (``eligible_at`` minus the
  failure's time, from the item records);
- ``retry_after_due_s``: the longest a retried item waited past its due time
  (``leased_at`` minus ``eligible_at``): behind the items due before it, or for a tick.

Revisions and variants are interleaved (reference then this, clean then errors; the
next round in the reverse order). Medians per revision and variant, the ratios
this / reference and errors / clean, the goals, and the 1-minute load average at the
start and the end go to stdout (``--json``: one object); progress to stderr.

Goals (the product's issue): a run with errors ends within 1.5 x the same run without
errors plus its largest back-off (``--backoff``); a run ends within 2 s of its last
item's commit; a retried item is worked again within its back-off plus 2 s.

    git worktree add --detach /tmp/retries-ref <rev>
    python benchmarks/retries.py --ref /tmp/retries-ref [--rounds 3] [--json]

The reference's workers run with ``--ref`` first on ``PYTHONPATH`` (its own
``redis_lease``, scripts included), as ``benchmarks/watch_cost.py`` runs its reference.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import retry_jobs  # noqa: E402
from benchmarks.bench_fleet import log, machine  # noqa: E402
from redis_lease import LeaseStore  # noqa: E402
from redis_lease.protocol.leases import read_items  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

WORKERS = 3
JOB_PATH = "retry_jobs:retry_job"
POLL = 0.1
STOP_TIMEOUT = 30.0
VARIANTS = ("clean", "errors")
SIDES = ("reference", "this")
FIGURES = (
    "start_s",
    "created_s",
    "start_to_created_s",
    "end_lag_s",
    "retry_gap_s",
    "retry_gap_median_s",
    "backoff_s",
    "retry_after_due_s",
)
#: The goals' slack: a run's end after its last commit, a retry after its back-off.
END_LAG_GOAL = 2.0
RETRY_SLACK = 2.0
ERRORS_FACTOR = 1.5
_LOAD_AT_START = os.getloadavg()[0]


class Workers:
    """Worker processes of one measurement, each in a session of its own (with its horses)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, commands: list[list[str]], env: dict[str, str], cwd: Path) -> None:
        for number, command in enumerate(commands):
            with (self.folder / f"worker-{number}.log").open("wb") as out:
                self.processes.append(
                    subprocess.Popen(
                        command,
                        cwd=cwd,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def exited(self) -> list[int]:
        """The exit codes of the workers that ended."""
        return [code for p in self.processes if (code := p.poll()) is not None]

    def stop(self) -> list[int | None]:
        """SIGTERM, then SIGKILL to each session still there after STOP_TIMEOUT seconds."""
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        codes: list[int | None] = []
        for process in self.processes:
            try:
                codes.append(process.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
            # a work horse left behind (its worker killed or stuck) goes with its session
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            if process.poll() is None:
                process.wait(timeout=10)
        return codes

    def output(self) -> str:
        """The tail of every worker's log (for error messages)."""
        tails = [p.read_text(errors="replace")[-1500:] for p in sorted(self.folder.glob("*.log"))]
        return "\n".join(t for t in tails if t.strip())


def worker_env(
    checkout: Path, jobs_dir: Path, pycache: Path, job: dict[str, str]
) -> dict[str, str]:
    """The workers' environment: ``checkout`` first on the path, then the job module."""
    env = {**os.environ, **job}
    for name in ("REDIS_LEASE_URL", "REDIS_URL", "REDIS_LEASE_PREFIX", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join((str(checkout), str(jobs_dir)))
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def warm_up(checkout: Path, jobs_dir: Path, pycache: Path) -> None:
    """Byte-compiles what a worker imports, so no measured start compiles from source."""
    env = worker_env(checkout, jobs_dir, pycache, {})
    code = (
        "import redis_lease.cli.app, redis_lease.fleet.worker.rq_worker, "
        "redis_lease.fleet.tick.leader, retry_jobs"
    )
    subprocess.run([sys.executable, "-c", code], cwd=jobs_dir, env=env, check=True)


def wait_for_run(store: LeaseStore, workers: Workers, timeout: float) -> tuple[str, float]:
    """Polls until the run succeeded; its id and when (monotonic) it was seen so."""
    deadline = time.monotonic() + timeout
    run_id = ""
    while True:
        if not run_id:
            runs = store.run_ids()
            run_id = runs[0] if runs else ""
        if run_id:
            state = store.status(run_id).state
            if state == "succeeded":
                return run_id, time.monotonic()
            if state not in ("planning", "running"):
                raise RuntimeError(f"run {run_id} ended {state}\n{workers.output()}")
        if workers.exited():
            raise RuntimeError(f"a worker exited: {workers.exited()}\n{workers.output()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no run succeeded within {timeout:.0f} s\n{workers.output()}")
        time.sleep(POLL)


def ms_of(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def one_round(
    client: redis.Redis,
    url: str,
    checkout: Path,
    variant: str,
    args: argparse.Namespace,
    folder: Path,
    jobs_dir: Path,
) -> dict[str, Any]:
    """One run, worked by WORKERS fresh workers of ``checkout``; its figures."""
    client.flushall()  # the private server: nothing else is on it
    prefix, key = "retrybench", "retrybench-handler:times"
    error_pct = args.error_pct if variant == "errors" else 0.0
    job = {
        retry_jobs.ITEMS_ENV: str(args.items),
        retry_jobs.SHARDS_ENV: str(args.shards),
        retry_jobs.SLEEP_MS_ENV: str(args.sleep_ms),
        retry_jobs.ERROR_PCT_ENV: str(error_pct),
        retry_jobs.BACKOFF_ENV: str(args.backoff),
        retry_jobs.URL_ENV: url,
        retry_jobs.KEY_ENV: key,
    }
    env = worker_env(checkout, jobs_dir, folder.parent / "pycache", job)
    base = [sys.executable, "-m", "redis_lease", "--url", url, "--prefix", prefix, "worker"]
    base += ["--job", JOB_PATH]
    if args.tick_every is not None:
        base += ["--tick-every", str(args.tick_every)]
    commands = [[*base, "--name", f"{folder.name}-w{n}"] for n in range(WORKERS)]
    store = LeaseStore(client, prefix=prefix, url=url)
    workers = Workers(folder)
    started = time.monotonic()
    try:
        workers.start(commands, env, jobs_dir)
        run_id, seen = wait_for_run(store, workers, args.timeout)
    finally:
        codes = workers.stop()
    info = store.status(run_id).info
    created_ms, ended_ms = int(info["created_at"]), int(info["state_at"])
    records: dict[str, dict[str, Any]] = {}
    for shard in range(args.shards):
        records.update(read_items(client.hgetall(store.keys.shard(run_id, shard)[2])))
    done = [r for r in records.values() if r.get("state") == "done"]
    retried = {i: r for i, r in records.items() if r.get("errors")}
    backoffs = [r["eligible_at"] - ms_of(r["errors"][-1].at) for r in retried.values()]
    times = {k.decode(): int(v) for k, v in client.hgetall(key).items()}
    gaps = [times[f"{i}:2"] - times[f"{i}:fail"] for i in retried if f"{i}:2" in times]
    after_due = [r["leased_at"] - r["eligible_at"] for r in retried.values()]
    failing = retry_jobs.failing(args.items, error_pct)
    if len(done) != args.items or set(retried) != failing or len(gaps) != len(failing):
        raise RuntimeError(
            f"run {run_id}: {len(done)} of {args.items} items done, {len(retried)} retried "
            f"({len(failing)} meant to fail), {len(gaps)} retries seen by the handler"
        )
    return {
        "start_s": round(seen - started, 2),
        "created_s": round((ended_ms - created_ms) / 1000, 2),
        "start_to_created_s": round(seen - started - (ended_ms - created_ms) / 1000, 2),
        "end_lag_s": round((ended_ms - max(r["done_at"] for r in done)) / 1000, 2),
        "retry_gap_s": round(max(gaps) / 1000, 2) if gaps else None,
        "retry_gap_median_s": round(statistics.median(gaps) / 1000, 2) if gaps else None,
        "backoff_s": round(max(backoffs) / 1000, 2) if backoffs else None,
        "retry_after_due_s": round(max(after_due) / 1000, 2) if after_due else None,
        "retried": len(retried),
        "end_reason": info.get("reason", ""),
        "worker_exit_codes": codes,
    }


def median(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def worst(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def summarize(found: dict[str, dict[str, list[dict[str, Any]]]], backoff: float) -> dict[str, Any]:
    """Medians, ratios and the goals."""
    medians = {
        side: {
            variant: {k: median([r[k] for r in rounds]) for k in FIGURES}
            for variant, rounds in by_variant.items()
        }
        for side, by_variant in found.items()
    }

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a is not None and b else None

    goals: dict[str, dict[str, Any]] = {}
    for side in SIDES:
        clean, errors = medians[side]["clean"], medians[side]["errors"]
        bound = ERRORS_FACTOR * clean["start_s"] + backoff
        lags = [r["end_lag_s"] for v in VARIANTS for r in found[side][v]]
        gaps = [r["retry_gap_s"] for r in found[side]["errors"]]
        goals[side] = {
            "errors_run_s": {
                "median": errors["start_s"],
                "worst": worst([r["start_s"] for r in found[side]["errors"]]),
                "bound": round(bound, 2),
                "met": errors["start_s"] <= bound,
                "every_round": all(
                    e["start_s"] <= ERRORS_FACTOR * c["start_s"] + backoff
                    for e, c in zip(found[side]["errors"], found[side]["clean"], strict=True)
                ),
            },
            "end_lag_s": {
                "median": median(lags),
                "worst": worst(lags),
                "bound": END_LAG_GOAL,
                "met": (median(lags) or 0) <= END_LAG_GOAL,
                "every_round": all(v <= END_LAG_GOAL for v in lags),
            },
            "retry_gap_s": {
                "median": median(gaps),
                "worst": worst(gaps),
                "bound": backoff + RETRY_SLACK,
                "met": (median(gaps) or 0) <= backoff + RETRY_SLACK,
                "every_round": all(v <= backoff + RETRY_SLACK for v in gaps if v is not None),
            },
        }
    return {
        "medians": medians,
        "ratio_this_to_reference": {
            v: {k: ratio(medians["this"][v][k], medians["reference"][v][k]) for k in FIGURES}
            for v in VARIANTS
        },
        "ratio_errors_to_clean": {
            side: {
                k: ratio(medians[side]["errors"][k], medians[side]["clean"][k])
                for k in ("start_s", "created_s")
            }
            for side in SIDES
        },
        "goals": goals,
    }


def table(result: dict[str, Any]) -> str:
    """The medians and the goals as Markdown tables."""
    medians, ratios = result["medians"], result["ratio_this_to_reference"]
    rows = [
        "| variant | figure (median s) | reference | this | this / reference |",
        "|---|---|---:|---:|---:|",
    ]
    for variant in VARIANTS:
        for k in FIGURES:
            a, b = medians["reference"][variant][k], medians["this"][variant][k]
            if a is None and b is None:
                continue
            r = ratios[variant][k]
            rows.append(f"| {variant} | {k} | {a} | {b} | {'' if r is None else f'{r:.2f}x'} |")
    errors_to_clean = result["ratio_errors_to_clean"]
    rows.append(
        f"| errors / clean | start_s | {errors_to_clean['reference']['start_s']}x "
        f"| {errors_to_clean['this']['start_s']}x | |"
    )
    rows += ["", "| goal | revision | median | worst | bound | met | every round |"]
    rows.append("|---|---|---:|---:|---:|---|---|")
    names = {
        "errors_run_s": "errors run <= 1.5 x clean run + back-off",
        "end_lag_s": "run end after its last commit",
        "retry_gap_s": "retry after its failure",
    }
    for goal, name in names.items():
        for side in SIDES:
            g = result["goals"][side][goal]
            rows.append(
                f"| {name} | {side} | {g['median']} | {g.get('worst', '')} | {g['bound']} "
                f"| {'yes' if g['met'] else '**no**'} | {'yes' if g['every_round'] else 'no'} |"
            )
    load = result["load_1m"]
    rows.append("")
    rows.append(
        f"1-minute load average: {load['start']:.2f} at the start, {load['end']:.2f} at the end."
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", type=Path, required=True, help="a checkout of the reference")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--sleep-ms", type=float, default=5.0, help="the handler's sleep")
    parser.add_argument("--error-pct", type=float, default=5.0, help="items whose first try fails")
    parser.add_argument("--backoff", type=float, default=1.0, help="backoff_base_seconds")
    parser.add_argument(
        "--tick-every", type=float, default=None, help="the workers' --tick-every (default 60)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    # SIGTERM as Ctrl-C: the finally blocks stop the workers and the server
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    begun = time.monotonic()
    checkouts = {"reference": args.ref.resolve(), "this": ROOT}
    found: dict[str, dict[str, list[dict[str, Any]]]] = {
        side: {variant: [] for variant in VARIANTS} for side in SIDES
    }
    order = [(variant, side) for variant in VARIANTS for side in SIDES]
    with tempfile.TemporaryDirectory(prefix="retries-bench-") as tmp:
        folder = Path(tmp)
        jobs_dir = folder / "jobs"
        jobs_dir.mkdir()
        shutil.copy(ROOT / "benchmarks" / "retry_jobs.py", jobs_dir / "retry_jobs.py")
        for checkout in checkouts.values():
            warm_up(checkout, jobs_dir, folder / "pycache")
        (folder / "redis").mkdir()
        server = RedisServer(folder / "redis", {"maxmemory-policy": "noeviction"})
        server.start()
        try:
            client = redis.Redis.from_url(server.url)
            for n in range(args.rounds):
                for variant, side in order if n % 2 == 0 else list(reversed(order)):
                    label = f"r{n + 1}-{side}-{variant}"
                    (folder / label).mkdir()
                    figures = one_round(
                        client, server.url, checkouts[side], variant, args, folder / label, jobs_dir
                    )
                    found[side][variant].append(figures)
                    log(
                        f"round {n + 1} {side} {variant}: succeeded {figures['start_s']} s "
                        f"after the start ({figures['created_s']} s after its creation), "
                        f"end {figures['end_lag_s']} s after the last commit, longest retry "
                        f"gap {figures['retry_gap_s']} s (median {figures['retry_gap_median_s']}), "
                        f"back-off {figures['backoff_s']} s, past due "
                        f"{figures['retry_after_due_s']} s"
                    )
            server_info = machine(client)
        finally:
            server.stop()
    result: dict[str, Any] = {
        "items": args.items,
        "shards": args.shards,
        "workers": WORKERS,
        "sleep_ms": args.sleep_ms,
        "error_pct": args.error_pct,
        "backoff_base_seconds": args.backoff,
        "tick_every": args.tick_every,
        "rounds": args.rounds,
        **summarize(found, args.backoff),
        "rounds_measured": found,
        "load_1m": {"start": _LOAD_AT_START, "end": os.getloadavg()[0]},
        "duration_s": round(time.monotonic() - begun),
        "machine": server_info,
        "reference": str(checkouts["reference"]),
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(table(result))
        print(f"duration {result['duration_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
