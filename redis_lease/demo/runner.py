"""The demo run: today's payment reconciliation on real RQ worker processes, with faults.

While the workers work, one is paused (SIGSTOP) past its lease and resumed, and
one is killed (SIGKILL). The report shows that nothing was lost or applied
twice, and how many late writes of the paused worker were refused (often none: its
leases ran out by its own clock too, so it stops before sending them).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..fleet.effects.provider_gate import ProviderGate
from ..fleet.runs.lifecycle import Runs
from ..fleet.runs.run_states import FINAL_STATES, RUNNING
from ..fleet.tick.scheduler_tick import tick
from ..fleet.transport.shard_jobs import purge_queue
from ..protocol.connection.clients import as_text
from ..protocol.keys import Keys
from ..protocol.store.lease_store import LeaseStore
from .backend import demo_backend
from .provider import ProviderClient, ProviderServer, ProviderState

JOB_PATH = "redis_lease.demo.payments:reconcile"
WORKER_COMMAND = (sys.executable, "-m", "redis_lease")
TICK_INTERVAL = 0.25
#: The run's deadline: a fixed allowance (start-up, the pause past a lease) plus a budget
#: per item, about four times what an idle 2-core machine needs, so that a loaded one
#: still finishes. One Python thread serves the embedded backend: its budget is larger.
DEADLINE_BASE_SECONDS = 30.0
SECONDS_PER_ITEM = {"redis": 0.02, "embedded": 0.05}


def demo_deadline(items: int, embedded: bool) -> str:
    """The run's deadline as a duration, scaled to the items and the backend."""
    per_item = SECONDS_PER_ITEM["embedded" if embedded else "redis"]
    return f"{round(DEADLINE_BASE_SECONDS + items * per_item)}s"


@dataclass
class DemoConfig:
    """How big the demo is and where it runs."""

    url: str | None = None
    #: RQ's Redis when it is not ``url``'s (required when ``url`` is a cluster).
    queue_url: str | None = None
    backend: str = "auto"
    items: int = 2000
    shards: int = 8
    workers: int = 4
    lease_ttl: float = 2.0
    latency: float = 0.01
    #: None: scaled to the items and the backend (:func:`demo_deadline`).
    deadline: str | None = None
    faults: bool = True
    keep: bool = False
    honour_keys: bool = True
    provider_cap: int = 16
    provider_max_in_flight: int = 0


