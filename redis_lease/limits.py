"""The protocol's bounds, defaults and run-state words, defined once in
``lua/include/limits.json``.

The same file is expanded into the Lua prelude (``LIMITS``), so a bound checked
here is the bound the scripts enforce: Python and Lua cannot drift apart.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any


def lua_dir() -> Path:
    """The folder of the scripts: inside the installed package, else the source tree."""
    # the package's own folder (what importlib.resources.files names for a package on
    # disk; that module takes milliseconds to import, at every start of the command line)
    packaged = Path(__file__).resolve().parent / "lua"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "lua"


@cache
def table() -> dict[str, Any]:
    """The parsed ``limits.json``: ``bounds`` (name -> [low, high]), ``defaults`` and
    ``run_states`` (``open``, ``final``: lists of words)."""
    data: dict[str, Any] = json.loads((lua_dir() / "include" / "limits.json").read_text())
    return data


def bound(name: str) -> tuple[int, int]:
    """The inclusive ``(low, high)`` bound called ``name``."""
    low, high = table()["bounds"][name]
    return low, high


def default(name: str) -> Any:
    """The default called ``name``."""
    return table()["defaults"][name]


TTL_MIN_MS, TTL_MAX_MS = bound("ttl_ms")
DELAY_MAX_MS = bound("delay_ms")[1]
ATTEMPTS_MAX = bound("attempts")[1]
BATCH_MAX = bound("batch")[1]
ADD_BATCH_MAX = bound("add_batch")[1]
SWEEP_MAX = bound("sweep")[1]
SHARD_COUNT_MAX = bound("shard_count")[1]
TOKEN_MAX = bound("token")[1]
TIME_MAX_MS = bound("time_ms")[1]
CAP_MAX = bound("cap")[1]
ID_MAX_LENGTH = bound("id_length")[1]
JSON_MAX_BYTES = bound("json_bytes")[1]
ERROR_MAX_BYTES = bound("error_bytes")[1]
TEXT_MAX_BYTES = bound("text_bytes")[1]
GUARD_SPECS_MAX = bound("guard_specs")[1]
JSON_MAX_DEPTH = bound("json_depth")[1]
CONCURRENCY_MAX = bound("concurrency")[1]
#: The bounds of a job's options (:class:`redis_lease.fleet.jobs.job.JobOptions`).
CATCH_UP_DAYS_MAX = bound("catch_up_days")[1]
WORKERS_PER_SHARD_MAX = bound("workers_per_shard")[1]
#: The most shard jobs working one run at once (the job option ``max_shard_jobs``).
MAX_SHARD_JOBS_MAX = bound("max_shard_jobs")[1]
RETENTION_DAYS_MAX = bound("retention_days")[1]
SPARE_NODES_MAX = bound("spare_nodes")[1]
WORKERS_PER_NODE_MAX = bound("workers_per_node")[1]
#: The longest worker or host name kept (the shard job registry, the takeover log, the tick
#: leader's lease), in UTF-8 bytes: longer names are cut.
WORKER_NAME_MAX = 200
#: Milliseconds in a day.
DAY_MS = 86_400_000
#: The longest last shard job error kept in a run's record, in UTF-8 bytes.
JOB_ERROR_MAX_BYTES = bound("job_error_bytes")[1]
#: The most business dates one backfill covers.
BACKFILL_DAYS_MAX = bound("backfill_days")[1]
#: The most rows one page of the command line or the dashboard shows.
PAGE_MAX = bound("page_size")[1]
#: The most jobs one page of the dashboard's RQ views shows.
RQ_PAGE_MAX = bound("rq_page_size")[1]
#: The most replicas a store may wait for after a claim, and the bounds of that wait (ms):
#: ``wait_replicas`` and ``wait_timeout_ms`` (docs/durability.md).
WAIT_REPLICAS_MAX = bound("wait_replicas")[1]
WAIT_TIMEOUT_MIN_MS, WAIT_TIMEOUT_MAX_MS = bound("wait_timeout_ms")

DEFAULT_PREFIX: str = default("prefix")
DEFAULT_TTL: float = default("lease_ttl_ms") / 1000
#: Seconds between a shard job's heartbeats (and a worker's).
HEARTBEAT: float = default("heartbeat_ms") / 1000
#: Milliseconds a heartbeat lives: a shard job silent this long is taken for dead, and
#: its leases are taken over (:mod:`redis_lease.fleet.transport.takeover`).
DEAD_AFTER_MS: int = default("dead_after_ms")
DEAD_AFTER: float = DEAD_AFTER_MS / 1000
#: Milliseconds between two calls of the shard job registry's scripts, by the server's
#: clock, beyond which the registry counts a stall (Redis stalled or failed over, or no
#: worker reached it): no job is judged dead until DEAD_AFTER after a stall ended.
STALL_GAP_MS: int = default("stall_gap_ms")
#: Milliseconds after which an unfinished takeover (its worker died) is taken again.
TAKEOVER_RETRY_MS: int = default("takeover_retry_ms")
DEFAULT_MAX_ATTEMPTS: int = default("max_attempts")
DEFAULT_BACKOFF_BASE: float = default("backoff_base_ms") / 1000
DEFAULT_BACKOFF_CAP: float = default("backoff_cap_ms") / 1000
DEFAULT_RETENTION_DAYS: int = default("retention_days")
DEFAULT_SWEEP: int = default("sweep")
ATTEMPT_LOG_CAP: int = default("attempt_log")
ERROR_HISTORY: int = default("error_history")
#: The newest final runs the metrics export (open runs always are).
METRICS_RUNS: int = default("metrics_runs")
#: Shard jobs failed in a row before the tick backs off dispatching to the run.
DISPATCH_FAILURE_STREAK: int = default("dispatch_failure_streak")
#: Seconds of the first dispatch back-off; each further failure doubles it, up to the cap.
DISPATCH_BACKOFF_BASE: float = default("dispatch_backoff_base_ms") / 1000
DISPATCH_BACKOFF_CAP: float = default("dispatch_backoff_cap_ms") / 1000
#: Samples of a run's oldest eligible age kept (XADD MAXLEN ~), and the least time between two.
AGE_SAMPLES: int = default("age_samples")
AGE_INTERVAL_MS: int = default("age_interval_ms")
#: Days a lost run's record is kept after it was noticed.
LOST_KEPT_DAYS: int = default("lost_kept_days")
#: The tick leader's lease (ms), how often its holder renews it (ms), and how often the
#: leader ticks its jobs (seconds): ``redis-lease worker --job`` (docs/concepts/tick-leader.md).
TICK_LEADER_TTL_MS: int = default("tick_leader_ttl_ms")
TICK_LEADER_RENEW_MS: int = default("tick_leader_renew_ms")
TICK_EVERY: float = default("tick_every_ms") / 1000
#: Seconds within which another worker ticks once the leader died or stopped: the lease runs
#: out at most its TTL after the leader's last renewal, and every worker tries every renewal.
TICK_TAKEOVER_BOUND: float = (TICK_LEADER_TTL_MS + TICK_LEADER_RENEW_MS) / 1000
#: How long a worker's declaration of its jobs counts after its last renewal (ms): the leader
#: ticks, or names, the jobs of the declarations renewed within it.
TICK_DECLARED_MS: int = default("tick_declared_ms")
#: Entries kept in a run's decision log (a stream, XADD MAXLEN ~).
RUN_LOG_CAP: int = default("run_log")
#: Takeovers kept in the list of the latest ones.
TAKEOVER_LOG_CAP: int = default("takeover_log")
#: Rows of a page of the command line and the dashboard when none is asked for.
PAGE_SIZE: int = default("page_size")
#: Attempts of an item the command line shows when no number is asked for.
ATTEMPTS_PAGE_SIZE: int = default("attempts_page_size")
#: Jobs of a page of the dashboard's RQ views when none is asked for.
RQ_PAGE_SIZE: int = default("rq_page_size")
#: The dashboard's new deadline on resume, in hours from now, when the run's has passed.
RESUME_HOURS: int = default("resume_hours")
#: The latest new deadline the dashboard's resume takes, in hours from now.
RESUME_HOURS_MAX: int = default("resume_hours_max")
#: How long a store that waits for replicas waits for them after a claim, unless told (ms).
DEFAULT_WAIT_TIMEOUT_MS: int = default("wait_timeout_ms")

#: The highest retry rate a capacity plan accepts: above it an item costs 100+ attempts
#: (:mod:`redis_lease.fleet.capacity.model` checks it; ``plan-capacity --retry-rate`` states it).
MAX_RETRY_RATE = 0.99

#: The states a run is stored in (its record's ``state``, the scripts' words): the open
#: ones, still worked, then the final ones. The rules over them are in
#: :mod:`redis_lease.fleet.runs.run_states`.
OPEN_RUN_STATES: tuple[str, ...] = tuple(table()["run_states"]["open"])
FINAL_RUN_STATES: tuple[str, ...] = tuple(table()["run_states"]["final"])
PLANNING, RUNNING = OPEN_RUN_STATES
SUCCEEDED, PARTIAL, FAILED, CANCELED = FINAL_RUN_STATES

#: The environment variable that allows URL parameters turning TLS verification off
#: (read by :mod:`redis_lease.protocol.connection.tls`; named here, where the command
#: line reads it without importing Redis's client).
INSECURE_ENV = "REDIS_LEASE_TLS_INSECURE"
