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
holds. The capacity planner (``redis_lease.capacity.plan``) is asked the same
questions (its ``workers_for_slo``, and ``workers`` with one spare node); the
measured counts must agree with it within one worker (exit status 1 otherwise).

Output: a Markdown table on stdout (``--json``: the JSON object instead), and
``burst.json`` and ``burst.png`` (the age over time, one line per K, the SLO drawn)
under ``--out``. Progress goes to stderr.

Usage::

    .venv/bin/python benchmarks/burst.py [--quick] [--scale 0.1] [--slo 60s] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import redis
import rq
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer

from redis_lease import capacity, dispatch, snapshots
from redis_lease.connection import as_text
from redis_lease.errors import InvalidInput
from redis_lease.jobs import Job, parse_duration
from redis_lease.lease import Item
from redis_lease.runs import Runs
from redis_lease.store import LeaseStore

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the job module is imported as benchmarks.*
    sys.path.insert(0, str(ROOT))

from benchmarks.burst_jobs import (  # noqa: E402
    BACKOFF_BASE,
    BACKOFF_CAP,
    JOB_PATH,
    MAX_ATTEMPTS,
    Settings,
    make_job,
)

#: Seconds between two rounds of feeding and dispatching.
LOOP_SECONDS = 0.1
#: Seconds between two samples of the oldest eligible age.
SAMPLE_SECONDS = 0.25
#: Seconds the consumers of a trial get to start and register with RQ.
START_TIMEOUT = 60.0
#: Seconds a consumer gets to drain and exit after SIGTERM before it is killed.
STOP_TIMEOUT = 20.0
#: A trial gives up after W + this many times the time its consumers need at half speed.
TIMEOUT_FACTOR = 2.0
#: The most consumers a search tries (each is a process on this machine).
WORKERS_LIMIT = 16
DEFAULT_OUT = ROOT / "benchmarks" / "results"

_STARTED = time.perf_counter()


# -- the scenario ---------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """The burst as measured: the seed's figures times ``scale`` (the rate r is kept)."""

    eligible_full: int
    window_full: float
    slo_full: float
    scale: float
    handler_ms: float
    retry_rate: float
    max_workers: int

    @property
    def eligible(self) -> int:
        """E on this machine."""
        return max(1, round(self.eligible_full * self.scale))

    @property
    def window(self) -> float:
        """W on this machine, in seconds."""
        return self.window_full * self.scale

    @property
    def slo(self) -> float:
        """The SLO on this machine, in seconds."""
        return self.slo_full * self.scale

    @property
    def per_worker(self) -> float:
        """r: items per second of one consumer (one handler at a time)."""
        return 1000.0 / self.handler_ms

    def to_dict(self) -> dict[str, Any]:
        """The scenario, full scale and scaled, as JSON-ready data."""
        return {
            **asdict(self),
            "eligible": self.eligible,
            "window": self.window,
            "slo": self.slo,
            "per_worker": self.per_worker,
        }


def arrivals(elapsed: float, eligible: int, window: float) -> int:
    """Items eligible ``elapsed`` seconds into the burst: E*t/W, all of them from W on."""
    if elapsed >= window:
        return eligible
    return max(0, min(eligible, math.floor(eligible * elapsed / window)))


# -- trials and the search --------------------------------------------------------


@dataclass
class Trial:
    """One burst worked by ``workers`` consumers, and its sampled oldest eligible age."""

    workers: int
    drained: bool
    samples: list[tuple[float, float]]
    seconds: float = 0.0
    done: int = 0
    dead: int = 0
    claims: int = 0
    retries: int = 0
    state: str = ""
    drained_at: float | None = None
    timed_out: bool = False
    #: Shard jobs this process enqueued (the consumers re-enqueue their own after a budget).
    dispatched: int = 0
    #: The longest a shard job stayed taken off its queue but not started (seconds): the
    #: dispatcher counts such a job as live for ``dispatch.MISSING_GRACE_MS``.
    stalled_job_seconds: float = 0.0
    exit_codes: list[int] = field(default_factory=list)

    @property
    def peak(self) -> float:
        """The highest oldest-eligible age sampled, in seconds."""
        return max((age for _, age in self.samples), default=0.0)

    @property
    def label(self) -> str:
        """``K=3``, or ``K=3, 1 drained`` for a drained trial."""
        return f"K={self.workers}" + (", 1 drained" if self.drained else "")

    def holds(self, slo: float) -> bool:
        """True when the burst finished and the age never passed ``slo``."""
        return not self.timed_out and self.peak <= slo

    @property
    def attempt_rate(self) -> float:
        """Attempts per second of the whole fleet, burst start to last item done."""
        return self.claims / self.seconds if self.seconds > 0 else 0.0

    def attempts_per_item(self) -> float:
        """Claims per item done (1.0 without retries)."""
        return self.claims / self.done if self.done else 0.0

    def to_dict(self, slo: float) -> dict[str, Any]:
        """The trial as JSON-ready data (samples as [seconds, age] pairs)."""
        data = asdict(self)
        data["samples"] = [[round(t, 3), round(age, 3)] for t, age in self.samples]
        data["peak"] = round(self.peak, 3)
        data["holds"] = self.holds(slo)
        data["seconds"] = round(self.seconds, 3)
        data["stalled_job_seconds"] = round(self.stalled_job_seconds, 3)
        data["attempts_per_item"] = round(self.attempts_per_item(), 4)
        data["attempt_rate"] = round(self.attempt_rate, 3)
        return data


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


