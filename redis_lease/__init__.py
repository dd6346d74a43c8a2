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
from .lease import CommitOutcome, FailOutcome, Item, ItemRecord, Lease, RunStatus
from .store import LeaseStore

__version__ = "0.1.0"

__all__ = [
    "CommitOutcome",
    "ConditionFailed",
    "EffectFailed",
    "EffectUnknown",
    "FailOutcome",
    "FieldEquals",
    "HandlerError",
    "InvalidInput",
    "Item",
    "ItemRecord",
    "KeyExists",
    "KeyMissing",
    "Lease",
    "LeaseError",
    "LeaseLost",
    "LeaseStore",
    "NeedsReconciliation",
    "NotClaimable",
    "NotFound",
    "PermanentError",
    "PermissionDenied",
    "ProviderError",
    "ProviderGate",
    "RedisLeaseError",
    "RedisUnavailable",
    "RunClosed",
    "RunStatus",
    "SlotTimeout",
    "TLSFailed",
    "Throttled",
    "Write",
]
