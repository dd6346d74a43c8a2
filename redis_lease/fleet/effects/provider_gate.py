"""The provider boundary: a fleet-wide concurrency cap per provider, kept in Redis.

A slot is a lease too (it expires if its holder dies), so adding workers can't
exceed what the provider tolerates. When the provider throttles, the cap is
halved and new slots wait for its Retry-After; each full window of successes
at the current cap raises it by one again (additive increase, multiplicative
decrease). A gate is shared safely by threads, processes and the tasks of an
event loop (:meth:`ProviderGate.slot_async`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

from ...errors import SlotTimeout, Throttled
from ...limits import CAP_MAX
from ...protocol.connection.clients import as_text, queue_time, time_ms
from ...protocol.connection.translate import translating_errors
from ...protocol.replies import SlotAnswer
from ...protocol.store.lease_store import LeaseStore
from ...protocol.validation import check_id, check_positive, ttl_to_ms

#: The longest pause between polls for a free slot (seconds).
POLL_MAX = 0.05


@dataclass(frozen=True)
class GateState:
    """A provider's cap and counters as recorded in Redis."""

    name: str
    cap: int
    in_use: int
    min_cap: int
    max_cap: int
    throttles: int
    paused_until_ms: int
    counters: dict[str, int]


class ProviderGate:
    """At most ``cap`` calls in flight to provider ``name`` across every worker.

    Args:
        store: the store whose Redis keeps the slots.
        name: the provider's id.
        max_concurrency: the cap it starts at and never exceeds.
        min_concurrency: the lowest it drops to under throttling.
        slot_ttl: seconds a slot lasts if its holder dies mid-call.
    """

    def __init__(
        self,
        store: LeaseStore,
        name: str,
        max_concurrency: int,
        min_concurrency: int = 1,
        slot_ttl: float = 60.0,
    ) -> None:
        self.store = store
        self.name = check_id(name, "provider name")
        self.max_concurrency = check_positive(max_concurrency, "max_concurrency", CAP_MAX)
        self.min_concurrency = check_positive(min_concurrency, "min_concurrency", max_concurrency)
        self.slot_ttl_ms = ttl_to_ms(slot_ttl, "slot_ttl")
        self.keys = store.keys.provider(name)

    @contextmanager
    def slot(self, wait: float = 30.0) -> Iterator[None]:
        """Holds one slot around a call; a Throttled error lowers the cap.

        The provider's Retry-After pauses new slots for at most the protocol's
        delay bound (limits.DELAY_MAX_MS); an infinite or unreadable one is clamped.

        Raises:
            SlotTimeout: no slot within ``wait`` seconds.
        """
        holder = uuid.uuid4().hex
        self._acquire(holder, wait)
        outcome, retry_after_ms = "error", 0
        try:
            yield
            outcome = "ok"
        except Throttled as error:
            outcome, retry_after_ms = "throttled", error.delay_ms
            raise
        finally:
            self._call("slot_release", [holder, outcome, retry_after_ms])

    @asynccontextmanager
    async def slot_async(self, wait: float = 30.0) -> AsyncIterator[None]:
        """:meth:`slot` for an ``async def`` handler: waits without blocking the event loop.

        Raises:
            SlotTimeout: no slot within ``wait`` seconds.
        """
        holder = uuid.uuid4().hex
        deadline = time.monotonic() + wait
        while True:
            pause = await asyncio.to_thread(self._try_acquire, holder, deadline, wait)
            if pause is None:
                break
            await asyncio.sleep(pause)
        outcome, retry_after_ms = "error", 0
        try:
            yield
            outcome = "ok"
        except Throttled as error:
            outcome, retry_after_ms = "throttled", error.delay_ms
            raise
        finally:
            await asyncio.to_thread(self._call, "slot_release", [holder, outcome, retry_after_ms])

    def _call(self, script: str, args: list[Any]) -> Any:
        with translating_errors(self.store.url):
            return self.store.scripts.call(script, self.keys, args)

    def _acquire(self, holder: str, wait: float) -> None:
        deadline = time.monotonic() + wait
        while (pause := self._try_acquire(holder, deadline, wait)) is not None:
            time.sleep(pause)

    def _try_acquire(self, holder: str, deadline: float, wait: float) -> float | None:
        """Asks for a slot once: None when granted, else the seconds to pause before asking again.

        Raises SlotTimeout once ``deadline`` (monotonic) has passed.
        """
        answer: SlotAnswer = self._call(
            "slot_acquire",
            [holder, self.slot_ttl_ms, self.max_concurrency, self.min_concurrency],
        )
        if answer.granted:
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SlotTimeout(f"no slot for provider {self.name!r} within {wait}s; retry later")
        # Poll: the wait the script suggests, capped so a freed slot is found quickly.
        return min(remaining, max(0.002, min(answer.wait_ms / 1000, POLL_MAX)))

    def state(self) -> GateState:
        """The current cap, slots in use and throttle counters."""
        with translating_errors(self.store.url):
            pipe = self.store.client.pipeline(transaction=False)
            queue_time(pipe)
            pipe.zrange(self.keys[0], 0, -1, withscores=True)
            pipe.hgetall(self.keys[1])
            now_reply, slots, raw = pipe.execute()
        now = time_ms(now_reply)
        fields: dict[str, Any] = {as_text(k): int(float(v)) for k, v in raw.items()}
        return GateState(
            name=self.name,
            cap=fields.get("cap", self.max_concurrency),
            in_use=sum(1 for _, expiry in slots if expiry > now),
            min_cap=fields.get("min_cap", self.min_concurrency),
            max_cap=fields.get("max_cap", self.max_concurrency),
            throttles=fields.get("throttles", 0),
            paused_until_ms=fields.get("paused_until", 0),
            counters=fields,
        )
