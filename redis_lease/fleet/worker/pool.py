"""Where a shard job's handlers run: inline, on a thread pool, or on one event loop.

A pool starts a handler for an :class:`~redis_lease.fleet.jobs.live_lease.ActiveLease` and,
when it ends, puts a :class:`Finished` (its answer or error, and its wall time)
on a queue that the shard loop reads; commits, fails and releases stay with
that loop. :func:`make_pool` picks the kind: ``async def`` handlers share one event
loop (a lost lease cancels their task), plain handlers run on up to N threads,
and a plain handler at concurrency 1 runs inline, in the caller's thread.

The thread and event loop pools also keep claimed items waiting for a slot: a
slot whose handler ends starts the next waiting item itself, so a slot never
waits while the shard loop makes a claim or commit round trip.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from ...protocol.leases import Item
from ..jobs.live_lease import ActiveLease

#: Asked before a slot starts a waiting item: False once the shard loop is leaving.
MayStart = Callable[[], bool]


@dataclass(frozen=True)
class Finished:
    """A handler that ended: its answer, or the error it raised, and its wall time.

    ``started`` is False for a waiting item whose lease was lost before a slot
    took it: its handler never ran.
    """

    active: ActiveLease
    answer: Any
    error: BaseException | None
    seconds: float
    started: bool = True


Done = queue.SimpleQueue[Finished]


class Pool(Protocol):
    """Runs handlers; each end is put on the pool's ``done`` queue."""

    done: Done
    #: True when :meth:`start` may be called with every slot busy: the item then
    #: waits in the pool, and the first slot to end starts it.
    queues: bool

    def start(self, active: ActiveLease) -> None:
        """Starts the handler of ``active``'s item, or keeps it waiting for a slot."""

    def take_back(self) -> list[ActiveLease]:
        """Starts nothing more; returns the items still waiting for a slot."""

    def close(self) -> None:
        """Waits for the started handlers and frees the pool's threads."""


def _item(active: ActiveLease) -> Item:
    return Item(active.lease.item_id, active.lease.payload)


class InlinePool:
    """Runs each handler at once in the calling thread (concurrency 1, plain handler)."""

    queues = False

    def __init__(self, handler: Callable[[Item, ActiveLease], Any]) -> None:
        self.handler = handler
        self.done: Done = queue.SimpleQueue()

    def start(self, active: ActiveLease) -> None:
        """Runs the handler now; its end is on :attr:`done` when this returns."""
        self.done.put(_run(self.handler, active))

    def take_back(self) -> list[ActiveLease]:
        """Nothing waits here."""
        return []

    def close(self) -> None:
        """Nothing to free."""


def _run(handler: Callable[[Item, ActiveLease], Any], active: ActiveLease) -> Finished:
    started = time.perf_counter()
    try:
        answer = handler(_item(active), active)
    except BaseException as error:  # the handler is user code: any error is its answer
        return Finished(active, None, error, time.perf_counter() - started)
    return Finished(active, answer, None, time.perf_counter() - started)


class _Waiting:
    """Claimed items waiting for a slot, oldest first, and the pool's free slots.

    A slot that ends takes the next item itself (:meth:`next`) while ``may_start``
    allows; an item whose lease was lost meanwhile is put on ``done`` unstarted.
    """

    def __init__(self, done: Done, may_start: MayStart, free: int) -> None:
        self.done, self.may_start, self.free = done, may_start, free
        self._items: deque[ActiveLease] = deque()
        self._changed = threading.Condition()
        self._closed = False

    def offer(self, active: ActiveLease) -> bool:
        """Takes a free slot for ``active`` (True: the caller starts it), else keeps it waiting."""
        with self._changed:
            if self.free and not self._items:
                self.free -= 1
                return True
            self._items.append(active)
            self._changed.notify()
            return False

    def next(self, block: bool) -> ActiveLease | None:
        """The next item for a slot, or None: the pool is closing, or (``block`` False) no
        item may start now, and the slot is counted free."""
        with self._changed:
            while True:
                if self._items and not self._closed and self.may_start():
                    active = self._items.popleft()
                    if active.lost:  # lost while waiting: not started
                        self.done.put(Finished(active, None, None, 0.0, started=False))
                        continue
                    return active
                if self._closed or not block:
                    self.free += 1
                    self._changed.notify_all()
                    return None
                self._changed.wait()

    def take_back(self) -> list[ActiveLease]:
        """Closes the queue (slots start nothing more) and returns what still waits."""
        with self._changed:
            self._closed = True
            items, self._items = list(self._items), deque()
            self._changed.notify_all()
            return items

    def wait_free(self, slots: int) -> None:
        """Waits until ``slots`` slots are free."""
        with self._changed:
            self._changed.wait_for(lambda: self.free >= slots)


