"""The exporter's series that are not a run's: by job (workers needed, runs finished,
missed runs, lost runs, declared jobs no tick leader ticks), the tick leader, the data set's
losses, the server's eviction policy and the provider gates.

See :mod:`redis_lease.operate.metrics.collector` for the whole list;
:class:`~redis_lease.LeaseCollector` yields these beside the run series.
"""

from __future__ import annotations

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ...fleet.effects.provider_gate import ProviderGate
from ...fleet.loss.data_set_mark import LOSS_KINDS, read_mark
from ...fleet.runs import job_tallies
from ...fleet.runs.run_states import RUNNING
from ...fleet.tick.schedule import job_names
from ...protocol.connection.clients import as_text
from ...protocol.store.declared_jobs import declared_jobs
from ...protocol.store.lease_store import LeaseStore

#: The gauge an autoscaler scales on: workers needed by job, summed over its running runs.
WORKERS_NEEDED = "redis_lease_workers_needed"
WORKERS_NEEDED_UNKNOWN = "redis_lease_workers_needed_unknown_runs"
RUNS_FINISHED = "redis_lease_runs_finished"
MISSED_RUNS = "redis_lease_missed_runs"
LOST_RUNS = "redis_lease_lost_runs"
DATA_SET_LOSSES = "redis_lease_data_set_losses"
EVICTION_DANGER = "redis_lease_redis_eviction_danger"
MEMORY_USED = "redis_lease_redis_memory_used_bytes"
MEMORY_MAX = "redis_lease_redis_memory_max_bytes"
DECLARED_JOB_UNTICKED = "redis_lease_declared_job_unticked"
TICK_LEADER_TOKEN = "redis_lease_tick_leader_token"
TICK_LEADER_SINCE = "redis_lease_tick_leader_since_seconds"


def needs(store: LeaseStore, jobs: list[str]) -> list[Metric]:
    """Workers needed by job: the sum over its running runs whose need is known.

    A job with no running run needs 0. A job whose running runs are all
    unknown has no ``workers_needed`` series: nothing is invented.
    """
    needed = GaugeMetricFamily(
        WORKERS_NEEDED,
        "Workers that finish the job's running runs before their deadlines, spares included.",
        labels=["job"],
    )
    unknown = GaugeMetricFamily(
        WORKERS_NEEDED_UNKNOWN,
        "Running runs of the job whose need is unknown (no worker pass recorded yet).",
        labels=["job"],
    )
    keys = store.keys
    with store.translating_errors():
        for job in jobs:
            runs = sorted(as_text(r) for r in store.client.smembers(keys.job_open_runs(job)))
            pipe = store.client.pipeline(transaction=False)
            for run_id in runs:
                pipe.hmget(keys.run(run_id), ["state", "workers_needed"])
            total, missing, known = 0, 0, False
            for state, value in pipe.execute() if runs else []:
                if state is None or as_text(state) != RUNNING:
                    continue
                text = as_text(value) if value is not None else ""
                if text.isdigit():
                    total, known = total + int(text), True
                else:
                    missing += 1
            if known or not missing:
                needed.add_metric([job], total)
            unknown.add_metric([job], missing)
    return [needed, unknown]


def tallies(store: LeaseStore, jobs: list[str]) -> list[Metric]:
    """Runs finished by job and final state, missed scheduled runs and lost runs by job
    (kept in Redis, :mod:`redis_lease.fleet.runs.job_tallies`): every job, and ad-hoc runs (job ""),
    has every series from 0, so ``increase()`` sees the first end or loss."""
    finished = CounterMetricFamily(
        RUNS_FINISHED,
        "Ends of runs, by job and final state (job '' for ad-hoc runs): each time a run "
        "becomes final, once per end; a run resumed and ended again counts again.",
        labels=["job", "state"],
    )
    missed = CounterMetricFamily(
        MISSED_RUNS,
        "Scheduled runs never created: dates the tick's catch-up policy skipped, and dates "
        "older than the catch-up window that no tick handled (at most 366 a tick).",
        labels=["job"],
    )
    lost = CounterMetricFamily(
        LOST_RUNS,
        "Runs whose record vanished before its time (eviction, deletion, a server restarted "
        "empty or from an older copy), by job (job '' for ad-hoc runs): each loss once; the "
        "tick makes again those the job's schedule and catch-up policy cover.",
        labels=["job"],
    )
    for job, counts in job_tallies.read(store, [*jobs, ""]).items():
        for state, value in counts.finished.items():
            finished.add_metric([job, state], value)
        if job:
            missed.add_metric([job], counts.missed)
        lost.add_metric([job], counts.lost)
    return [finished, missed, lost]


def data_set_losses(store: LeaseStore) -> Metric:
    """Losses of the data set the ticks noticed, by kind
    (:mod:`redis_lease.fleet.loss.data_set_mark`): every kind from 0. Kept in the data set's mark,
    so a wipe starts them over (a counter reset, which ``increase()`` reads as such) with the wipe
    itself counted."""
    counter = CounterMetricFamily(
        DATA_SET_LOSSES,
        "Losses of the Redis data set noticed by the tick: replaced (restarted empty, flushed, "
        "another server's data), rolled_back (an older snapshot, a failover that missed the "
        "last writes), mark_lost (keys dropped: eviction or deletion).",
        labels=["kind"],
    )
    mark = read_mark(store)
    for kind in LOSS_KINDS:
        counter.add_metric([kind], mark.losses.get(kind, 0) if mark else 0)
    return counter