@dataclass(frozen=True)
class Answer:
    """The planner's worker count for a question, and the measured one."""

    question: str
    planner: int
    measured: int | None

    @property
    def difference(self) -> int | None:
        """Measured less planned (None when nothing measured held the SLO)."""
        return None if self.measured is None else self.measured - self.planner

    @property
    def agrees(self) -> bool:
        """True when the two counts are within one worker of each other."""
        return self.difference is not None and abs(self.difference) <= 1

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready data."""
        return {**asdict(self), "difference": self.difference, "within_one": self.agrees}


def measured_rate(searched: Sequence[Trial]) -> float | None:
    """A consumer's attempts per second, from the one-consumer trial (busy throughout)."""
    single = [t for t in searched if t.workers == 1 and not t.timed_out and t.attempt_rate > 0]
    return single[0].attempt_rate if single else None


def planner_at_rate(scenario: Scenario, rate: float) -> dict[str, Any]:
    """The planner's answer when told the per-consumer rate measured here, not the nominal."""
    args = (scenario.eligible, scenario.window, rate, scenario.slo)
    return {
        "per_worker": round(rate, 3),
        "plan": capacity.plan(*args, retry_rate=scenario.retry_rate).to_dict(),
        "plan_one_spare": capacity.plan(
            *args, retry_rate=scenario.retry_rate, spare_nodes=1
        ).to_dict(),
    }


def planner_view(scenario: Scenario) -> dict[str, Any]:
    """The planner's answers for the scaled scenario: plain, with one spare, predicted peaks."""
    args = (scenario.eligible, scenario.window, scenario.per_worker, scenario.slo)
    plain = capacity.plan(*args, retry_rate=scenario.retry_rate)
    spare = capacity.plan(*args, retry_rate=scenario.retry_rate, spare_nodes=1)
    full = capacity.plan(
        scenario.eligible_full,
        scenario.window_full,
        scenario.per_worker,
        scenario.slo_full,
        retry_rate=scenario.retry_rate,
        spare_nodes=1,
    )
    peaks = {
        str(k): round(
            capacity.peak_age(
                scenario.eligible,
                scenario.window,
                k,
                scenario.per_worker,
                retry_rate=scenario.retry_rate,
            ),
            3,
        )
        for k in range(1, scenario.max_workers + 1)
    }
    return {
        "plan": plain.to_dict(),
        "plan_one_spare": spare.to_dict(),
        "plan_full_scale_one_spare": full.to_dict(),
        "predicted_peak": peaks,
    }


# -- the report ---------------------------------------------------------------------


def table(trials: Sequence[Trial], slo: float, predicted: dict[str, float]) -> str:
    """The trials as a Markdown table (the planner's predicted peak alongside)."""
    head = (
        "| trial | consumers | peak oldest eligible age (s) | planner's peak (s) | SLO (s) "
        "| holds | burst done after (s) | attempts/item | retries | longest stalled job (s) "
        "| run |"
    )
    rows = [head, "|" + "---|" * 11]
    for trial in trials:
        survivors = trial.workers - 1 if trial.drained else trial.workers
        model = predicted.get(str(survivors))
        model_text = "" if model is None else f"{model:.2f}"
        if trial.drained and model is not None:
            model_text += f" (for {survivors})"
        after = f"{trial.seconds:.1f}" + (" (timed out)" if trial.timed_out else "")
        if trial.drained and trial.drained_at is not None:
            who = f"{trial.workers}, 1 drained at {trial.drained_at:.1f}s"
        else:
            who = str(trial.workers)
        rows.append(
            f"| {'drained' if trial.drained else 'search'} | {who} | {trial.peak:.2f} "
            f"| {model_text} | {slo:g} "
            f"| {'yes' if trial.holds(slo) else 'no'} | {after} "
            f"| {trial.attempts_per_item():.3f} | {trial.retries} "
            f"| {trial.stalled_job_seconds:.1f} | {trial.state} |"
        )
    return "\n".join(rows)


