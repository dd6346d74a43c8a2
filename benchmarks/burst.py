"""Burst load test: how many consumers keep the oldest eligible item within the SLO.

The scenario (the seed's): E items become eligible evenly over a window W; each
consumer finishes r items/s (a handler that sleeps ``--handler-ms``, one item at a
time); a share q of the attempts fails and is retried after a short backoff. The
question is not whether K consumers keep up on average but whether the **oldest
eligible item** stays younger than the SLO during the burst.

Scaled to this machine: E, W and the SLO are multiplied by ``--scale`` (0.1 by
default: 12,000 items over 5 minutes become 1,200 over 30 s); r is kept. In the
planner's model the backlog part of the peak age scales by the same factor, so the
worker count that holds the scaled SLO is the one that holds the full one.

Each trial is a real fleet run on a private ``redis-server`` (``--save ''
--appendonly no``, a free loopback port, stopped at the end):

* K ``redis-lease worker --simple`` processes (RQ) on a queue of the trial;
* a run with K shards of the job ``benchmarks.burst_jobs:burst_job`` (one item per
  claim; a shard job works its shard for 1 s, then re-enqueues itself, so shard jobs
  rotate over the consumers);
* this process, every 0.1 s: adds the items due by now (``LeaseStore.add``; E*t/W of
  them at time t), enqueues a shard job (``dispatch.enqueue_shard``) for every shard
  with due items and no live job (a shard job returns once its shard is drained),
  and every 0.25 s samples ``oldest_eligible_age_seconds`` of ``store.status``.

The scheduler tick does not dispatch here: it plans a run still ``planning`` itself,
and finalizes a ``running`` one as soon as no item is left, which happens between
arrivals when the consumers keep up.

A retried item is eligible again when its backoff ends, and its age counts from
then: a retry shows as a new eligible item, not as the first attempt's wait.

The search runs K = 1, 2, ... until a trial's peak age holds the SLO. Then the
drained repeat: K and K + 1 consumers, one of them sent SIGTERM at W/2 (a drain:
it finishes its item, releases the rest and leaves), continued upward until one
holds. The capacity planner (``redis_lease.fleet.capacity.model.plan``) is asked the same
questions (its ``workers_for_slo``, and ``workers`` with one spare node); the
measured counts must agree with it within one worker (exit status 1 otherwise).

Output: a Markdown table on stdout (``--json``: the JSON object instead), and
``burst.json`` and ``burst.png`` (the age over time, one line per K, the SLO drawn)
under ``--out``. Progress goes to stderr.

This module holds the command line and the search; ``burst_model`` the scenario and a
trial's record, ``burst_trial`` one trial (feeding, dispatching, sampling),
``burst_fleet`` the private server and the consumers, ``burst_planner`` the planner's
answers, ``burst_report`` the table, the JSON and the plot, ``burst_jobs`` the job.

Usage::

    .venv/bin/python benchmarks/burst.py [--quick] [--scale 0.1] [--slo 60s] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from redis_lease.errors import InvalidInput
from redis_lease.fleet.jobs.job import parse_duration

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the job module is imported as benchmarks.*
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_fleet import log  # noqa: E402
from benchmarks.burst_fleet import private_redis  # noqa: E402
from benchmarks.burst_model import Scenario, Trial  # noqa: E402
from benchmarks.burst_planner import (  # noqa: E402
    Answer,
    measured_rate,
    planner_at_rate,
    planner_view,
)
from benchmarks.burst_report import (  # noqa: E402
    load_average,
    machine,
    plot,
    report,
    summary,
    table,
)
from benchmarks.burst_trial import Bench  # noqa: E402

#: The most consumers a search tries (each is a process on this machine).
WORKERS_LIMIT = 16
DEFAULT_OUT = ROOT / "benchmarks" / "results"


# -- the search ---------------------------------------------------------------------


def search(
    measure: Callable[[int], Trial],
    slo: float,
    start: int,
    max_workers: int,
    *,
    at_least: int = 0,
) -> tuple[int | None, list[Trial]]:
    """Measures K = start, start + 1, ... until a trial holds the SLO.

    Goes on to K = ``at_least`` even when an earlier one held. Returns the smallest
    K that held (None when none up to ``max_workers`` did) and every trial.
    """
    found: int | None = None
    trials: list[Trial] = []
    for workers in range(start, max_workers + 1):
        trial = measure(workers)
        trials.append(trial)
        if found is None and trial.holds(slo):
            found = workers
        if found is not None and workers >= at_least:
            break
    return found, trials


# -- the command line ------------------------------------------------------------------


def _seconds(text: str) -> float:
    """Seconds from ``300``, ``300s``, ``5m`` or ``1h``."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text).total_seconds()
    except InvalidInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; bad input ends with a one-line error and exit status 2."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--eligible", type=int, default=12_000, help="E at full scale (12000)")
    parser.add_argument(
        "--window", type=_seconds, default=300.0, help="W at full scale: 300, 300s, 5m (5m)"
    )
    parser.add_argument(
        "--handler-ms", type=float, default=50.0, help="handler latency in ms (50: r = 20/s)"
    )
    parser.add_argument("--slo", type=_seconds, default=60.0, help="SLO at full scale (60s)")
    parser.add_argument(
        "--retry-rate", type=float, default=0.05, help="share of attempts that fail (0.05)"
    )
    parser.add_argument(
        "--scale", type=float, default=None, help="factor on E, W and the SLO (0.1; --quick 0.05)"
    )
    parser.add_argument(
        "--max-workers",
        type=int,
        default=8,
        help=f"most consumers tried (8, at most {WORKERS_LIMIT})",
    )
    parser.add_argument("--quick", action="store_true", help="half the default scale: a short run")
    parser.add_argument("--json", action="store_true", help="print the JSON object, not the table")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="where burst.json and burst.png go"
    )
    args = parser.parse_args(argv)
    if args.scale is None:
        args.scale = 0.05 if args.quick else 0.1
    checks = [
        (args.eligible >= 1, "--eligible must be at least 1"),
        (args.window > 0, "--window must be above 0, e.g. 5m"),
        (0 < args.handler_ms <= 10_000, "--handler-ms must be above 0 and at most 10000"),
        (args.slo > 0, "--slo must be above 0, e.g. 60s"),
        (0 <= args.retry_rate <= 0.5, "--retry-rate must be from 0 to 0.5"),
        (0 < args.scale <= 1, "--scale must be above 0 and at most 1, e.g. 0.1"),
        (
            1 <= args.max_workers <= WORKERS_LIMIT,
            f"--max-workers must be from 1 to {WORKERS_LIMIT} (each is a process here)",
        ),
    ]
    for ok, message in checks:
        if not ok:
            parser.error(message)
    if round(args.eligible * args.scale) < 10:
        parser.error("--eligible x --scale must leave at least 10 items; raise either")
    if args.slo * args.scale < args.handler_ms / 1000:
        parser.error("the scaled SLO is shorter than one handler call; raise --slo or --scale")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark; a failed shard job or Ctrl-C ends it with one line on stderr."""
    args = parse_args(argv)
    try:
        return measure(args)
    except RuntimeError as error:
        print(f"burst: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "burst: interrupted; the consumers and the private Redis were stopped", file=sys.stderr
        )
        return 130


def measure(args: argparse.Namespace) -> int:
    """Runs the search and the drained repeat; writes burst.json and burst.png."""
    scenario = Scenario(
        args.eligible,
        args.window,
        args.slo,
        args.scale,
        args.handler_ms,
        args.retry_rate,
        args.max_workers,
    )
    planner = planner_view(scenario)
    load_start = load_average()
    log(
        f"burst: {scenario.eligible} items over {scenario.window:g}s, r {scenario.per_worker:g}/s, "
        f"retries {scenario.retry_rate:.0%}, SLO {scenario.slo:g}s; planner: "
        f"{planner['plan']['workers_for_slo']} consumers, "
        f"{planner['plan_one_spare']['workers']} with one spare"
    )
    console = Console(stderr=True)
    columns = (
        TextColumn("{task.description:<16}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("oldest eligible {task.fields[age]:5.1f}s"),
        TimeElapsedColumn(),
    )
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="burst-") as temp,
        private_redis(Path(temp)) as url,
        Progress(*columns, console=console) as progress,
    ):
        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=60)
        bench = Bench(url, client, scenario, Path(temp), progress)
        slo = scenario.slo
        found, searched = search(lambda k: bench.trial(k, False), slo, 1, scenario.max_workers)
        start = found or scenario.max_workers
        spare, drained = search(
            lambda k: bench.trial(k, True), slo, start, scenario.max_workers, at_least=start + 1
        )
        leftover = sorted(k.decode() for k in client.scan_iter(count=1000))
        info = machine(client)
        client.close()
    answers = [
        Answer("consumers holding the SLO", planner["plan"]["workers_for_slo"], found),
        Answer("with one consumer drained at W/2", planner["plan_one_spare"]["workers"], spare),
    ]
    rate = measured_rate(searched)
    if rate is not None:
        planner["at_measured_rate"] = planner_at_rate(scenario, rate)
    context: dict[str, Any] = {
        "machine": info,
        "load_average_1m": {"start": load_start, "end": load_average()},
        "seconds": round(time.monotonic() - started, 1),
        "leftover_keys": leftover,
        "outputs": ["burst.json", "burst.png"],
    }
    data = report(scenario, planner, searched, drained, answers, context)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "burst.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(searched, drained, scenario, args.out / "burst.png")
    if args.json:
        print(json.dumps(data))
    else:
        print(table([*searched, *drained], slo, planner["predicted_peak"]))
        print()
        print(summary(answers))
        if rate is not None:
            at_rate = planner["at_measured_rate"]
            print(
                f"planner told the measured rate ({rate:.2f} attempts/s per consumer, the K=1 "
                f"trial): {at_rate['plan']['workers_for_slo']} consumers, "
                f"{at_rate['plan_one_spare']['workers']} with one spare"
            )
        print(
            f"load average (1m) {load_start} at start, {context['load_average_1m']['end']} at end;"
            f" machine: {json.dumps(info)}; written: {args.out / 'burst.json'}, "
            f"{args.out / 'burst.png'}"
        )
    return 0 if data["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
