"""Adding items to a run: checked (item id, payload JSON text) pairs sent to the
``add_items`` script per shard, many calls per round trip, while the next are prepared.

:meth:`LeaseStore.add <redis_lease.LeaseStore.add>` checks its items and comes
here; :meth:`LeaseStore.add_checked <redis_lease.LeaseStore.add_checked>` comes
here with pairs checked already (``add --from-file`` checks a whole file first).

The pairs are taken a window at a time (:func:`window_size`). A window's pairs of one
shard go in calls of :data:`ADD_BATCH`, and its calls in round trips of
:data:`ADD_PIPELINE`, so Redis runs one call after another while the rest are on their
way. :data:`SENDERS` windows are sent at once, each by a thread on a connection of its
own, so that Redis has the next round trip at hand when it ends one, while the next
window is read and prepared. A window that holds an id of one being sent waits for it:
an id given twice is added from its first pair, whatever the windows' timing.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...limits import ADD_BATCH_MAX, ATTEMPTS_MAX
from ..keys import shard_of
from ..scripts import Call
from ..validation import check_positive, check_time_ms, ttl_to_ms

if TYPE_CHECKING:
    from .store_client import StoreBase

#: Items sent to Redis per add_items call (at most limits.ADD_BATCH_MAX).
ADD_BATCH = min(500, ADD_BATCH_MAX)
#: add_items calls sent per round trip (a pipeline of up to this many).
ADD_PIPELINE = 16
#: Windows sent at once, each on a connection of its own.
SENDERS = 2

Pair = tuple[str, str]
#: Called with each window's pairs and, in their order, whether each was added.
Added = Callable[[Sequence[Pair], list[bool]], None]


@dataclass(frozen=True)
class AddSettings:
    """A shard's settings, fixed by its first add: checked, as add_items takes them."""

    max_attempts: int
    backoff_base_ms: int
    backoff_cap_ms: int
    deadline_ms: int

    @classmethod
    def checked(
        cls,
        max_attempts: int,
        backoff_base: float,
        backoff_cap: float,
        deadline_ms: int | None,
    ) -> AddSettings:
        """The settings, each checked (InvalidInput names the bad one)."""
        return cls(
            check_positive(max_attempts, "max_attempts", ATTEMPTS_MAX),
            ttl_to_ms(backoff_base, "backoff_base"),
            ttl_to_ms(backoff_cap, "backoff_cap"),
            check_time_ms(deadline_ms, "deadline_ms"),
        )


def window_size(shards: int) -> int:
    """Pairs taken at a time: a round trip of full calls, and for many shards enough that a
    shard's calls are not tiny (about 100 pairs each)."""
    return max(ADD_BATCH * ADD_PIPELINE, 100 * shards)


def send_adds(
    store: StoreBase,
    run_id: str,
    pairs: Iterable[Pair],
    settings: AddSettings,
    added: Added,
) -> None:
    """Adds checked (item id, payload JSON text) pairs to an existing run, a window at a
    time; ``added`` hears of each window once it is in (an item is not added when it was
    there already, or came earlier in ``pairs``).

    Raises what :meth:`~.store_client.StoreBase.translating_errors` makes of a refused call (the
    first one, after the other calls of its round trip ran), e.g. RunClosed; the windows before it
    stay added, and no later one is sent.
    """
    count = store.shard_count(run_id)
    windows = (_Window(store, run_id, count, window, settings) for window in _windows(pairs, count))
    first = next(windows, None)
    if first is None:
        return
    second = next(windows, None)
    if second is None:  # one window: no thread needed
        added(first.pairs, first.send())
        return
    with ThreadPoolExecutor(SENDERS, thread_name_prefix="redis-lease-add") as sender:
        in_flight: deque[tuple[_Window, Future[list[bool]]]] = deque()
        try:
            for window in itertools.chain((first, second), windows):
                while in_flight and (
                    len(in_flight) == SENDERS or any(window.meets(w) for w, _ in in_flight)
                ):
                    done, future = in_flight.popleft()
                    added(done.pairs, future.result())
                in_flight.append((window, sender.submit(window.send)))
            while in_flight:
                done, future = in_flight.popleft()
                added(done.pairs, future.result())
        finally:
            for _, future in in_flight:
                future.cancel()