class ThreadPool:
    """Runs up to ``size`` plain handlers at once on threads of their own."""

    queues = True

    def __init__(
        self, handler: Callable[[Item, ActiveLease], Any], size: int, may_start: MayStart
    ) -> None:
        self.handler = handler
        self.done: Done = queue.SimpleQueue()
        # The threads are the slots: each takes the next item itself, never a free slot to offer.
        self._waiting = _Waiting(self.done, may_start, 0)
        self._threads = [
            threading.Thread(target=self._work, name=f"redis-lease-handler-{n}", daemon=True)
            for n in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def start(self, active: ActiveLease) -> None:
        """Keeps the item waiting for the first free thread."""
        self._waiting.offer(active)

    def take_back(self) -> list[ActiveLease]:
        """Starts nothing more; returns the items still waiting for a thread."""
        return self._waiting.take_back()

    def _work(self) -> None:
        while (active := self._waiting.next(block=True)) is not None:
            self.done.put(_run(self.handler, active))

    def close(self) -> None:
        """Waits for the running handlers, then ends the threads."""
        self._waiting.take_back()
        for thread in self._threads:
            thread.join()


class LoopPool:
    """Runs ``async def`` handlers as tasks of one event loop on a thread of its own.

    Each handler is a task of its own; when it ends, the next waiting item's
    task is started from the loop, without waiting for the shard loop. When a
    handler's lease is lost its task is cancelled; it then ends with the
    lease's LeaseLost.
    """

    queues = True

    def __init__(
        self, handler: Callable[[Item, ActiveLease], Any], size: int, may_start: MayStart
    ) -> None:
        self.handler = handler
        self.size = size
        self.done: Done = queue.SimpleQueue()
        self._waiting = _Waiting(self.done, may_start, size)
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references
        self.loop = asyncio.new_event_loop()
        # asyncio.to_thread in the handlers: enough threads for each to have one.
        self._executor = ThreadPoolExecutor(size + 4, thread_name_prefix="redis-lease-async")
        self.loop.set_default_executor(self._executor)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="redis-lease-loop", daemon=True
        )
        self._thread.start()

    def start(self, active: ActiveLease) -> None:
        """Starts a task for the item when a slot is free, else keeps it waiting for one."""
        if self._waiting.offer(active):
            self.loop.call_soon_threadsafe(self._start_task, active)

    def take_back(self) -> list[ActiveLease]:
        """Starts nothing more; returns the items still waiting for a slot."""
        return self._waiting.take_back()

    def _start_task(self, active: ActiveLease) -> None:
        task = self.loop.create_task(self._work(active))
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """On the loop, as a task ends: its slot starts the next waiting item, if any."""
        self._tasks.discard(task)
        active = self._waiting.next(block=False)
        if active is not None:
            self._start_task(active)

    async def _work(self, active: ActiveLease) -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = self.loop

        def cancel() -> None:
            if not task.done() and not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)

        forget = active.on_lost(cancel)
        started = time.perf_counter()
        try:
            answer = await self.handler(_item(active), active)
            finished = Finished(active, answer, None, time.perf_counter() - started)
        except asyncio.CancelledError as error:
            lost: BaseException = error
            try:
                active.check()
            except Exception as lease_lost:  # LeaseLost: why the task was cancelled
                lost = lease_lost
            finished = Finished(active, None, lost, time.perf_counter() - started)
        except BaseException as error:  # the handler is user code: any error is its answer
            finished = Finished(active, None, error, time.perf_counter() - started)
        forget()  # a loss found later (its commit refused) has no task to cancel
        self.done.put(finished)

    def close(self) -> None:
        """Waits for the running tasks, then stops and closes the loop."""
        self._waiting.take_back()
        self._waiting.wait_free(self.size)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
        self._executor.shutdown(wait=True)


def is_async(handler: Callable[..., Any]) -> bool:
    """True for an ``async def`` handler (also behind a bound method or partial)."""
    return inspect.iscoroutinefunction(handler)


def make_pool(
    handler: Callable[[Item, ActiveLease], Any], size: int, may_start: MayStart = lambda: True
) -> Pool:
    """The pool for ``handler`` at concurrency ``size``; its slots start a waiting item
    only while ``may_start()`` is True."""
    if is_async(handler):
        return LoopPool(handler, size, may_start)
    if size == 1:
        return InlinePool(handler)
    return ThreadPool(handler, size, may_start)
