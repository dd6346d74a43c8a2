"""redis-lease: recoverable batch runs on Redis with fenced leases.

Every public name is importable from here, wherever it lives; its module is imported on
first use (:data:`_LAZY`), so that ``import redis_lease`` (the first step of every
command line start) loads only what the program uses: not Redis's client for
``redis-lease --help``, not RQ or Prometheus's client for a view.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .version import __version__ as __version__

if TYPE_CHECKING:
    from .errors import (
        ClusterBusy,
        ConditionFailed,
        EffectFailed,
        EffectUnknown,
        HandlerError,
        InvalidInput,
        LeaseError,
        LeaseLost,
        MissingExtra,
        NeedsReconciliation,
        NotClaimable,
        NotFound,
        NotReplicated,
        PermanentError,
        PermissionDenied,
        PlanningDeferred,
        ProtocolMismatch,
        ProviderError,
        RedisFull,
        RedisLeaseError,
        RedisUnavailable,
        RunClosed,
        SlotTimeout,
        Throttled,
        TLSFailed,
    )
    from .fleet.capacity import CapacityPlan
    from .fleet.capacity_ask import CapacityAsk
    from .fleet.data_set import Loss, MarkState, Observation
    from .fleet.effects import not_sent, resolve_effect
    from .fleet.gate import ProviderGate
    from .fleet.job import Job
    from .fleet.job_options import JobOptions
    from .fleet.job_tallies import Tallies
    from .fleet.live_lease import ActiveLease
    from .fleet.lost_records import LostRun
    from .fleet.remembered import Remembered
    from .fleet.run_capacity import Measured, RunNeed
    from .fleet.runs import Decision, Runs
    from .fleet.shard_job_failures import JobFailures
    from .fleet.shard_jobs import JsonJob, JsonQueue, json_cron_jobs, purge_queue
    from .fleet.tick.scheduler_tick import TickResult
    from .fleet.worker.bad_jobs import BadJob, BadJobGuard
    from .fleet.worker.lease_keeper import LeaseKeeper
    from .fleet.worker.rq_worker import LeaseWorker, SimpleLeaseWorker
    from .fleet.worker.settlements import HandlerResult, ShardReport
    from .fleet.worker.shard_job import process_shard
    from .fleet.worker.watch import FleetWatch
    from .limits import lua_dir
    from .operate.metrics.collector import LeaseCollector
    from .operate.metrics.history import AttemptHistograms, LogStream
    from .protocol.connection.cluster import FollowingPool
    from .protocol.connection.server_checks import EvictionPolicyWarning
    from .protocol.connection.tls import InsecureTLSWarning
    from .protocol.guards import FieldEquals, KeyExists, KeyMissing, Write
    from .protocol.scripts import Call, Command, Observer, Scripts, observe, source
    from .protocol.store.lease_store import LeaseStore
    from .protocol.store.stamp import check_protocol
    from .protocol.values import (
        Attempt,
        CommitReply,
        CommitRequest,
        FailReply,
        FailRequest,
        Item,
        ItemError,
        ItemRecord,
        Lease,
        ReleaseRequest,
        RunStatus,
    )
    from .runner import run_worker
    from .tick import tick_entry

__all__ = [
    "ActiveLease",
    "Attempt",
    "AttemptHistograms",
    "BadJob",
    "BadJobGuard",
    "Call",
    "CapacityAsk",
    "CapacityPlan",
    "ClusterBusy",
    "Command",
    "CommitReply",
    "CommitRequest",
    "ConditionFailed",
    "Decision",
    "EffectFailed",
    "EffectUnknown",
    "EvictionPolicyWarning",
    "FailReply",
    "FailRequest",
    "FieldEquals",
    "FleetWatch",
    "FollowingPool",
    "HandlerError",
    "HandlerResult",
    "InsecureTLSWarning",
    "InvalidInput",
    "Item",
    "ItemError",
    "ItemRecord",
    "Job",
    "JobFailures",
    "JobOptions",
    "JsonJob",
    "JsonQueue",
    "KeyExists",
    "KeyMissing",
    "Lease",
    "LeaseCollector",
    "LeaseError",
    "LeaseKeeper",
    "LeaseLost",
    "LeaseStore",
    "LeaseWorker",
    "LogStream",
    "Loss",
    "LostRun",
    "MarkState",
    "Measured",
    "MissingExtra",
    "NeedsReconciliation",
    "NotClaimable",
    "NotFound",
    "NotReplicated",
    "Observation",
    "Observer",
    "PermanentError",
    "PermissionDenied",
    "PlanningDeferred",
    "ProtocolMismatch",
    "ProviderError",
    "ProviderGate",
    "RedisFull",
    "RedisLeaseError",
    "RedisUnavailable",
    "ReleaseRequest",
    "Remembered",
    "RunClosed",
    "RunNeed",
    "RunStatus",
    "Runs",
    "Scripts",
    "ShardReport",
    "SimpleLeaseWorker",
    "SlotTimeout",
    "TLSFailed",
    "Tallies",
    "Throttled",
    "TickResult",
    "Write",
    "check_protocol",
    "json_cron_jobs",
    "lua_dir",
    "not_sent",
    "observe",
    "process_shard",
    "purge_queue",
    "resolve_effect",
    "run_worker",
    "source",
    "tick_entry",
]

#: Every public name and the module it is imported from, on first use.
_LAZY = {
    "ActiveLease": "fleet.live_lease",
    "Attempt": "protocol.values",
    "Call": "protocol.scripts",
    "CapacityAsk": "fleet.capacity_ask",
    "CapacityPlan": "fleet.capacity",
    "ClusterBusy": "errors",
    "Command": "protocol.scripts",
    "CommitReply": "protocol.values",
    "CommitRequest": "protocol.values",
    "ConditionFailed": "errors",
    "Decision": "fleet.runs",
    "EffectFailed": "errors",
    "EffectUnknown": "errors",
    "EvictionPolicyWarning": "protocol.connection.server_checks",
    "FailReply": "protocol.values",
    "FailRequest": "protocol.values",
    "FieldEquals": "protocol.guards",
    "FollowingPool": "protocol.connection.cluster",
    "HandlerError": "errors",
    "HandlerResult": "fleet.worker.settlements",
    "InsecureTLSWarning": "protocol.connection.tls",
    "InvalidInput": "errors",
    "Item": "protocol.values",
    "ItemError": "protocol.values",
    "ItemRecord": "protocol.values",
    "Job": "fleet.job",
    "JobOptions": "fleet.job_options",
    "JobFailures": "fleet.shard_job_failures",
    "KeyExists": "protocol.guards",
    "KeyMissing": "protocol.guards",
    "Lease": "protocol.values",
    "LeaseError": "errors",
    "LeaseKeeper": "fleet.worker.lease_keeper",
    "LeaseLost": "errors",
    "LeaseStore": "protocol.store.lease_store",
    "Measured": "fleet.run_capacity",
    "MissingExtra": "errors",
    "NeedsReconciliation": "errors",
    "NotClaimable": "errors",
    "NotFound": "errors",
    "NotReplicated": "errors",
    "Observer": "protocol.scripts",
    "PermanentError": "errors",
    "PermissionDenied": "errors",
    "PlanningDeferred": "errors",
    "ProtocolMismatch": "errors",
    "ProviderError": "errors",
    "ProviderGate": "fleet.gate",
    "RedisLeaseError": "errors",
    "RedisFull": "errors",
    "RedisUnavailable": "errors",
    "ReleaseRequest": "protocol.values",
    "RunClosed": "errors",
    "RunNeed": "fleet.run_capacity",
    "RunStatus": "protocol.values",
    "Runs": "fleet.runs",
    "Scripts": "protocol.scripts",
    "ShardReport": "fleet.worker.settlements",
    "SlotTimeout": "errors",
    "TLSFailed": "errors",
    "Tallies": "fleet.job_tallies",
    "Throttled": "errors",
    "Write": "protocol.guards",
    "check_protocol": "protocol.store.stamp",
    "lua_dir": "limits",
    "not_sent": "fleet.effects",
    "observe": "protocol.scripts",
    "resolve_effect": "fleet.effects",
    "source": "protocol.scripts",
    "AttemptHistograms": "operate.metrics.history",
    "BadJob": "fleet.worker.bad_jobs",
    "BadJobGuard": "fleet.worker.bad_jobs",
    "FleetWatch": "fleet.worker.watch",
    "JsonJob": "fleet.shard_jobs",
    "JsonQueue": "fleet.shard_jobs",
    "LeaseWorker": "fleet.worker.rq_worker",
    "Loss": "fleet.data_set",
    "LostRun": "fleet.lost_records",
    "MarkState": "fleet.data_set",
    "Observation": "fleet.data_set",
    "Remembered": "fleet.remembered",
    "SimpleLeaseWorker": "fleet.worker.rq_worker",
    "json_cron_jobs": "fleet.shard_jobs",
    "LeaseCollector": "operate.metrics.collector",
    "LogStream": "operate.metrics.history",
    "process_shard": "fleet.worker.shard_job",
    "purge_queue": "fleet.shard_jobs",
    "TickResult": "fleet.tick.scheduler_tick",
    "tick_entry": "tick",
    "run_worker": "runner",
}


def __getattr__(name: str) -> Any:
    """The names of :data:`_LAZY`, imported now."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
