"""Test jobs for the effect and fault tests, and the harness that runs them on real processes.

Worker processes import the jobs by path (``tests.effect_jobs:effects``,
``tests.effect_jobs:seat_race``) and read their settings from environment
variables (:class:`EffectConfig`), so that every process of a test sees the
same job. The test process builds the same job from the same config with
:func:`make_effects_job`.

Handlers can stop at named points (:class:`Hooks`): the first process to reach
a point that the test armed writes ``<point>.at`` (its pid, item and token) into
the hook directory and waits for ``<point>.go``, so the test can SIGSTOP or
SIGKILL it exactly there. The points of the effects job, in order:

- ``before_effect``: claimed, nothing recorded in the effect ledger yet;
- ``before_call``: the ledger says ``intended``; the request is not sent yet;
- ``after_call``: the provider answered; the ledger still says ``intended``;
- ``after_effect``: the ledger says ``applied``; the item is not committed yet.

A config's ``hold_after`` caps the handler passes (:class:`Hold`): the first ones go on,
later ones wait at the start of the handler, before anything is recorded, until the
test raises the cap or lifts it. A test that inflicts a fault "once N items are done"
holds the rest of the run so that it cannot finish before the fault is in place,
whatever the machine's speed.

The seat-race job stops at ``before_commit`` after the reservations handler
re-read its hold and before the worker commits the guarded release.

For the fault suite (:mod:`tests.faults.cluster`) a config can name a
``history_dir``: a worker process importing this module then records every
script call there (:mod:`tests.faults.recorder`). With ``marks`` on, each
commit also adds ``<item>|<token>`` to the shard's marks set through a guarded
write, so the checker can tell which holder's writes were applied.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import redis

from redis_lease.demo.provider import ProviderClient
from redis_lease.errors import LeaseLost
from redis_lease.fleet.effects.provider_gate import ProviderGate
from redis_lease.fleet.jobs.job import Job, parse_duration
from redis_lease.fleet.runs.lifecycle import FINAL_STATES, Runs
from redis_lease.fleet.tick.scheduler_tick import tick_job
from redis_lease.fleet.worker.shard_job import ActiveLease, HandlerResult
from redis_lease.protocol.guards import Write
from redis_lease.protocol.leases import Item
from redis_lease.protocol.store.lease_store import LeaseStore
from tests.faults import recorder
from tests.faults.evidence import marks_key

ROOT = Path(__file__).resolve().parent.parent
RESERVATIONS_DIR = ROOT / "examples" / "reservations"
EFFECTS_PATH = "tests.effect_jobs:effects"
SEAT_RACE_PATH = "tests.effect_jobs:seat_race"
#: A schedule that practically never fires, so that ticks only serve the test's own run.
NEVER = "0 0 29 2 *"
ENV = "EFFECT_JOBS_"
GATE_NAME = "test-provider"
WORKER_COMMAND = (sys.executable, "-m", "redis_lease")
POINTS = ("before_effect", "before_call", "after_call", "after_effect", "before_commit")


# -- configuration ----------------------------------------------------------------


@dataclass(frozen=True)
class EffectConfig:
    """Settings of the effects job, passed to worker processes as environment variables."""

    queue: str = "effects-test"
    items: int = 4
    shards: int = 1
    ttl: float = 1.5
    provider_url: str = "http://127.0.0.1:8700"
    provider_timeout: float = 5.0
    honours_keys: bool = True
    use_lookup: bool = True
    gate_cap: int = 0
    slot_wait: float = 2.0
    hook_dir: str = ""
    pause_at: tuple[str, ...] = ()
    max_attempts: int = 8
    backoff_base: float = 0.05
    batch_size: int = 10
    #: Where worker processes record their script calls ('' records nothing).
    history_dir: str = ""
    #: Commits add ``<item>|<token>`` to the shard's marks set (a guarded write).
    marks: bool = False
    schedule: str = NEVER
    deadline: str = "10m"
    #: Extra bytes of padding in each item's payload.
    payload_bytes: int = 0
    #: Handler passes that go on before the rest wait for the test (:class:`Hold`); 0: none.
    hold_after: int = 0

    def env(self) -> dict[str, str]:
        """The environment variables that carry this config."""
        values: dict[str, str] = {}
        for name, value in self.__dict__.items():
            if isinstance(value, bool):
                text = "1" if value else "0"
            elif isinstance(value, tuple):
                text = ",".join(value)
            else:
                text = str(value)
            values[ENV + name.upper()] = text
        return values

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> EffectConfig:
        """The config in the environment (defaults where a variable is missing)."""
        source = os.environ if environ is None else environ
        defaults = cls()
        values: dict[str, Any] = {}
        for name, default in defaults.__dict__.items():
            raw = source.get(ENV + name.upper())
            if raw is None:
                continue
            if isinstance(default, bool):
                values[name] = raw == "1"
            elif isinstance(default, tuple):
                values[name] = tuple(p for p in raw.split(",") if p)
            else:
                values[name] = type(default)(raw)
        return cls(**values)


# -- hooks ------------------------------------------------------------------------


class Hooks:
    """Named pause points shared by the processes of one test through a directory."""

    def __init__(self, directory: str, armed: tuple[str, ...], timeout: float = 120.0) -> None:
        self.directory = Path(directory) if directory else None
        self.armed = set(armed)
        self.timeout = timeout

    def reach(self, point: str, lease: ActiveLease) -> None:
        """At an armed point the first process to arrive stops until the test says go."""
        if self.directory is None or point not in self.armed:
            return
        scratch = self._scratch(point, lease)
        try:
            os.link(scratch, self.directory / f"{point}.at")  # atomic: one process wins
        except FileExistsError:
            return  # another process stopped here already; this one goes on
        finally:
            scratch.unlink()
        go = self.directory / f"{point}.go"
        deadline = time.monotonic() + self.timeout
        while not go.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"hook {point}: no go within {self.timeout}s")
            time.sleep(0.005)

    def note(self, point: str, lease: ActiveLease) -> None:
        """Records that this process passed ``point`` with ``lease`` (one file per pass)."""
        if self.directory is None:
            return
        scratch = self._scratch(point, lease)
        # atomic: a reader sees all of it or nothing
        scratch.rename(self.directory / f"{scratch.name[1:]}.json")

    def _scratch(self, point: str, lease: ActiveLease) -> Path:
        """A hidden file in the directory holding this process's pid, ``lease`` and ``point``."""
        assert self.directory is not None
        info = {"pid": os.getpid(), "item": lease.item_id, "token": lease.token, "point": point}
        scratch = self.directory / f".{point}.{os.getpid()}.{uuid.uuid4().hex}"
        scratch.write_text(json.dumps(info))
        return scratch