def summary(answers: Sequence[Answer]) -> str:
    """One line per question: the planner's count, the measured one, agreement."""
    lines = []
    for answer in answers:
        measured = "none held" if answer.measured is None else str(answer.measured)
        lines.append(
            f"{answer.question}: planner {answer.planner}, measured {measured}: "
            f"{'agree within one worker' if answer.agrees else 'DISAGREE'}"
        )
    return "\n".join(lines)


def report(
    scenario: Scenario,
    planner: dict[str, Any],
    searched: Sequence[Trial],
    drained: Sequence[Trial],
    answers: Sequence[Answer],
    context: dict[str, Any],
) -> dict[str, Any]:
    """Everything measured, as one JSON-ready object."""
    slo = scenario.slo
    return {
        "scenario": scenario.to_dict(),
        "planner": planner,
        "search": [t.to_dict(slo) for t in searched],
        "drained": [t.to_dict(slo) for t in drained],
        "answers": [a.to_dict() for a in answers],
        "agree": all(a.agrees for a in answers),
        **context,
    }


def plot(
    searched: Sequence[Trial], drained: Sequence[Trial], scenario: Scenario, path: Path
) -> Path:
    """Writes the oldest eligible age over time (one line per K, the SLO drawn) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    panels = (
        (axes[0], searched, "search: K consumers"),
        (axes[1], drained, "one consumer drained at W/2"),
    )
    for ax, trials, title in panels:
        for trial in trials:
            times = [t for t, _ in trial.samples]
            ages = [age for _, age in trial.samples]
            verdict = "holds" if trial.holds(scenario.slo) else "over"
            ax.plot(times, ages, label=f"{trial.label} (peak {trial.peak:.1f}s, {verdict})")
        ax.axhline(scenario.slo, color="red", linestyle="--", label=f"SLO {scenario.slo:g}s")
        ax.axvline(scenario.window, color="grey", linestyle=":", label="last item eligible")
        if trials is drained and drained:
            ax.axvline(scenario.window / 2, color="black", linestyle="-.", label="drain")
        ax.set_title(title)
        ax.set_xlabel("seconds since the burst began")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("oldest eligible age (s)")
    figure.suptitle(
        f"{scenario.eligible:,} items over {scenario.window:g}s, {scenario.per_worker:g}/s per "
        f"consumer, {scenario.retry_rate:.0%} of attempts retried "
        f"(the seed's burst x {scenario.scale:g})"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


# -- the private Redis and the consumers ----------------------------------------------


def log(message: str) -> None:
    """A progress line on stderr (seconds since start)."""
    print(f"[{time.perf_counter() - _STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def private_redis(folder: Path) -> Iterator[str]:
    """A redis-server of this benchmark on a free loopback port; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: apt-get install redis-server")
    port = _free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder)]
    args += ["--save", "", "--appendonly", "no", "--logfile", str(folder / "redis.log")]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the private redis-server did not start") from None
                time.sleep(0.02)
        client.close()
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


