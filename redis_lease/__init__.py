"""redis-lease: recoverable batch runs on Redis with fenced leases."""

from typing import Any

from .deprecation import renamed_attribute
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
from .jobs import Job
from .keeper import ActiveLease
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
from .protocol_version import check_protocol
from .runs import Runs
from .shard_loop import HandlerResult
from .store import LeaseStore

__version__ = "0.10.0"

__all__ = [
    "ActiveLease",
    "Attempt",
    "ClusterBusy",
    "CommitReply",
    "CommitRequest",
    "ConditionFailed",
    "EffectFailed",
    "EffectUnknown",
    "FailReply",
    "FailRequest",
    "FieldEquals",
    "HandlerError",
    "HandlerResult",
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
    "PermanentError",
    "PermissionDenied",
    "ProtocolMismatch",
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
    "check_protocol",
]

#: Old names, importable with a DeprecationWarning for one release.
_RENAMED = {"CommitOutcome": "CommitReply", "FailOutcome": "FailReply", "Outcome": "HandlerResult"}


def __getattr__(name: str) -> Any:
    """The old names (``CommitOutcome``, ``FailOutcome``, ``Outcome``) of renamed
    classes, with a DeprecationWarning."""
    return renamed_attribute(__name__, name, _RENAMED, globals())
