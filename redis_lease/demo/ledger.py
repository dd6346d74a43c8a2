"""The demo provider's book of effects, kept in Redis beside the run.

It stands for the payment provider's side: every request is counted by its
idempotency key, and an effect is applied only the first time a key is seen
(as a provider that honours ``Idempotency-Key`` does). ``duplicates`` counts
keys applied more than once, which must stay 0.
"""

from __future__ import annotations

import uuid

import redis

APPLY = """
-- KEYS[1] applied (hash key -> reference), KEYS[2] requests (hash key -> count),
-- KEYS[3] applications (hash key -> count). ARGV[1] key, ARGV[2] new reference.
-- Returns {reference, 1 when applied now else 0}
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
local ref = redis.call('HGET', KEYS[1], ARGV[1])
if ref then return {ref, 0} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
return {ARGV[2], 1}
"""


class Ledger:
    """The provider's record of effects under ``<prefix>:provider:*``."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        tag = f"{prefix}:provider:{{ledger}}"
        self.keys = [f"{tag}:applied", f"{tag}:requests", f"{tag}:applications"]
        self._apply = client.register_script(APPLY)

    def apply(self, key: str) -> tuple[str, bool]:
        """Applies the effect of ``key`` once; returns (reference, applied now)."""
        ref, applied = self._apply(keys=self.keys, args=[key, f"pay_{uuid.uuid4().hex[:16]}"])
        return (ref.decode() if isinstance(ref, bytes) else str(ref)), bool(applied)

    def figures(self) -> dict[str, int]:
        """Effects applied, requests received, and keys applied more than once."""
        applications = self.client.hvals(self.keys[2])
        requests = self.client.hvals(self.keys[1])
        return {
            "effects_applied": len(applications),
            "provider_requests": sum(int(v) for v in requests),
            "duplicate_effects": sum(int(v) - 1 for v in applications if int(v) > 1),
        }
