"""redis-lease: recoverable batch runs on Redis with fenced leases.

Every public name is importable from here, wherever it lives. The few whose modules
need RQ or Prometheus's client (:data:`_LAZY`) import their module on first use, so that
``import redis_lease`` stays light.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .capacity import CapacityPlan, Measured, RunNeed
from .cluster import FollowingPool
from .deprecation import renamed_attribute
from .effects import not_sent, resolve_effect
from .errors import (
    ClusterBusy,
    ConditionFailed,
    EffectFailed,
    EffectUnknown,
    HandlerError,
    InvalidInput,
    LeaseError,
    LeaseLost,
    NeedsReconciliation,
    NotClaimable,
    NotFound,
    PermanentError,
    PermissionDenied,
    ProtocolMismatch,
    ProviderError,
    RedisLeaseError,
    RedisUnavailable,
    RunClosed,
    SlotTimeout,
    Throttled,
    TLSFailed,
)
from .gate import ProviderGate
from .guards import FieldEquals, KeyExists, KeyMissing, Write
from .job_failures import JobFailures
from .job_tallies import Tallies
from .jobs import Job
from .keeper import ActiveLease, LeaseKeeper
from .lease import (
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
from .limits import lua_dir
from .protocol_version import check_protocol
from .runs import Decision, Runs
from .scripts import Call, Command, Observer, Scripts, observe, source
from .server_checks import EvictionPolicyWarning
from .shard_loop import HandlerResult, ShardReport
from .store import LeaseStore
from .tls import InsecureTLSWarning
from .version import __version__ as __version__

if TYPE_CHECKING:
    from .bad_jobs import BadJob, BadJobGuard
    from .data_set import Loss, MarkState, Observation
    from .dispatch import LeaseWorker, SimpleLeaseWorker
    from .lost_records import LostRun
    from .metrics import LeaseCollector
    from .metrics_history import AttemptHistograms, LogStream
    from .remembered import Remembered
    from .shard_jobs import JsonJob, JsonQueue, json_cron_jobs, purge_queue
    from .tick import tick_entry
    from .watch import FleetWatch

__all__ = [
    "ActiveLease",
    "Attempt",
    "AttemptHistograms",
    "BadJob",
    "BadJobGuard",
    "Call",
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
    "NeedsReconciliation",
    "NotClaimable",
    "NotFound",
    "Observation",
    "Observer",
    "PermanentError",
    "PermissionDenied",
    "ProtocolMismatch",
    "ProviderError",
    "ProviderGate",
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
    "Write",
    "check_protocol",
    "json_cron_jobs",
    "lua_dir",
    "not_sent",
    "observe",
    "purge_queue",
    "resolve_effect",
    "source",
    "tick_entry",
]

#: Names whose module is imported on first use (it needs RQ or Prometheus's client).
_LAZY = {
    "AttemptHistograms": "metrics_history",
    "BadJob": "bad_jobs",
    "BadJobGuard": "bad_jobs",
    "FleetWatch": "watch",
    "JsonJob": "shard_jobs",
    "JsonQueue": "shard_jobs",
    "LeaseWorker": "dispatch",
    "Loss": "data_set",
    "LostRun": "lost_records",
    "MarkState": "data_set",
    "Observation": "data_set",
    "Remembered": "remembered",
    "SimpleLeaseWorker": "dispatch",
    "json_cron_jobs": "shard_jobs",
    "LeaseCollector": "metrics",
    "LogStream": "metrics_history",
    "purge_queue": "shard_jobs",
    "tick_entry": "tick",
}

#: Old names, importable with a DeprecationWarning for one release.
_RENAMED = {"CommitOutcome": "CommitReply", "FailOutcome": "FailReply", "Outcome": "HandlerResult"}


def __getattr__(name: str) -> Any:
    """The names of :data:`_LAZY`, imported now; and the old names (``CommitOutcome``,
    ``FailOutcome``, ``Outcome``) of renamed classes, with a DeprecationWarning."""
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value
    return renamed_attribute(__name__, name, _RENAMED, globals())
