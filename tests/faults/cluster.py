"""A private Redis, a fault proxy, a provider and RQ worker processes, with a method per fault.

A :class:`Cluster` owns everything one fault test (or a chaos run) needs:

- a private ``redis-server`` (AOF on, ``appendfsync always`` unless told otherwise)
  in its own directory;
- a :class:`~tests.faults.proxy.Proxy` in front of it, through which every worker
  talks to Redis (the test's own :attr:`Cluster.store` goes direct);
- or, with ``redis_cluster=True``, a private 3-primary Redis Cluster
  (:class:`~tests.redis_cluster.ClusterServers`) for the lease state, the server
  for RQ's queues only (``--queue-url``), and no proxy (a cluster's redirections
  name its nodes): the proxy's and the one server's faults are refused, and
  moving a hash slot to another primary while the run works is offered instead;
- the loopback payment provider (:class:`~redis_lease.demo.provider.ProviderServer`);
- N ``redis-lease worker --simple`` processes (``--concurrency`` handlers each)
  running the effects job of :mod:`tests.effect_jobs`, each recording its script
  calls into the history directory, optionally on a clock skewed by libfaketime.

Every fault method is small, acts at once and appends ``(seconds since start,
kind, detail)`` to :attr:`Cluster.faults`. :meth:`Cluster.drive` ticks from the
test process until the run is final (riding out a Redis that is down a moment,
and restarting, as a supervisor would, a worker that quit by itself);
:meth:`Cluster.verify` runs the checker and shows the workers' logs on failure.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from redis_lease import LeaseStore
from redis_lease.demo.provider import ProviderServer, ProviderState
from redis_lease.errors import RedisLeaseError
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import FINAL_STATES, Decision, Runs
from redis_lease.fleet.tick.scheduler_tick import tick_job
from redis_lease.fleet.transport import takeover
from tests import effect_jobs
from tests.effect_jobs import EffectConfig
from tests.faults.checker import Summary, Violation, check
from tests.faults.evidence import Evidence, collect
from tests.faults.proxy import Proxy
from tests.faults.recorder import Op, read_lines, read_ops
from tests.fleet_helpers import stop_group, threads_stopped, wait_for
from tests.helpers import server_ms
from tests.redis_cluster import HOST, ClusterServers
from tests.redis_server import RedisServer

#: Where Debian and source builds put libfaketime.
FAKETIME_LIBS = (
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


#: A read-only script that keeps the server busy for ARGV[1] ms by its clock.
LONG_SCRIPT = """
local function ms() local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000) end
local ends = ms() + tonumber(ARGV[1])
while ms() < ends do end
return 1
"""

#: A sitecustomize that mends time.sleep under libfaketime.
FAKETIME_SITE = Path(__file__).resolve().parent / "faketime_site"


def faketime_library() -> str | None:
    """The path of libfaketime, or None when it is not installed."""
    for pattern in FAKETIME_LIBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def require_faketime() -> str:
    """libfaketime's path; fails under CI=true when it is missing, else skips."""
    library = faketime_library()
    if library is not None:
        return library
    message = "libfaketime is missing: apt-get install faketime (.ci/run installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class SlotMove:
    """A hash slot on its way from one primary to another (see :meth:`Cluster.begin_slot_move`)."""

    slot: int
    source: int
    target: int
    #: Seconds since the cluster started when the move began.
    began: float
    #: The machine's clock (ms) when it began and when every node agreed on the target.
    began_ms: int
    ended_ms: int = 0
    #: Keys MIGRATEd so far.
    moved: int = 0


@dataclass
class Worker:
    """One worker slot: its process (replaced on restart), clock offset and log."""

    index: int
    clock: str
    log: Path
    process: subprocess.Popen[bytes]
    #: True once a fault ended the process on purpose (no respawn).
    ended_on_purpose: bool = False

    @property
    def alive(self) -> bool:
        """True while the process runs."""
        return self.process.poll() is None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _node(port: int) -> redis.Redis:
    """A plain client of one cluster node, for admin commands (the caller closes it)."""
    return redis.Redis(host=HOST, port=port, decode_responses=True, socket_timeout=5)