class Hold:
    """A cap on handler passes over every process of one test, kept in the hook directory.

    Each pass takes the next number from ``hold.count`` (under a file lock); a pass
    whose number is at or past the cap in ``hold.limit`` waits until the test raises
    the cap past it or lifts it (``none``). Without ``hold.limit`` the cap is
    ``initial``.
    """

    COUNT, LIMIT, NONE = "hold.count", "hold.limit", "none"
    #: How often a held pass looks at the cap again.
    POLL = 0.02

    def __init__(self, directory: str, initial: int, timeout: float = 120.0) -> None:
        self.directory = Path(directory) if directory and initial > 0 else None
        self.initial, self.timeout = initial, timeout

    def take(self) -> None:
        """Takes this pass's number and waits while the cap holds it back."""
        if self.directory is None:
            return
        number = take_number(self.directory / self.COUNT)
        deadline = time.monotonic() + self.timeout
        while True:
            limit = read_limit(self.directory, self.initial)
            if limit is None or number < limit:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"hold: pass {number} not let go within {self.timeout}s")
            time.sleep(self.POLL)


def take_number(path: Path) -> int:
    """Increments the counter in ``path`` under an exclusive lock; returns its old value."""
    with path.open("a+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)  # released when the file closes
        counter.seek(0)
        number = int(counter.read() or 0)
        counter.seek(0)
        counter.truncate()
        counter.write(str(number + 1))
    return number


def passes(directory: Path) -> int:
    """Handler passes that took a number from the hold so far."""
    path = directory / Hold.COUNT
    if not path.exists():
        return 0
    with path.open() as counter:
        fcntl.flock(counter, fcntl.LOCK_SH)  # not between a writer's truncate and write
        return int(counter.read() or 0)


def read_limit(directory: Path, initial: int) -> int | None:
    """The hold's cap now: a number of passes, or None when lifted."""
    path = directory / Hold.LIMIT
    if not path.exists():
        return initial
    text = path.read_text().strip()
    return None if text == Hold.NONE else int(text)


def write_limit(directory: Path, limit: int | None) -> None:
    """Sets the hold's cap (None lifts it); atomic for the readers."""
    scratch = directory / f".{Hold.LIMIT}.{uuid.uuid4().hex}"
    scratch.write_text(Hold.NONE if limit is None else str(limit))
    scratch.rename(directory / Hold.LIMIT)


def notes(directory: Path, point: str) -> list[dict[str, Any]]:
    """What :meth:`Hooks.note` recorded at ``point`` so far."""
    return [json.loads(path.read_text()) for path in sorted(directory.glob(f"{point}.*.json"))]


def wait_for_hook(directory: Path, point: str, timeout: float = 30.0) -> dict[str, Any]:
    """Waits until a process stopped at ``point``; returns its pid, item and token."""
    path = directory / f"{point}.at"
    deadline = time.monotonic() + timeout
    while True:
        if path.exists():
            return dict(json.loads(path.read_text()))
        if time.monotonic() > deadline:
            raise AssertionError(f"no process reached hook {point} within {timeout}s")
        time.sleep(0.005)


def release_hook(directory: Path, point: str) -> None:
    """Lets the process stopped at ``point`` go on."""
    (directory / f"{point}.go").touch()


# -- the jobs ---------------------------------------------------------------------


def item_id(n: int, business_date: date) -> str:
    """The id of item ``n``: account, provider cursor and business date."""
    return f"acct_{n}:cursor_{n % 3}:{business_date.isoformat()}"


def make_effects_job(config: EffectConfig) -> Job:
    """A payout job: one provider effect per item, through the lease's fenced ledger."""
    job = Job(
        "effects-test",
        shards=config.shards,
        lease_ttl_seconds=config.ttl,
        max_attempts=config.max_attempts,
        backoff_base_seconds=config.backoff_base,
        backoff_cap_seconds=0.5,
        deadline_after=parse_duration(config.deadline),
        schedule=config.schedule,
        shard_budget_seconds=60.0,
        batch_size=config.batch_size,
        max_shard_jobs=8,
        queue=config.queue,
    )
    hooks = Hooks(config.hook_dir, config.pause_at)
    hold = Hold(config.hook_dir, config.hold_after)

    padding = "x" * config.payload_bytes

    @job.planner
    def plan(business_date: date) -> Iterator[Item]:
        for n in range(config.items):
            payload: dict[str, Any] = {"account": n, "amount_cents": 100 + n}
            if padding:
                payload["padding"] = padding
            yield Item(item_id(n, business_date), payload)

    @job.handler
    def handle(item: Item, lease: ActiveLease) -> dict[str, Any] | HandlerResult:
        hold.take()
        client = ProviderClient(config.provider_url, timeout=config.provider_timeout)
        hooks.reach("before_effect", lease)

        def call(key: str) -> Any:
            hooks.reach("before_call", lease)
            result = client.apply(key, item.payload)
            hooks.reach("after_call", lease)
            return result

        slot: AbstractContextManager[None] = nullcontext()
        if config.gate_cap:
            gate = ProviderGate(lease.store, GATE_NAME, max_concurrency=config.gate_cap)
            slot = gate.slot(wait=config.slot_wait)
        try:
            with slot:
                record = lease.effect(
                    "payout",
                    call,
                    lookup=client.lookup if config.use_lookup else None,
                    honours_keys=config.honours_keys,
                )
        except LeaseLost:
            hooks.note("lease_lost", lease)  # stopped by the lease, before any write
            raise
        hooks.reach("after_effect", lease)
        result = {"reference": record["id"], "token": lease.token}
        if not config.marks:
            return result
        key = marks_key(lease.store.prefix, lease.run_id, lease.lease.shard)
        return HandlerResult(result=result, writes=(Write.sadd(key, [f"{item.id}|{lease.token}"]),))

    return job


def _reservations() -> Any:
    if str(RESERVATIONS_DIR) not in sys.path:
        sys.path.insert(0, str(RESERVATIONS_DIR))
    import reservations

    return reservations


def make_seat_race_job(queue: str, hook_dir: str) -> Job:
    """The reservations cleanup, stopping once between its re-read and the worker's commit."""
    reservations = _reservations()
    base = reservations.cleanup.options
    job = Job(
        "seat-race",
        shards=1,
        lease_ttl_seconds=base.lease_ttl_seconds,
        max_attempts=base.max_attempts,
        backoff_base_seconds=base.backoff_base_seconds,
        backoff_cap_seconds=base.backoff_cap_seconds,
        deadline_after=timedelta(minutes=10),
        schedule=NEVER,
        shard_budget_seconds=60.0,
        batch_size=base.batch_size,
        queue=queue,
    )
    hooks = Hooks(hook_dir, ("before_commit",))
    job.planner(reservations.plan)

    @job.handler
    def handle(item: Item, lease: ActiveLease) -> HandlerResult:
        answer: HandlerResult = reservations.handle(item, lease)
        if answer.label == "released":
            hooks.reach("before_commit", lease)
        return answer

    return job


def clone_job(job: Job, **options: Any) -> Job:
    """A copy of ``job`` with some options changed (e.g. a test's own queue)."""
    copy = Job(job.name, **{**job.options.__dict__, **options})
    copy.plan_items, copy.handle_item = job.plan_items, job.handle_item
    return copy


_CONFIG = EffectConfig.from_env()
if _CONFIG.history_dir:  # a worker process of the fault suite
    recorder.install(_CONFIG.history_dir, "worker")
effects = make_effects_job(_CONFIG)
seat_race = (
    make_seat_race_job(_CONFIG.queue, _CONFIG.hook_dir)
    if (RESERVATIONS_DIR / "reservations.py").exists()
    else None
)


# -- the harness ------------------------------------------------------------------


@dataclass
class Workers:
    """``redis-lease worker --simple`` processes, each in its own session, logging to files."""

    logs: Path
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _files: list[Any] = field(default_factory=list)

    def start(self, url: str, queue: str, count: int = 1, **env: str) -> list[int]:
        """Starts ``count`` workers on ``queue``; returns their indexes."""
        started = []
        for _ in range(count):
            index = len(self.processes)
            log = (self.logs / f"worker-{index}.log").open("wb")
            self._files.append(log)
            self.processes.append(
                subprocess.Popen(
                    [*WORKER_COMMAND, "--url", url, "worker", "--simple", "--queue", queue],
                    env={**self.env, **env},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=ROOT,
                )
            )
            started.append(index)
        return started

    def index_of(self, pid: int) -> int:
        """The index of the worker with this pid."""
        for index, process in enumerate(self.processes):
            if process.pid == pid:
                return index
        raise AssertionError(f"pid {pid} is not one of this test's workers")

    def signal(self, index: int, sig: int) -> None:
        """Sends ``sig`` to worker ``index``'s process group."""
        process = self.processes[index]
        if process.poll() is None:
            os.killpg(process.pid, sig)

    def kill(self, index: int) -> None:
        """SIGKILLs worker ``index`` and reaps it."""
        self.signal(index, signal.SIGKILL)
        self.processes[index].wait(timeout=10)

    def close(self) -> None:
        """Kills every worker still running and closes the logs."""
        for index in range(len(self.processes)):
            self.signal(index, signal.SIGKILL)
        for process in self.processes:
            process.wait(timeout=10)
        for log in self._files:
            log.close()

    def output(self) -> str:
        """The tail of every worker's log, for failure messages."""
        parts = []
        for path in sorted(self.logs.glob("worker-*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


def worker_env(*extra_paths: Path) -> dict[str, str]:
    """The environment of worker processes: this repository (and more) on the path."""
    paths = [str(ROOT), *(str(p) for p in extra_paths), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def start_run(store: LeaseStore, job: Job) -> str:
    """Creates today's run of ``job`` (server clock); the next tick plans it."""
    runs = Runs(store)
    now = runs.server_now()
    run_id, _ = runs.ensure(job, now.astimezone(job.zone).date(), now)
    return run_id


def drive(
    store: LeaseStore,
    path: str,
    job: Job,
    run_id: str,
    *,
    timeout: float = 60.0,
    until: Callable[[], bool] | None = None,
    step: Callable[[], None] | None = None,
    describe: Callable[[], str] = lambda: "",
) -> str:
    """Ticks the job until ``until()`` holds (default: the run is final); returns its state.

    Polls every 0.1 s with a deadline; ``step`` runs after every tick.
    """
    runs = Runs(store)
    deadline = time.monotonic() + timeout
    while True:
        tick_job(store, runs, path, job, runs.server_now())
        state = runs.info(run_id)["state"]
        if step is not None:
            step()
        if until() if until is not None else state in FINAL_STATES:
            return state
        if time.monotonic() > deadline:
            status = store.status(run_id)
            raise AssertionError(
                f"run {run_id} still {state} after {timeout}s: {status.counts} "
                f"{status.counters}\n{describe()}"
            )
        time.sleep(0.1)


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Polls ``check`` every 10 ms until it holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    """Deletes every key under ``prefix:``."""
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])


_REGISTRIES = ("wip", "finished", "failed", "deferred", "scheduled", "canceled", "ready")


def delete_rq_queue(client: redis.Redis, queue: str) -> None:
    """Deletes an RQ queue with every job, result, registry and worker record it left.

    Only ``rq:`` keys that name this queue, one of its jobs or one of its workers go.
    """
    queue_key = f"rq:queue:{queue}"
    job_ids = {_text(j) for j in client.lrange(queue_key, 0, -1)}
    job_ids |= {_text(j) for j in client.lrange(f"{queue_key}:intermediate", 0, -1)}
    for registry in _REGISTRIES:
        key = f"rq:{registry}:{queue}"
        if _text(client.type(key)) == "zset":
            job_ids |= {_text(j).split(":")[0] for j in client.zrange(key, 0, -1)}
    worker_keys = {_text(w) for w in client.smembers(f"rq:workers:{queue}")}
    names = {queue, *job_ids, *(w.removeprefix("rq:worker:") for w in worker_keys)}
    doomed = [
        key
        for key in (_text(k) for k in client.scan_iter(match="rq:*", count=1000))
        if any(_names_part(key, name) for name in names)
    ]
    client.srem("rq:queues", queue_key)
    if worker_keys:
        client.srem("rq:workers", *worker_keys)
    for start in range(0, len(doomed), 500):
        client.delete(*doomed[start : start + 500])


def _names_part(key: str, name: str) -> bool:
    """True when ``name`` is one whole ``:``-separated part of ``key``."""
    return name in key.split(":")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
