"""redis-lease: recoverable batch runs on Redis with fenced leases."""

from .errors import (
    ConditionFailed,
    InvalidInput,
    LeaseError,
    LeaseLost,
    NotClaimable,
    NotFound,
    RedisUnavailable,
    RunClosed,
)
from .guards import FieldEquals, KeyExists, KeyMissing, Write
from .lease import CommitOutcome, FailOutcome, Item, ItemRecord, Lease, RunStatus
from .store import LeaseStore

__version__ = "0.1.0"

__all__ = [
    "CommitOutcome",
    "ConditionFailed",
    "FailOutcome",
    "FieldEquals",
    "InvalidInput",
    "Item",
    "ItemRecord",
    "KeyExists",
    "KeyMissing",
    "Lease",
    "LeaseError",
    "LeaseLost",
    "LeaseStore",
    "NotClaimable",
    "NotFound",
    "RedisUnavailable",
    "RunClosed",
    "RunStatus",
    "Write",
]
