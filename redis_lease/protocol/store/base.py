"""The plumbing every LeaseStore stands on: its clients (the lease store's and RQ's),
its key names and scripts, the translation of what Redis raises, and the shard of an item;
and the lock of one tick or one planner taken on a store (:func:`lock`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Any, Self

import redis

from ...deprecation import warn_renamed
from ...errors import InvalidInput, NotFound
from ...limits import DEFAULT_PREFIX
from ..connection.clients import client_from_url
from ..connection.cluster import is_cluster
from ..connection.server_checks import check_server
from ..connection.translate import REDIS_FAILURES, ErrorDoor, translating_errors
from ..connection.urls import is_cluster_url
from ..keys import Keys, shard_of
from ..scripts import LOGGED, Scripts
from ..validation import check_id


class StoreBase:
    """A store's clients, keys and scripts (see :class:`~.store.LeaseStore`)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = DEFAULT_PREFIX,
        url: str = "redis",
        rq_client: redis.Redis | None = None,
    ) -> None:
        self.client = client
        self.url = url
        self.prefix = check_id(prefix, "prefix")
        self.keys = Keys(prefix)
        self.scripts = Scripts(client)
        self.on_cluster = is_cluster(client)
        self._rq = rq_client if rq_client is not None or self.on_cluster else client
        self._shards: dict[str, int] = {}

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        *,
        queue_url: str | None = None,
        **options: Any,
    ) -> Self:
        """A store on the Redis at ``url`` (redis://, rediss://, unix://, redis+cluster://,
        redis+sentinel:// or fakeredis://); RQ's queues on ``queue_url`` when given."""
        if queue_url and is_cluster_url(queue_url):
            raise InvalidInput(
                "the queue URL cannot be a cluster: RQ does not run on Redis Cluster; give a "
                "plain redis://HOST:PORT/DB"
            )
        opened: list[redis.Redis] = []
        try:
            client = client_from_url(url, **options)
            opened.append(client)
            check_server(client, url)
            rq_client = None
            if queue_url:
                rq_client = client_from_url(queue_url)
                opened.append(rq_client)
                check_server(rq_client, queue_url)
        except BaseException:
            for made in opened:
                made.close()
            raise
        return cls(client, prefix=prefix, url=url, rq_client=rq_client)

    def with_prefix(self, prefix: str) -> Self:
        """A store on the same clients under another key prefix."""
        return type(self)(self.client, prefix=prefix, url=self.url, rq_client=self._rq)

    @property
    def rq(self) -> redis.Redis:
        """The Redis of RQ's queues, jobs and workers: the store's own, or on a cluster
        the plain Redis given as the queue URL (RQ's commands span hash slots).

        Raises:
            InvalidInput: the store is on a cluster and no queue URL was given.
        """
        if self._rq is None:
            raise InvalidInput(
                "RQ does not run on Redis Cluster: give its queues a plain Redis with "
                "--queue-url redis://HOST:PORT/DB (REDIS_LEASE_QUEUE_URL)"
            )
        return self._rq

    def close(self) -> None:
        """Closes the store's connections (RQ's too, when they are its own)."""
        if self._rq is not None and self._rq is not self.client:
            self._rq.close()
        self.client.close()

    def translating_errors(
        self, run_id: str | None = None, item_id: str | None = None, token: int | None = None
    ) -> ErrorDoor:
        """The door for this store's calls (:func:`~..connection.translate.translating_errors`):
        around a block, Redis failures and script error replies leave it as this library's
        errors (RedisUnavailable, LeaseLost, NotFound, ...); its ``error()`` translates an
        error reply taken from a pipeline."""
        return translating_errors(self.url, run_id=run_id, item_id=item_id, token=token)

    def errors(
        self, run_id: str | None = None, item_id: str | None = None, token: int | None = None
    ) -> AbstractContextManager[None]:
        """Deprecated: :meth:`translating_errors`."""
        warn_renamed("LeaseStore.errors()", "LeaseStore.translating_errors()")
        return self.translating_errors(run_id, item_id, token)

    def translate(
        self,
        error: BaseException,
        run_id: str | None = None,
        item_id: str | None = None,
        token: int | None = None,
    ) -> Exception:
        """Deprecated: ``translating_errors(run_id, item_id, token).error(error)``."""
        warn_renamed("LeaseStore.translate()", "LeaseStore.translating_errors().error()")
        return self.translating_errors(run_id, item_id, token).error(error)

    def _run_script(
        self,
        name: str,
        run_id: str,
        shard: int,
        args: Sequence[Any],
        *,
        item_id: str | None = None,
        token: int | None = None,
        extra_keys: Sequence[str] = (),
    ) -> Any:
        keys = (self.keys.logged if name in LOGGED else self.keys.shard)(run_id, shard)
        if extra_keys:
            keys += extra_keys
        try:  # the hot path: the door is opened only when the call failed
            return self.scripts.call(name, keys, args)
        except REDIS_FAILURES as error:
            raise self.translating_errors(run_id, item_id, token).error(error) from None

    def shard_count(self, run_id: str) -> int:
        """The run's shard count; raises NotFound for an unknown run."""
        check_id(run_id, "run id")
        if run_id not in self._shards:
            with self.translating_errors(run_id):
                raw = self.client.hget(self.keys.run(run_id), "shards")
            if raw is None:
                raise NotFound.run(run_id, then="add items to create it")
            self._shards[run_id] = int(raw)
        return self._shards[run_id]

    def shard_for(self, run_id: str, item_id: str) -> int:
        """The shard that holds ``item_id``: CRC-32 of its id modulo the run's shard count
        (:func:`redis_lease.protocol.keys.shard_of`, after checking the id)."""
        return shard_of(check_id(item_id, "item id"), self.shard_count(run_id))


@contextmanager
def lock(store: StoreBase, key: str, ttl_ms: int, run_id: str | None = None) -> Iterator[bool]:
    """Holds ``key`` for the block when it is free; yields whether it was taken.

    The lock of one tick or one planner: the key holds a random owner token with a TTL,
    so a holder that dies frees it by expiry. It is released through the
    ``release_lock`` script, which deletes it only while it still holds the owner's
    token (a lock that expired and was taken by another is left alone); the release goes
    through :meth:`Scripts.call`, so a ``SCRIPT FLUSH`` costs a reload, not a lock held
    until its TTL runs out. Taking it raises the library's error when Redis fails;
    releasing it is best effort (when Redis is gone the key expires by itself, and the
    block's own error is the one that matters).
    """
    owner = uuid.uuid4().hex
    with store.translating_errors(run_id):
        taken = bool(store.client.set(key, owner, nx=True, px=ttl_ms))
        if not taken:
            # the client resends a command whose reply a reset lost: the first SET may
            # have landed, and then the lock is ours
            taken = store.client.get(key) in (owner, owner.encode())
    try:
        yield taken
    finally:
        if taken:
            with suppress(redis.RedisError, OSError):
                store.scripts.call("release_lock", [key], [owner])
