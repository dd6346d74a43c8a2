"""redis-lease: recoverable batch runs on Redis with fenced leases."""

from .errors import (
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
from .jobs import Job
from .keeper import ActiveLease
from .lease import (
    Attempt,
    CommitOutcome,
    CommitRequest,
    FailOutcome,
    FailRequest,
    Item,
    ItemError,
    ItemRecord,
    Lease,
    ReleaseRequest,
    RunStatus,
)
from .runs import Runs
from .shard_loop import Outcome
from .store import LeaseStore

__version__ = "0.1.0"

__all__ = [
    "ActiveLease",
    "Attempt",
    "CommitOutcome",
    "CommitRequest",
    "ConditionFailed",
    "EffectFailed",
    "EffectUnknown",
    "FailOutcome",
    "FailRequest",
    "FieldEquals",
    "HandlerError",
    "InvalidInput",
    "Item",
    "ItemError",
    "ItemRecord",
    "Job",
    "KeyExists",
    "KeyMissing",
    "Lease",
    "LeaseError",
    "LeaseLost",
    "LeaseStore",
    "NeedsReconciliation",
    "NotClaimable",
    "NotFound",
    "Outcome",
    "PermanentError",
    "PermissionDenied",
    "ProviderError",
    "ProviderGate",
    "RedisLeaseError",
    "RedisUnavailable",
    "ReleaseRequest",
    "RunClosed",
    "RunStatus",
    "Runs",
    "SlotTimeout",
    "TLSFailed",
    "Throttled",
    "Write",
]