@dataclass
class Consumers:
    """The ``redis-lease worker --simple`` processes of one trial."""

    url: str
    prefix: str
    settings: Settings
    folder: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, count: int) -> None:
        """Starts ``count`` workers on the trial's queue (each in its own session)."""
        env = {**os.environ, **self.settings.to_env()}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        env.pop("REDIS_LEASE_URL", None)
        queue = self.settings.queue
        for number in range(count):
            name = f"{queue}-{number}"
            command = [sys.executable, "-m", "redis_lease", "--url", self.url]
            command += ["--prefix", self.prefix, "worker", "--simple", "--queue", queue]
            command += ["--name", name]
            with (self.folder / f"{name}.log").open("wb") as out:
                self.processes.append(
                    subprocess.Popen(
                        command,
                        cwd=ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def wait_registered(self, client: redis.Redis) -> None:
        """Waits until every worker has registered with RQ on the trial's queue."""
        key = f"rq:workers:{self.settings.queue}"
        deadline = time.monotonic() + START_TIMEOUT
        while client.scard(key) < len(self.processes):
            exited = [p.returncode for p in self.processes if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{client.scard(key)} of {len(self.processes)} consumers registered "
                    f"(exit codes {exited})\n{self.output()}"
                )
            time.sleep(0.05)

    def drain_one(self) -> None:
        """SIGTERM to the first consumer: it finishes its item, releases the rest, exits."""
        self.processes[0].send_signal(signal.SIGTERM)

    def stop(self) -> list[int]:
        """SIGTERM to every consumer still running, SIGKILL after STOP_TIMEOUT; exit codes."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        codes = []
        for process in self.processes:
            try:
                codes.append(process.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                process.kill()
                codes.append(process.wait(timeout=10))
        return codes

    def output(self) -> str:
        """The tail of every consumer's log (for error messages)."""
        tails = [p.read_text(errors="replace")[-1500:] for p in sorted(self.folder.glob("*.log"))]
        return "\n".join(t for t in tails if t.strip())


# -- one trial ---------------------------------------------------------------------


@dataclass
class Bench:
    """The trials of one benchmark run on its private Redis."""

    url: str
    client: redis.Redis
    scenario: Scenario
    folder: Path
    progress: Progress
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    count: int = 0

    @property
    def prefix(self) -> str:
        """Every redis-lease key of this benchmark starts with it."""
        return f"burst-{self.tag}"

    def trial(self, workers: int, drained: bool) -> Trial:
        """Runs one burst with ``workers`` consumers (one drained at W/2 when ``drained``)."""
        self.count += 1
        settings = Settings(
            queue=f"burst-{self.tag}-{self.count}",
            shards=workers,
            handler_ms=self.scenario.handler_ms,
            retry_rate=self.scenario.retry_rate,
        )
        job = make_job(settings)
        store = LeaseStore(self.client, prefix=self.prefix, url=self.url)
        folder = self.folder / f"trial-{self.count}"
        folder.mkdir()
        consumers = Consumers(self.url, self.prefix, settings, folder)
        label = Trial(workers, drained, []).label
        task = self.progress.add_task(label, total=self.scenario.eligible, age=0.0)
        business_date = date.fromordinal(730_000 + self.count)
        try:
            consumers.start(workers)
            consumers.wait_registered(self.client)
            trial = Trial(workers, drained, [])
            self._burst(store, job, business_date, consumers, trial, task)
        finally:
            codes = consumers.stop()
            self._clean(store, settings.queue, job.run_id(business_date))
        trial.exit_codes = codes
        log(
            f"{trial.label}: peak oldest eligible age {trial.peak:.2f}s "
            f"(SLO {self.scenario.slo:g}s), done after {trial.seconds:.1f}s, run {trial.state}"
        )
        return trial

    def _burst(
        self,
        store: LeaseStore,
        job: Job,
        business_date: date,
        consumers: Consumers,
        trial: Trial,
        task: Any,
    ) -> None:
        """Feeds the items over W, keeps shard jobs dispatched, samples the age until done."""
        scenario, runs = self.scenario, Runs(store)
        run_id, _ = runs.ensure(job, business_date, runs.server_now())
        deadline_ms = int(runs.info(run_id)["deadline_at"])
        need = scenario.eligible / (trial.workers * scenario.per_worker * 0.5)
        timeout = scenario.window + TIMEOUT_FACTOR * need + 30
        fed, next_sample = 0, 0.0
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            due = arrivals(elapsed, scenario.eligible, scenario.window)
            if due > fed:
                _feed(runs, run_id, range(fed, due), scenario.eligible, deadline_ms)
                fed = due
            if trial.drained and trial.drained_at is None and elapsed >= scenario.window / 2:
                consumers.drain_one()
                trial.drained_at = round(elapsed, 3)
            info, shards = snapshots.read(store, run_id)
            status = snapshots.summary(run_id, info, shards)
            age = status.oldest_eligible_age_seconds
            finished = fed == scenario.eligible and status.finished >= scenario.eligible
            if elapsed >= next_sample or finished:
                trial.samples.append((elapsed, age))
                next_sample = elapsed + SAMPLE_SECONDS
                self.progress.update(task, completed=status.finished, age=age)
            if finished or elapsed > timeout:
                trial.timed_out = not finished
                break
            _check_no_failed_job(self.client, job.options.queue)
            enqueued, stalled = _dispatch(store, job, run_id, shards)
            trial.dispatched += enqueued
            trial.stalled_job_seconds = max(trial.stalled_job_seconds, stalled)
            time.sleep(max(0.0, LOOP_SECONDS - (time.monotonic() - started - elapsed)))
        trial.seconds = elapsed
        runs.finalize(run_id, "burst over")
        status = store.status(run_id)
        trial.done, trial.dead = status.counts["done"], status.counts["dead"]
        trial.claims = status.events.get("claims", 0)
        trial.retries = status.events.get("retries", 0)
        trial.state = runs.info(run_id)["state"]

    def _clean(self, store: LeaseStore, queue: str, run_id: str) -> None:
        """Deletes the trial's RQ queue and jobs, and every redis-lease key of the benchmark.

        Shard jobs the run still lists, and jobs left in RQ's intermediate list (taken
        off the queue by a consumer that stopped before starting them), are named to
        ``purge_queue``, which finds only the queue's list and registries.
        """
        stranded = self.client.lrange(f"rq:queue:{queue}:intermediate", 0, -1)
        listed = self.client.hkeys(store.keys.run_jobs(run_id))
        extra = tuple(sorted({as_text(rq_id) for rq_id in [*stranded, *listed]}))
        dispatch.purge_queue(self.client, queue, extra)
        keys = list(self.client.scan_iter(match=f"{self.prefix}:*", count=1000))
        for start in range(0, len(keys), 1000):
            self.client.delete(*keys[start : start + 1000])


def _feed(runs: Runs, run_id: str, numbers: range, eligible: int, deadline_ms: int) -> None:
    """Adds items ``numbers`` to the run; after the last one the run counts as planned."""
    runs.store.add(
        run_id,
        [Item(f"r{n:07d}", {"n": n}) for n in numbers],
        max_attempts=MAX_ATTEMPTS,
        backoff_base=BACKOFF_BASE,
        backoff_cap=BACKOFF_CAP,
        deadline_ms=deadline_ms,
    )
    if numbers.stop == eligible:
        runs.transition(
            run_id,
            "planning",
            "running",
            f"fed {eligible} items over the burst window",
            planned="1",
            planned_items=eligible,
        )


def _check_no_failed_job(client: redis.Redis, queue_name: str) -> None:
    """Raises RuntimeError naming the error when a shard job failed (it never should)."""
    failed = dispatch.queue(client, queue_name).failed_job_registry
    ids = failed.get_job_ids(0, 0, cleanup=False)
    if not ids:
        return
    rq_job = RQJob.fetch(ids[0], connection=client, serializer=JSONSerializer)
    result = rq_job.latest_result()
    error = (result.exc_string or "").strip().splitlines() if result else []
    raise RuntimeError(
        f"shard job {ids[0]} failed: {error[-1] if error else 'no error recorded'} "
        "(a worker or protocol change mid-run? run again)"
    )


def _dispatch(
    store: LeaseStore, job: Job, run_id: str, shards: list[snapshots.ShardSnapshot]
) -> tuple[int, float]:
    """Enqueues a shard job for each shard with due items (or leases) and no live job.

    Returns the jobs enqueued and how long (seconds) the longest-missing shard job has
    been taken off its queue without starting (0 when none is, or none was checked).
    """
    wanted = [
        shard
        for shard, snap in enumerate(shards)
        if (snap.first_due is not None and snap.first_due <= snap.now) or snap.counts["leased"]
    ]
    if not wanted:
        return 0, 0.0
    live = dispatch.live_jobs(store, run_id)  # also brings the run's missing jobs up to date
    pipe = store.client.pipeline(transaction=False)
    pipe.hgetall(store.keys.run_jobs_missing(run_id))
    pipe.hkeys(store.keys.run_jobs(run_id))
    missing, listed = pipe.execute()
    # A job that ended is no longer listed, but may linger among the missing: skip it.
    now_ms = max(snap.now for snap in shards)
    stalled = max(
        ((now_ms - int(since)) / 1000 for rq_id, since in missing.items() if rq_id in listed),
        default=0.0,
    )
    enqueued = 0
    for shard in wanted:
        if not live.get(shard):
            opts = job.options
            dispatch.enqueue_shard(store, JOB_PATH, opts.queue, run_id, shard, opts.shard_budget)
            enqueued += 1
    return enqueued, max(0.0, stalled)


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


def machine(client: redis.Redis) -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis_server": client.info("server").get("redis_version"),
        "redis_py": redis.__version__,
        "rq": rq.__version__,
    }


def load_average() -> float:
    """The 1-minute load average."""
    return round(os.getloadavg()[0], 2)


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
