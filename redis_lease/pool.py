"""Where a shard job's handlers run: inline, on a thread pool, or on one event loop.

A pool starts a handler for an :class:`~redis_lease.keeper.ActiveLease` and,
when it ends, puts a :class:`Finished` (its answer or error, and its wall time)
on a queue that the shard loop reads; settling and committing stay with that
loop. :func:`make_pool` picks the kind: ``async def`` handlers share one event
loop (a lost lease cancels their task), plain handlers run on up to N threads,
and a plain handler at concurrency 1 runs inline, in the caller's thread.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from .keeper import ActiveLease
from .lease import Item


@dataclass(frozen=True)
class Finished:
    """A handler that ended: its answer, or the error it raised, and its wall time."""

    active: ActiveLease
    answer: Any
    error: BaseException | None
    seconds: float


Done = queue.SimpleQueue[Finished]


class Pool(Protocol):
    """Runs handlers; each end is put on the pool's ``done`` queue."""

    done: Done

    def start(self, active: ActiveLease) -> None:
        """Starts the handler of ``active``'s item."""

    def close(self) -> None:
        """Waits for the started handlers and frees the pool's threads."""


def _item(active: ActiveLease) -> Item:
    return Item(active.lease.item_id, active.lease.payload)


class InlinePool:
    """Runs each handler at once in the calling thread (concurrency 1, plain handler)."""

    def __init__(self, handler: Callable[[Item, ActiveLease], Any]) -> None:
        self.handler = handler
        self.done: Done = queue.SimpleQueue()

    def start(self, active: ActiveLease) -> None:
        """Runs the handler now; its end is on :attr:`done` when this returns."""
        self.done.put(_run(self.handler, active))

    def close(self) -> None:
        """Nothing to free."""


def _run(handler: Callable[[Item, ActiveLease], Any], active: ActiveLease) -> Finished:
    started = time.perf_counter()
    try:
        answer = handler(_item(active), active)
    except BaseException as error:  # the handler is user code: any error is its answer
        return Finished(active, None, error, time.perf_counter() - started)
    return Finished(active, answer, None, time.perf_counter() - started)


class ThreadPool:
    """Runs up to ``size`` plain handlers at once on threads of their own."""

    def __init__(self, handler: Callable[[Item, ActiveLease], Any], size: int) -> None:
        self.handler = handler
        self.done: Done = queue.SimpleQueue()
        self._todo: queue.SimpleQueue[ActiveLease | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"redis-lease-handler-{n}", daemon=True)
            for n in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def start(self, active: ActiveLease) -> None:
        """Hands the handler to a free thread (the caller starts at most ``size`` at once)."""
        self._todo.put(active)

    def _work(self) -> None:
        while (active := self._todo.get()) is not None:
            self.done.put(_run(self.handler, active))

    def close(self) -> None:
        """Waits for the running handlers, then ends the threads."""
        for _ in self._threads:
            self._todo.put(None)
        for thread in self._threads:
            thread.join()


class LoopPool:
    """Runs ``async def`` handlers as tasks of one event loop on a thread of its own.

    When a handler's lease is lost its task is cancelled; it then ends with
    the lease's LeaseLost.
    """

    def __init__(self, handler: Callable[[Item, ActiveLease], Any], size: int) -> None:
        self.handler = handler
        self.done: Done = queue.SimpleQueue()
        self.loop = asyncio.new_event_loop()
        # asyncio.to_thread in the handlers: enough threads for each to have one.
        self._executor = ThreadPoolExecutor(size + 4, thread_name_prefix="redis-lease-async")
        self.loop.set_default_executor(self._executor)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="redis-lease-loop", daemon=True
        )
        self._thread.start()
        self._running = 0
        self._idle = threading.Condition()

    def start(self, active: ActiveLease) -> None:
        """Schedules the handler as a task on the loop."""
        with self._idle:
            self._running += 1
        asyncio.run_coroutine_threadsafe(self._work(active), self.loop)

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
        with self._idle:
            self._running -= 1
            self._idle.notify_all()

    def close(self) -> None:
        """Waits for the running tasks, then stops and closes the loop."""
        with self._idle:
            self._idle.wait_for(lambda: self._running == 0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
        self._executor.shutdown(wait=True)


def is_async(handler: Callable[..., Any]) -> bool:
    """True for an ``async def`` handler (also behind a bound method or partial)."""
    return inspect.iscoroutinefunction(handler)


def make_pool(handler: Callable[[Item, ActiveLease], Any], size: int) -> Pool:
    """The pool for ``handler`` at concurrency ``size``."""
    if is_async(handler):
        return LoopPool(handler, size)
    if size == 1:
        return InlinePool(handler)
    return ThreadPool(handler, size)