class Cluster:
    """Redis, proxy, provider and workers of one test, with a method per fault.

    Args:
        directory: a fresh directory for the server's files, histories, hooks and logs.
        prefix: the key prefix of the runs.
        workers: worker processes to start.
        clocks: libfaketime offsets of the first workers (e.g. ``"+3h"``; ``""``: none).
        redis_config: ``redis-server`` options over ``appendonly yes``,
            ``appendfsync always``.
        provider: the provider's state (default: one that honours idempotency keys).
        concurrency: handlers each worker's shard job runs at once (``worker --concurrency``).
        redis_cluster: the lease state on a private 3-primary Redis Cluster, RQ's queues
            on the private server (``redis_config`` applies to it), no proxy.
        settings: fields of :class:`~tests.effect_jobs.EffectConfig` (items, ttl, ...).
    """

    def __init__(
        self,
        directory: Path,
        prefix: str,
        *,
        workers: int = 2,
        clocks: Sequence[str] = (),
        redis_config: Mapping[str, str] | None = None,
        provider: ProviderState | None = None,
        concurrency: int = 1,
        redis_cluster: bool = False,
        **settings: Any,
    ) -> None:
        self.directory, self.prefix = directory, prefix
        self.concurrency = concurrency
        self.started = time.monotonic()
        #: (seconds since start, kind, detail) of every fault injected.
        self.faults: list[tuple[float, str, str]] = []
        #: Every decision the test's ticks made.
        self.decisions: list[Decision] = []
        self.workers: list[Worker] = []
        #: The run a chaos iteration works on now (its slot moves pick this run's shards).
        self.current_run = ""
        for name in ("redis", "history", "hooks", "logs"):
            (directory / name).mkdir(parents=True, exist_ok=True)
        config = {"appendonly": "yes", "appendfsync": "always", **(redis_config or {})}
        self.server = RedisServer(directory / "redis", config)
        #: The lease state's Redis Cluster (``redis_cluster=True``), else None.
        self.redis_cluster = ClusterServers(directory / "cluster") if redis_cluster else None
        #: Slots whose move has begun and not finished, by slot.
        self.slot_moves: dict[int, SlotMove] = {}
        #: Seconds each finished slot move took, begin to every node agreeing.
        self.slot_move_seconds: list[float] = []
        #: Every finished slot move, in order.
        self.finished_moves: list[SlotMove] = []
        self.config = EffectConfig(
            queue=f"{prefix}-q",
            hook_dir=str(self.hooks),
            history_dir=str(self.history),
            marks=True,
            **settings,
        )
        self.provider = ProviderServer(state=provider or ProviderState())
        self._clocks = (list(clocks) + [""] * workers)[:workers]
        self._serving = False

    #: Set by __enter__: the proxy the workers use, the test's direct store, the job.
    proxy: Proxy
    store: LeaseStore
    job: Job

    def __enter__(self) -> Cluster:
        try:
            self.start_redis()
            self.provider.start()
            self._serving = True
            self.config = replace(self.config, provider_url=self.provider.url)
            self.job = effect_jobs.make_effects_job(self.config)
            self.store = self.open_store()
            for clock in self._clocks:
                self.start_worker(clock)
        except BaseException:
            self.close()
            raise
        return self

    def start_redis(self) -> None:
        """Starts the server (and the proxy), or the cluster and RQ's server."""
        self.server.start()
        if self.redis_cluster is None:
            self.proxy = Proxy(self.server.port)
        else:
            self.redis_cluster.start()

    def open_store(self) -> LeaseStore:
        """The test's own store: direct, failing fast (drive rides out an outage)."""
        if self.redis_cluster is None:
            return LeaseStore.from_url(
                self.server.url, prefix=self.prefix, socket_timeout=2.0, retry=Retry(NoBackoff(), 0)
            )
        # the cluster client's own retries follow redirections and TRYAGAIN
        return LeaseStore.from_url(
            self.redis_cluster.url,
            prefix=self.prefix,
            queue_url=self.server.url,
            socket_timeout=2.0,
        )

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def history(self) -> Path:
        """The directory the workers record their script calls into."""
        return self.directory / "history"

    @property
    def hooks(self) -> Path:
        """The directory of the handler's pause points."""
        return self.directory / "hooks"

    def note(self, kind: str, detail: str = "") -> None:
        """Logs a fault injected now."""
        self.faults.append((round(time.monotonic() - self.started, 3), kind, detail))

    # -- workers --------------------------------------------------------------------

    def _spawn(self, clock: str, log: Path) -> subprocess.Popen[bytes]:
        env = {**effect_jobs.worker_env(), **self.config.env()}
        if clock:
            env.update(
                LD_PRELOAD=require_faketime(),
                FAKETIME=clock,
                FAKETIME_DONT_FAKE_MONOTONIC="1",  # a skewed wall clock, as on another host
                FAKETIME_NO_CACHE="1",
                # time.sleep mended for libfaketime (see faketime_site/sitecustomize.py)
                PYTHONPATH=os.pathsep.join([str(FAKETIME_SITE), env.get("PYTHONPATH", "")]),
            )
        args = [*effect_jobs.WORKER_COMMAND, *self.url_options(), "worker", "--simple"]
        if self.concurrency > 1:
            args += ["--concurrency", str(self.concurrency)]
        with log.open("ab") as out:
            return subprocess.Popen(
                [*args, "--queue", self.config.queue],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=effect_jobs.ROOT,
            )

    def url_options(self) -> list[str]:
        """The global options naming the workers' Redis: the proxy, or the cluster and
        RQ's server."""
        if self.redis_cluster is None:
            return ["--url", self.proxy.url, "--prefix", self.prefix]
        return [
            "--url", self.redis_cluster.url, "--queue-url", self.server.url, "--prefix", self.prefix
        ]  # fmt: skip

    def start_worker(self, clock: str = "") -> int:
        """Starts one more worker (on a clock skewed by ``clock``); returns its index."""
        index = len(self.workers)
        log = self.directory / "logs" / f"worker-{index}.log"
        self.workers.append(Worker(index, clock, log, self._spawn(clock, log)))
        return index

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until every live worker has registered with RQ (it is taking jobs)."""
        key = f"rq:workers:{self.config.queue}"
        deadline = time.monotonic() + timeout
        while self.store.rq.scard(key) < sum(w.alive for w in self.workers):
            if time.monotonic() > deadline:
                raise AssertionError(f"workers not ready after {timeout}s\n{self.describe()}")
            time.sleep(0.02)

    def _signal(self, index: int, sig: int) -> None:
        worker = self.workers[index]
        if worker.alive:
            os.killpg(worker.process.pid, sig)

    def pause(self, index: int) -> None:
        """SIGSTOPs worker ``index`` (its lease keeper stops too); returns once every
        thread of it is stopped."""
        if self.workers[index].alive:
            stop_group(self.workers[index].process.pid)
        self.note("pause", f"worker {index} pid {self.workers[index].process.pid}")

    def resume(self, index: int) -> None:
        """SIGCONTs worker ``index``."""
        self._signal(index, signal.SIGCONT)
        self.note("resume", f"worker {index}")

    def kill(self, index: int) -> None:
        """SIGKILLs worker ``index`` and reaps it."""
        worker = self.workers[index]
        worker.ended_on_purpose = True
        self._signal(index, signal.SIGKILL)
        worker.process.wait(timeout=10)
        self.note("kill", f"worker {index} pid {worker.process.pid}")

    def terminate(self, index: int) -> None:
        """SIGTERMs worker ``index``: it drains (finishes its item, gives the rest back)."""
        self.workers[index].ended_on_purpose = True
        self._signal(index, signal.SIGTERM)
        self.note("terminate", f"worker {index} pid {self.workers[index].process.pid}")

    def restart_worker(self, index: int) -> None:
        """Kills worker ``index`` and starts a new process in its slot (same clock)."""
        self.kill(index)
        worker = self.workers[index]
        worker.process = self._spawn(worker.clock, worker.log)
        worker.ended_on_purpose = False
        self.note("restart-worker", f"worker {index} pid {worker.process.pid}")

    def index_of(self, pid: int) -> int:
        """The slot of the worker process ``pid``."""
        for worker in self.workers:
            if worker.process.pid == pid:
                return worker.index
        raise AssertionError(f"pid {pid} is not one of this cluster's workers")

    def holder(self, run_id: str, item: str) -> int | None:
        """The slot of the worker holding ``item``'s lease now (from its owner's pid)."""
        record = self.store.item(run_id, item)
        parts = (record.owner or "").split(":")
        if record.state != "leased" or len(parts) < 3 or not parts[-2].isdigit():
            return None
        return self.index_of(int(parts[-2]))

    def wait_hook(self, point: str, timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
        """Waits until a worker stops at ``point``; its slot, and its pid, item and token."""
        stopped = effect_jobs.wait_for_hook(self.hooks, point, timeout)
        return self.index_of(stopped["pid"]), stopped

    def release(self, point: str) -> None:
        """Lets the worker stopped at ``point`` go on."""
        effect_jobs.release_hook(self.hooks, point)

    # -- the hold (settings hold_after=N: passes past the N-th wait; see effect_jobs.Hold) --

    def hold_limit(self) -> int | None:
        """The hold's cap on handler passes now (None: lifted or never set)."""
        if self.config.hold_after <= 0:
            return None
        return effect_jobs.read_limit(self.hooks, self.config.hold_after)

    def held(self) -> int:
        """Handler passes waiting at the hold now."""
        limit = self.hold_limit()
        return 0 if limit is None else max(0, effect_jobs.passes(self.hooks) - limit)

    def hold_at(self, limit: int) -> None:
        """Caps the handler passes (since the start) at ``limit``: later ones wait."""
        effect_jobs.write_limit(self.hooks, limit)
        self.note("hold", f"at {limit} passes")

    def hold_more(self, count: int) -> None:
        """Lets ``count`` more handler passes go than the cap let so far."""
        limit = self.hold_limit()
        assert limit is not None, "no hold to let more through"
        self.hold_at(limit + count)

    def lift_hold(self) -> None:
        """Lets every held handler pass go on, and every later one."""
        effect_jobs.write_limit(self.hooks, None)
        self.note("lift-hold")

    def work_held(self, run_id: str, done: int) -> Callable[[], bool]:
        """A check for :meth:`drive`: ``done`` items are done and a handler waits at the
        hold, so the run cannot finish before the test lifts it."""
        return lambda: self.store.status(run_id).counts["done"] >= done and self.held() >= 1

    def _respawn(self) -> None:
        """Restarts, as a supervisor would, each worker that quit without a fault asking."""
        for worker in self.workers:
            if not worker.alive and not worker.ended_on_purpose:
                code = worker.process.returncode
                worker.process = self._spawn(worker.clock, worker.log)
                self.note("respawn", f"worker {worker.index} had quit (exit {code})")

    # -- the network ----------------------------------------------------------------

    def _one_server(self, fault: str) -> None:
        """Refuses a fault of the proxy or of the one server when the state is on a cluster."""
        if self.redis_cluster is not None:
            raise RuntimeError(f"{fault} needs the proxy and one server: not on a Redis Cluster")

    def reset_connections(self) -> int:
        """Resets every worker connection now; returns how many there were."""
        self._one_server("reset")
        count = self.proxy.reset()
        self.note("reset", f"{count} connections")
        return count

    def delay(self, seconds: float, direction: str = "both") -> None:
        """Delays every byte between the workers and Redis by ``seconds`` (0: off)."""
        self._one_server("delay")
        self.proxy.delay(seconds, direction)
        self.note("delay", f"{seconds}s {direction}")

    def refuse(self, seconds: float) -> None:
        """Resets the workers' new connections for ``seconds``."""
        self._one_server("refuse")
        self.proxy.refuse(seconds)
        self.note("refuse", f"{seconds}s")

    def blackhole(self, seconds: float) -> None:
        """Holds the workers' new connections without relaying for ``seconds``."""
        self._one_server("blackhole")
        self.proxy.blackhole(seconds)
        self.note("blackhole", f"{seconds}s")

    # -- the server -----------------------------------------------------------------

    def stop_redis(self) -> None:
        """SIGSTOPs redis-server: every client waits; its clock runs on."""
        self._signal_redis(signal.SIGSTOP, "stop-redis")

    def cont_redis(self) -> None:
        """SIGCONTs redis-server."""
        self._signal_redis(signal.SIGCONT, "cont-redis")

    def _signal_redis(self, sig: int, kind: str) -> None:
        self._one_server(kind)
        assert self.server.process is not None
        os.kill(self.server.process.pid, sig)
        if sig == signal.SIGSTOP:  # every thread stopped before the fault's time starts
            pid = self.server.process.pid
            wait_for(lambda: threads_stopped(pid), 10, "redis-server to stop")
        self.note(kind)

    def long_script(self, seconds: float) -> threading.Thread:
        """Runs a read-only script that keeps redis-server busy for ``seconds`` (from a
        thread, which it returns): every other call waits, and once the server's
        ``busy-reply-threshold`` passed (5 s) is refused with BUSY until it ends."""
        self._one_server("long-script")
        client = redis.Redis.from_url(self.server.url, socket_timeout=seconds + 30)
        busy = threading.Thread(
            target=lambda: client.eval(LONG_SCRIPT, 0, int(seconds * 1000)), daemon=True
        )
        busy.start()
        self.note("long-script", f"{seconds}s")
        return busy

    def kill_redis(self) -> int:
        """SIGKILLs redis-server; returns the machine's clock (ms) just before."""
        self._one_server("kill-redis")
        at = int(time.time() * 1000)
        self.server.kill()
        self.note("kill-redis")
        return at

    def disk_image(self) -> tuple[Path, int]:
        """Copies the server's files as they are now (a power loss's disk); and the server ms.

        Every script the server ran before the returned time is in the copy.
        """
        self._one_server("disk-image")
        at = server_ms(self.store.client)
        image = self.directory / f"disk-{len(self.faults)}"
        shutil.copytree(self.directory / "redis", image, ignore=shutil.ignore_patterns("redis.log"))
        self.note("disk-image", f"at server ms {at}")
        return image, at

    def restart_redis(self, empty: bool = False, disk: Path | None = None) -> int:
        """Restarts redis-server on its port and directory; returns its clock (ms) after.

        ``empty``: its files are deleted first (a server that lost everything);
        ``disk``: its files are replaced by an image from :meth:`disk_image`.
        """
        self._one_server("restart-redis")
        self.server.kill()
        directory = self.directory / "redis"
        if empty or disk is not None:
            for path in directory.iterdir():
                if path.name != "redis.log":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
        if disk is not None:
            shutil.copytree(disk, directory, dirs_exist_ok=True)
        self.server.start()
        at = server_ms(self.store.client)
        how = "empty" if empty else f"from {disk.name}" if disk else "from its AOF"
        self.note("restart-redis", f"{how} at server ms {at}")
        return at

    def script_flush(self) -> None:
        """Makes the server (on a cluster: every primary) forget every loaded script."""
        if self.redis_cluster is None:
            self.store.client.script_flush()
        else:
            for port in self.redis_cluster.primaries():
                with _node(port) as node:
                    node.script_flush()
        self.note("script-flush")

    def squeeze(self, keys: int, policy: str = "allkeys-lru", samples: int = 5) -> None:
        """Sets an evicting ``policy`` and lowers maxmemory under the use, 2 KB at a time,
        until the server has evicted ``keys`` keys; then sets it 64 MB above the use, so
        that the workers started afterwards (16 handlers each, their connections and
        buffers) evict nothing more: the loss stays the one this fault made.

        ``samples``: keys the server samples per eviction (64: about exact LRU on a
        small database).
        """
        self._one_server("squeeze")
        client = self.store.client

        def evicted() -> int:
            return int(client.info("stats")["evicted_keys"])

        before, used = evicted(), int(client.info("memory")["used_memory"])
        client.config_set("maxmemory-samples", str(samples))
        client.config_set("maxmemory-policy", policy)
        while evicted() - before < keys:
            used -= 2000
            assert used > 0, f"fewer than {keys} keys to evict"
            client.config_set("maxmemory", str(used))  # evicts down to it at once
        client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) + 2**26))
        self.note("squeeze", f"{policy}: {evicted() - before} keys evicted")

    # -- hash slots (on a Redis Cluster) ------------------------------------------

    def _nodes(self) -> ClusterServers:
        if self.redis_cluster is None:
            raise RuntimeError("hash slots move on a Redis Cluster only (redis_cluster=True)")
        return self.redis_cluster

    def shard_slot(self, run_id: str, shard: int) -> int:
        """The hash slot of a shard's keys (its tag ``{<run_id>#<shard>}``)."""
        return int(key_slot(self.store.keys.shard(run_id, shard)[0].encode()))

    def begin_slot_move(self, slot: int, target: int | None = None, pick: int = 0) -> SlotMove:
        """Marks ``slot`` IMPORTING on ``target`` and MIGRATING on its owner; no key moves yet.

        ``target``: a primary's port; None: the other primaries' ``pick``-th (modulo).
        """
        nodes = self._nodes()
        if slot in self.slot_moves:
            raise RuntimeError(f"slot {slot} is moving already")
        source = nodes.slot_owner(slot)
        if target is None:
            others = [port for port in nodes.primaries() if port != source]
            target = others[pick % len(others)]
        nodes.begin_migration(slot, target)
        move = SlotMove(slot, source, target, time.monotonic() - self.started, _now_ms())
        self.slot_moves[slot] = move
        self.note("slot-move-begin", f"slot {slot} {source} -> {target}")
        return move

    def move_slot_keys(self, slot: int, count: int) -> int:
        """MIGRATEs up to ``count`` of a moving slot's keys still on its source; returns
        how many moved (the rest stay, so the slot stays half moved)."""
        move = self.slot_moves[slot]
        with _node(move.source) as source:
            keys = source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, count)
            if keys:
                source.execute_command("MIGRATE", HOST, move.target, "", 0, 5000, "KEYS", *keys)
        move.moved += len(keys)
        self.note("slot-move-keys", f"slot {slot}: {len(keys)} keys")
        return len(keys)

    def finish_slot_move(self, slot: int) -> SlotMove:
        """Moves the slot's remaining keys, assigns it to its target on every node and waits
        until they all agree."""
        move = self.slot_moves.pop(slot)
        nodes = self._nodes()
        move.moved += nodes.move_keys(slot, batch=100)
        nodes.finish_migration(slot, move.target)
        took = time.monotonic() - self.started - move.began
        move.ended_ms = _now_ms()
        self.slot_move_seconds.append(took)
        self.finished_moves.append(move)
        self.note(
            "slot-move-finish", f"slot {slot} on {move.target}: {move.moved} keys, {took:.2f}s"
        )
        return move

    def finish_slot_moves(self) -> None:
        """Finishes every slot move still under way (a test ending early heals with it)."""
        for slot in sorted(self.slot_moves):
            self.finish_slot_move(slot)

    # -- runs -----------------------------------------------------------------------

    def start_run(self) -> str:
        """Creates today's run of the job (server clock); the next tick plans it."""
        return effect_jobs.start_run(self.store, self.job)

    def planned(self, run_id: str) -> list[str]:
        """The item ids the planner makes for ``run_id``."""
        business_date = date.fromisoformat(run_id.rsplit(":", 1)[1])
        return [effect_jobs.item_id(n, business_date) for n in range(self.config.items)]

    def drive(
        self,
        run_id: str,
        timeout: float = 60.0,
        until: Callable[[], bool] | None = None,
        step: Callable[[], None] | None = None,
    ) -> str:
        """Ticks every 0.1 s until ``until()`` (default: the run is final); returns its state.

        A Redis that cannot be reached for a moment is ticked again; a worker
        that quit by itself is restarted.
        """
        runs = Runs(self.store)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.decisions += tick_job(
                    self.store, runs, effect_jobs.EFFECTS_PATH, self.job, runs.server_now()
                )
                state = runs.info(run_id)["state"]
            except (RedisLeaseError, redis.RedisError) as error:
                state = f"unknown ({type(error).__name__})"
            self._respawn()
            if step is not None:
                step()
            if until() if until is not None else state in FINAL_STATES:
                return state
            if time.monotonic() > deadline:
                with contextlib.suppress(RedisLeaseError):
                    state += f": {self.store.status(run_id).to_dict()}"
                raise AssertionError(
                    f"run {run_id} still {state} after {timeout}s\n{self.describe()}"
                )
            time.sleep(0.1)

    def beating_jobs(self) -> int:
        """Registered shard jobs alive by the registry's rule
        (redis_lease.fleet.transport.takeover)."""
        return sum(1 for entry in takeover.registered(self.store) if entry.beating)

    def assert_no_takeover(self, run_id: str, summary: Summary | None = None) -> None:
        """Nothing of ``run_id`` was taken over: no takeover logged or counted, no lease cut
        or re-claimed, no shard job counted failed, no worker saying it took over."""
        counters = self.store.status(run_id).counters
        seen = (
            takeover.takeovers(self.store),
            counters.get("takeovers"),
            counters.get("leases_cut"),
        )
        assert seen == ([], None, None), f"{seen}\n{self.describe()}"
        failed = Runs(self.store).info(run_id).get("failed_jobs")
        assert failed in (None, "0"), f"{failed} shard jobs failed\n{self.describe()}"
        for worker in self.workers:
            assert "took over" not in worker.log.read_text(errors="replace"), self.describe()
        if summary is not None:
            assert summary.takeovers == 0, summary

    def ops(self) -> list[Op]:
        """Every operation the workers recorded so far."""
        return read_ops(list(read_lines(self.history)))

    def verify(
        self, run_id: str, *, may_lose: bool = False, loss: tuple[int, int] | None = None
    ) -> Summary:
        """Collects the evidence of ``run_id`` and checks it (see tests.faults.checker)."""
        try:
            return check(self.evidence(run_id), loss=loss, may_lose=may_lose)
        except Violation as error:
            error.args = (f"{error.args[0]}\n{self.describe()}",)
            raise

    def evidence(self, run_id: str) -> Evidence:
        """What the checker reads about ``run_id``: histories, records, marks, payouts."""
        return collect(
            self.store,
            run_id,
            self.planned(run_id),
            history_dir=self.history,
            applied=dict(self.provider.state.applications),
            effects=("payout",),
            shards=self.config.shards,
        )

    def describe(self) -> str:
        """The faults injected and the tail of every worker's log (for failure messages)."""
        parts = ["faults: " + json.dumps(self.faults)]
        for worker in self.workers:
            text = worker.log.read_text(errors="replace") if worker.log.exists() else ""
            parts.append(f"--- worker {worker.index} (clock {worker.clock or 'real'})")
            parts.append(text[-3000:])
        return "\n".join(parts)

    # -- cleanup --------------------------------------------------------------------

    def kill_workers(self) -> None:
        """SIGKILL to every worker's process group; waits for each."""
        for worker in self.workers:
            worker.ended_on_purpose = True
            if worker.alive:
                os.killpg(worker.process.pid, signal.SIGKILL)
            worker.process.wait(timeout=10)

    def stop_provider(self) -> None:
        """Stops the provider (whether or not it was serving)."""
        if self._serving:
            self.provider.shutdown()
        self.provider.server_close()

    def close(self) -> None:
        """Kills every process, deletes the RQ keys, removes the server's files (safe always)."""
        self.kill_workers()
        process = self.server.process
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)  # a stopped server answers the cleanup
        if hasattr(self, "proxy"):
            self.proxy.close()
        self.stop_provider()
        if hasattr(self, "store"):
            with contextlib.suppress(redis.RedisError):  # a server down: its files go below
                effect_jobs.delete_rq_queue(self.store.rq, self.config.queue)
            self.store.close()
        self.server.kill()
        shutil.rmtree(self.directory / "redis", ignore_errors=True)
        if self.redis_cluster is not None:
            self.redis_cluster.kill()
            shutil.rmtree(self.directory / "cluster", ignore_errors=True)