def added_ids(
    store: StoreBase, run_id: str, pairs: Iterable[Pair], settings: AddSettings
) -> tuple[list[str], list[str]]:
    """:func:`send_adds`; returns (the ids added, the ids that were there)."""
    added: list[str] = []
    existing: list[str] = []

    def sort_out(window: Sequence[Pair], flags: list[bool]) -> None:
        for (item_id, _), flag in zip(window, flags, strict=True):
            (added if flag else existing).append(item_id)

    send_adds(store, run_id, pairs, settings, sort_out)
    return added, existing


def added_counts(
    store: StoreBase,
    run_id: str,
    pairs: Iterable[Pair],
    settings: AddSettings,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """:func:`send_adds`; returns (how many were added, how many were there); ``progress``
    hears how many pairs each window took."""
    counts = [0, 0]

    def count(window: Sequence[Pair], flags: list[bool]) -> None:
        new = sum(flags)
        counts[0], counts[1] = counts[0] + new, counts[1] + len(flags) - new
        if progress is not None:
            progress(len(flags))

    send_adds(store, run_id, pairs, settings, count)
    return counts[0], counts[1]


class _Window:
    """One window's add_items calls, made when it is read (a shard's pairs in calls of
    :data:`ADD_BATCH`), and sent :data:`ADD_PIPELINE` calls a round trip by :meth:`send`."""

    def __init__(
        self,
        store: StoreBase,
        run_id: str,
        count: int,
        pairs: Sequence[Pair],
        settings: AddSettings,
    ) -> None:
        self.store, self.run_id, self.pairs = store, run_id, pairs
        self._ids: frozenset[str] | None = None
        by_shard: dict[int, list[int]] = {}
        for index, (item_id, _) in enumerate(pairs):
            by_shard.setdefault(shard_of(item_id, count), []).append(index)
        fixed = [settings.max_attempts, settings.backoff_base_ms, settings.backoff_cap_ms]
        self.calls: list[Call] = []
        self.spans: list[list[int]] = []
        for shard, indexes in sorted(by_shard.items()):
            keys = store.keys.shard(run_id, shard)
            for start in range(0, len(indexes), ADD_BATCH):
                span = indexes[start : start + ADD_BATCH]
                flat: list[Any] = [run_id, shard, *fixed, settings.deadline_ms]
                for index in span:
                    flat += pairs[index]
                self.calls.append(Call("add_items", keys, flat))
                self.spans.append(span)

    def meets(self, other: _Window) -> bool:
        """Whether the two windows hold an id in common."""
        if self._ids is None:
            self._ids = frozenset(item_id for item_id, _ in self.pairs)
        return any(item_id in self._ids for item_id, _ in other.pairs)

    def send(self) -> list[bool]:
        """Sends the calls; whether each pair was added, in order."""
        store, calls, spans = self.store, self.calls, self.spans
        flags = [False] * len(self.pairs)
        for start in range(0, len(calls), ADD_PIPELINE):
            with store.translating_errors(self.run_id):
                replies = store.scripts.many(calls[start : start + ADD_PIPELINE])
            refused = next((r for r in replies if isinstance(r, Exception)), None)
            if refused is not None:
                raise store.translating_errors(self.run_id).error(refused)
            for span, reply in zip(spans[start : start + ADD_PIPELINE], replies, strict=True):
                for index, flag in zip(span, reply, strict=True):
                    flags[index] = flag
        return flags


def _windows(pairs: Iterable[Pair], shards: int) -> Iterator[list[Pair]]:
    """The pairs in lists of :func:`window_size`."""
    iterator, size = iter(pairs), window_size(shards)
    while window := list(itertools.islice(iterator, size)):
        yield window