@dataclass
class Fleet:
    """The worker processes, each in its own process group."""

    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)

    def signal(self, index: int, sig: int) -> None:
        """Sends ``sig`` to worker ``index``'s whole process group."""
        process = self.processes[index]
        if process.poll() is None:
            os.killpg(process.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        """Warm shutdown (SIGTERM) of every worker; SIGKILL for any left after ``timeout``."""
        for index in range(len(self.processes)):
            self.signal(index, signal.SIGCONT)
            self.signal(index, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for index, process in enumerate(self.processes):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.signal(index, signal.SIGKILL)
                process.wait(timeout=5)
        for log in self.logs:
            log.close()


def _environment(
    config: DemoConfig, queue: str, provider_url: str, deadline: str
) -> dict[str, str]:
    return {
        "REDIS_LEASE_DEMO_PROVIDER": provider_url,
        "REDIS_LEASE_DEMO_PROVIDER_CAP": str(config.provider_cap),
        "REDIS_LEASE_DEMO_HONOURS_KEYS": "1" if config.honour_keys else "0",
        "REDIS_LEASE_DEMO_ITEMS": str(config.items),
        "REDIS_LEASE_DEMO_SHARDS": str(config.shards),
        "REDIS_LEASE_DEMO_TTL": str(config.lease_ttl),
        "REDIS_LEASE_DEMO_DEADLINE": deadline,
        "REDIS_LEASE_DEMO_QUEUE": queue,
    }


def start_workers(
    url: str,
    queue: str,
    count: int,
    env: dict[str, str],
    logs: Path,
    queue_url: str | None = None,
    prefix: str | None = None,
) -> Fleet:
    """Starts ``count`` ``redis-lease worker`` processes on ``queue`` (on ``queue_url``'s
    Redis when given), watching the runs under ``prefix`` for stopped shard jobs."""
    fleet = Fleet()
    urls = ["--url", url, *(["--queue-url", queue_url] if queue_url else [])]
    urls += ["--prefix", prefix] if prefix else []
    for n in range(count):
        log = (logs / f"worker-{n}.log").open("wb")
        fleet.logs.append(log)
        fleet.processes.append(
            subprocess.Popen(
                # --simple: the shard job runs in the worker process, so a signal to the
                # worker reaches the job (a forking worker's work horse has its own session).
                [*WORKER_COMMAND, *urls, "worker", "--simple", "--queue", queue],
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    return fleet


def lease_holders(store: LeaseStore, run_id: str, fleet: Fleet) -> list[int]:
    """Indexes of the workers that hold a lease on the run now (owners are host:pid:job)."""
    pids = {process.pid: n for n, process in enumerate(fleet.processes)}
    holders: set[int] = set()
    for shard in range(store.shard_count(run_id)):
        leased: list[Any] = list(store.client.zrange(store.keys.shard(run_id, shard)[4], 0, -1))
        for item_id in leased:
            owner = store.item(run_id, as_text(item_id)).owner or ""
            parts = owner.split(":")
            if len(parts) >= 2 and parts[-2].isdigit() and int(parts[-2]) in pids:
                holders.add(pids[int(parts[-2])])
    return sorted(holders)


@dataclass
class FaultPlan:
    """Pause a lease-holding worker past its lease, then resume it; kill another."""

    lease_ttl: float
    paused: int | None = None
    paused_at: float = 0.0
    takeovers_at_pause: int = 0
    resumed: bool = False
    killed: bool = False

    def step(self, store: LeaseStore, run_id: str, fleet: Fleet, progress: float) -> None:
        """Injects the next fault when its moment has come."""
        now = time.monotonic()
        takeovers = store.status(run_id).counters.get("takeovers", 0)
        if self.paused is None and progress >= 0.15:
            holders = lease_holders(store, run_id, fleet)
            if holders:
                self.paused, self.paused_at = holders[0], now
                self.takeovers_at_pause = takeovers
                fleet.signal(self.paused, signal.SIGSTOP)
                fleet.events.append(f"paused worker {self.paused} (SIGSTOP) at {progress:.0%}")
        elif self.paused is not None and not self.resumed:
            # Resume once the lease has expired and another worker took an item over.
            waited = now - self.paused_at
            taken = takeovers > self.takeovers_at_pause
            if (taken and waited > 1.5 * self.lease_ttl) or waited > 5 * self.lease_ttl:
                fleet.signal(self.paused, signal.SIGCONT)
                self.resumed = True
                fleet.events.append(f"resumed worker {self.paused} (SIGCONT) after {waited:.1f}s")
        if not self.killed and progress >= 0.4:
            holders = [n for n in lease_holders(store, run_id, fleet) if n != self.paused]
            if holders:
                fleet.signal(holders[0], signal.SIGKILL)
                self.killed = True
                fleet.events.append(f"killed worker {holders[0]} (SIGKILL) at {progress:.0%}")


def run_demo(
    config: DemoConfig,
    on_progress: Callable[[int, int], None] | None = None,
    on_backend: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Runs the demo end to end and returns its report."""
    prefix = f"demo-{uuid.uuid4().hex[:8]}"
    queue = f"{prefix}-shards"
    provider = ProviderServer(
        state=ProviderState(
            latency=config.latency,
            hold_seconds=2.0,
            honour_keys=config.honour_keys,
            max_in_flight=config.provider_max_in_flight,
        )
    )
    if config.faults:
        # The provider accepts a few requests and then times out, and loses a few responses.
        provider.state.faults.update(timeout_after_accept=3, lose_response=3)
    started = time.monotonic()
    with (
        demo_backend(config.url, config.backend) as backend,
        tempfile.TemporaryDirectory() as logs,
        provider.start(),
    ):
        if on_backend:
            on_backend(backend.description)
        deadline = config.deadline or demo_deadline(config.items, backend.embedded)
        env = _environment(config, queue, provider.url, deadline)
        os.environ.update(env)
        job = importlib.reload(importlib.import_module("redis_lease.demo.payments")).reconcile
        store = LeaseStore.from_url(backend.url, prefix=prefix, queue_url=config.queue_url)
        runs = Runs(store)
        run_id, _ = runs.ensure(job, runs.server_now().date(), runs.server_now())
        fleet = start_workers(
            backend.url,
            queue,
            config.workers,
            env,
            Path(logs),
            queue_url=config.queue_url,
            prefix=prefix,
        )
        try:
            state = _drive(
                store,
                runs,
                run_id,
                fleet,
                FaultPlan(config.lease_ttl) if config.faults else None,
                on_progress,
            )
        finally:
            fleet.stop()
        status = store.status(run_id)
        info = runs.info(run_id)
        # The figures the run was judged on (its reason line), recorded when it ended.
        final = json.loads(info.get("final_counts") or "{}") or status.counts
        report = {
            "run_id": run_id,
            "state": state,
            "items": int(final.get("planned", status.planned)),
            "done": int(final["done"]),
            "dead": int(final["dead"]),
            "unfinished": int(final["pending"]) + int(final["leased"]),
            # Commits accepted after the run ended (leases granted before its deadline).
            "done_after_end": status.counts["done"] - int(final["done"]),
            **_provider_figures(ProviderClient(provider.url)),
            # Results a holder that lost its lease tried to record: commits and effect records.
            "stale_commits_refused": status.counters.get("stale_commits", 0)
            + status.counters.get("stale_effects", 0),
            "lease_takeovers": status.counters.get("takeovers", 0),
            "retries": status.counters.get("retries", 0),
            "effects_reconciled": status.counters.get("effects_reconciled", 0),
            "provider_cap": _gate_figures(store),
            "duration_seconds": round(time.monotonic() - started, 2),
            "workers": config.workers,
            "backend": backend.description,
            "faults": fleet.events,
            "deadline": deadline,
            "reason": info.get("reason", ""),
        }
        if not backend.owned and not config.keep:
            _delete_prefix(store, prefix)
            purge_queue(store.rq, queue)
        store.close()
        return report


def _drive(
    store: LeaseStore,
    runs: Runs,
    run_id: str,
    fleet: Fleet,
    faults: FaultPlan | None,
    on_progress: Callable[[int, int], None] | None,
) -> str:
    """Ticks until the run is final, injecting faults on the way; returns the final state."""
    while True:
        tick(store, [JOB_PATH])
        info = runs.info(run_id)
        status = store.status(run_id)
        total = max(status.total, 1)
        if on_progress:
            on_progress(status.counts["done"] + status.counts["dead"], status.total)
        if info["state"] in FINAL_STATES:
            return info["state"]
        if faults is not None and info["state"] == RUNNING:
            faults.step(store, run_id, fleet, status.counts["done"] / total)
        time.sleep(TICK_INTERVAL)


def _gate_figures(store: LeaseStore) -> dict[str, int]:
    state = ProviderGate(store, "payments-provider", max_concurrency=1).state()
    return {
        "cap": state.cap,
        "max_cap": state.max_cap,
        "throttles": state.throttles,
        "peak_granted_in_flight": state.counters.get("peak_in_use", 0),
    }


def _provider_figures(client: ProviderClient) -> dict[str, int]:
    stats = client.stats()
    return {
        "effects_applied": stats["applications"],
        "duplicate_effects": stats["duplicate_effects"],
        "provider_requests": stats["requests"],
        "provider_throttled": stats["throttled"],
        "provider_peak_in_flight": stats["peak_in_flight"],
    }


def _delete_prefix(store: LeaseStore, prefix: str) -> None:
    keys = list(store.client.scan_iter(match=Keys(prefix).everything, count=1000))
    for start in range(0, len(keys), 500):
        store.client.delete(*keys[start : start + 500])
