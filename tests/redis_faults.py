"""A Redis client that fails one chosen round trip, for tests that walk a recovery path and
fail it at each of its Redis calls in turn.

:class:`FailingCalls` wraps one redis-py client in place: every command it sends (a script
call is an ``EVALSHA``) and every pipeline it executes is one call; while armed with ``n``,
the n-th call raises ``redis.ConnectionError``: before anything is sent, as a connection
lost for that one call would (a pipeline that fails is sent not at all), or, with
``lose_reply``, after the server ran it, as a reply lost on its way back would. Other
clients of the same server are not touched, so a test can see what the path left behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from redis.client import Pipeline


class FailingCalls:
    """Counts a client's round trips, and fails the n-th once armed (:meth:`failing`)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.calls = 0
        self.fail_at: int | None = None
        self.lose_reply = False
        #: Whether the armed call was reached (and failed).
        self.failed = False
        send = client.execute_command
        make_pipeline = client.pipeline

        def execute_command(*args: Any, **options: Any) -> Any:
            return self._call(lambda: send(*args, **options))

        def pipeline(*args: Any, **options: Any) -> Pipeline:
            made = make_pipeline(*args, **options)
            run = made.execute

            def execute(raise_on_error: bool = True) -> list[Any]:
                if not made.command_stack:
                    return run(raise_on_error)
                replies: list[Any] = self._call(lambda: run(raise_on_error))
                return replies

            made.execute = execute  # type: ignore[method-assign]
            return made

        client.execute_command = execute_command  # type: ignore[method-assign]
        client.pipeline = pipeline  # type: ignore[method-assign]

    def _call(self, send: Callable[[], Any]) -> Any:
        self.calls += 1
        if self.fail_at is None or self.calls != self.fail_at:
            return send()
        self.failed = True
        if self.lose_reply:
            send()
        raise redis.ConnectionError(f"injected: call {self.calls} failed")

    @contextmanager
    def failing(self, nth: int | None, lose_reply: bool = False) -> Iterator[FailingCalls]:
        """Counts calls from 1 inside the block and fails the ``nth`` (None: none); with
        ``lose_reply`` the failed call runs on the server first."""
        self.calls, self.fail_at, self.lose_reply, self.failed = 0, nth, lose_reply, False
        try:
            yield self
        finally:
            self.fail_at = None


def count_calls(client: redis.Redis, work: Callable[[], object]) -> int:
    """How many round trips ``work`` makes on ``client`` (wrapped for good: use a client of
    the test's own)."""
    calls = client_calls(client)
    with calls.failing(None):
        work()
    return calls.calls


def client_calls(client: redis.Redis) -> FailingCalls:
    """The client's :class:`FailingCalls`, made once per client."""
    found: FailingCalls | None = getattr(client, "_failing_calls", None)
    if found is None:
        found = FailingCalls(client)
        client._failing_calls = found  # type: ignore[attr-defined]
    return found