def eviction(store: LeaseStore) -> Metric:
    """1 when the server's ``maxmemory-policy`` may evict keys (anything but noeviction),
    with the policy as a label; ``unknown`` and 0 when CONFIG is refused (see
    :func:`redis_lease.protocol.connection.server_checks.eviction_danger`)."""
    gauge = GaugeMetricFamily(
        EVICTION_DANGER,
        "1 when Redis may evict keys (maxmemory-policy other than noeviction): items would "
        "be lost; see docs/durability.md.",
        labels=["policy"],
    )
    try:
        reply = store.client.config_get("maxmemory-policy")
        policy = as_text(reply.get("maxmemory-policy", "")) or "unknown"
    except redis.ResponseError:  # CONFIG disabled (managed Redis): nothing to tell
        policy = "unknown"
    gauge.add_metric([policy], 0 if policy in ("noeviction", "unknown") else 1)
    return gauge


def memory(store: LeaseStore) -> list[Metric]:
    """Redis's used memory and its ``maxmemory`` (0: no limit), in bytes, from ``INFO
    memory``: at the limit, under noeviction, Redis refuses writes (docs/durability.md).
    No sample when INFO is refused (an ACL, a managed Redis that hides it)."""
    used = GaugeMetricFamily(
        MEMORY_USED,
        "Memory Redis uses (INFO used_memory); at redis_lease_redis_memory_max_bytes it "
        "refuses writes under noeviction.",
    )
    most = GaugeMetricFamily(
        MEMORY_MAX,
        "Redis's maxmemory (INFO maxmemory): the memory past which it refuses writes under "
        "noeviction; 0 when it has no limit.",
    )
    try:
        info = store.client.info("memory")
    except redis.ResponseError:
        return [used, most]
    if "used_memory" in info:
        used.add_metric([], float(info["used_memory"]))
        most.add_metric([], float(info.get("maxmemory", 0)))
    return [used, most]


def providers(store: LeaseStore) -> list[Metric]:
    """Each provider gate's cap, slots in use and throttle answers."""
    cap = GaugeMetricFamily("redis_lease_provider_cap", "Current cap.", labels=["provider"])
    used = GaugeMetricFamily(
        "redis_lease_provider_slots_in_use", "Slots held now.", labels=["provider"]
    )
    throttles = CounterMetricFamily(
        "redis_lease_provider_throttles", "Throttle answers seen.", labels=["provider"]
    )
    for key in store.client.scan_iter(match=store.keys.providers_pattern, count=500):
        name = as_text(key).split("{", 1)[1].split("}")[0]
        state = ProviderGate(store, name, max_concurrency=1).state()
        cap.add_metric([name], state.cap)
        used.add_metric([name], state.in_use)
        throttles.add_metric([name], state.throttles)
    return [cap, used, throttles]


__all__ = [
    "DATA_SET_LOSSES",
    "EVICTION_DANGER",
    "LOST_RUNS",
    "MEMORY_MAX",
    "MEMORY_USED",
    "MISSED_RUNS",
    "RUNS_FINISHED",
    "TICK_LEADER_SINCE",
    "TICK_LEADER_TOKEN",
    "WORKERS_NEEDED",
    "WORKERS_NEEDED_UNKNOWN",
    "data_set_losses",
    "eviction",
    "job_names",
    "memory",
    "needs",
    "providers",
    "tallies",
]


def unticked(store: LeaseStore) -> list[Metric]:
    """Each job a live worker declared (``redis-lease worker --job``): 1 while no tick leader
    ticks it, 0 while the leader does (:mod:`redis_lease.protocol.store.declared_jobs`); and
    the tick leader, named: its token and since when it leads (no series while none leads)."""
    fleet = declared_jobs(store)
    token = GaugeMetricFamily(
        TICK_LEADER_TOKEN,
        "The fencing token of the tick leader's lease, labelled with the worker that holds "
        "it; no series while no worker holds it. The token grows each time a worker takes "
        "the lead anew.",
        labels=["worker"],
    )
    since = GaugeMetricFamily(
        TICK_LEADER_SINCE,
        "When the tick leader took its lease (Unix time, Redis's clock), labelled with the "
        "worker that holds it; no series while no worker holds it.",
        labels=["worker"],
    )
    if fleet.leader:
        token.add_metric([fleet.leader], fleet.token)
        if fleet.since_ms:
            since.add_metric([fleet.leader], fleet.since_ms / 1000)
    family = GaugeMetricFamily(
        DECLARED_JOB_UNTICKED,
        "1 for a job a live worker declared (redis-lease worker --job) that no tick leader "
        "ticks: the leader does not find it in the code it loaded, or no worker leads; 0 "
        "while the leader ticks it. redis-lease workers says why.",
        labels=["job"],
    )
    for name, job in sorted(fleet.jobs.items()):
        family.add_metric([name], 0 if job.ticked else 1)
    return [family, token, since]
