"""The plumbing every LeaseStore stands on: its clients (the lease store's and RQ's),
its key names and scripts, the translation of what Redis raises, and the shard of an item;
and the lock of one planner taken on a store (:func:`lock`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, Self

import redis

from ...errors import InvalidInput, NotFound, NotReplicated
from ...limits import DEFAULT_PREFIX
from ..connection.clients import client_from_url
from ..connection.cluster import is_cluster
from ..connection.replica_wait import ReplicaWait, replica_wait
from ..connection.server_checks import check_server
from ..connection.translate import REDIS_FAILURES, ErrorDoor, translating_errors
from ..connection.urls import is_cluster_url, where
from ..keys import Keys, shard_of
from ..scripts import LOGGED, Scripts
from ..validation import check_id

#: The state an effect's intent the replicas lacked is marked with: failed, as it was not
#: sent (an effect's word, not a run's: tests/test_limits_home.py).
INTENT_NOT_SENT = "failed"


def waits_for_replicas(name: str, args: Sequence[Any]) -> bool:
    """Whether a store that waits for replicas waits after this call: a claim (it hands a
    token out), or an effect's intent (``record_effect`` with the state ``intended``, its
    ARGV[6]: the record a later attempt must find before it sends the effect again)."""
    return name in ("claim", "claim_next") or (
        name == "record_effect" and len(args) > 5 and args[5] == "intended"
    )


class StoreBase:
    """A store's clients, keys and scripts (see :class:`~.lease_store.LeaseStore`)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = DEFAULT_PREFIX,
        url: str = "redis",
        rq_client: redis.Redis | None = None,
        *,
        wait_replicas: int | None = None,
        wait_timeout_ms: int | None = None,
    ) -> None:
        self.client = client
        self.url = url
        self.prefix = check_id(prefix, "prefix")
        self.keys = Keys(prefix)
        self.scripts = Scripts(client)
        self.on_cluster = is_cluster(client)
        self._rq = rq_client if rq_client is not None or self.on_cluster else client
        self._shards: dict[str, int] = {}
        #: The replicas each claim and intent waits for (None: none, the default).
        self.replica_wait: ReplicaWait | None = replica_wait(url, wait_replicas, wait_timeout_ms)
        if self.replica_wait is not None and type(client).__module__.startswith("fakeredis"):
            raise InvalidInput(
                "the embedded backend (fakeredis://) has no replicas: drop wait_replicas"
            )

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        *,
        queue_url: str | None = None,
        wait_replicas: int | None = None,
        wait_timeout_ms: int | None = None,
        **options: Any,
    ) -> Self:
        """A store on the Redis at ``url`` (redis://, rediss://, unix://, redis+cluster://,
        redis+sentinel:// or fakeredis://); RQ's queues on ``queue_url`` when given.

        ``wait_replicas`` (or the URL's ``?wait_replicas=N``): each claim and each effect's
        intent waits, in its own round trip, until N replicas have it, for at most
        ``wait_timeout_ms`` (or ``&wait_timeout_ms=``; 1000 by default); see
        docs/durability.md. ``options`` are redis-py's."""
        wait = replica_wait(url, wait_replicas, wait_timeout_ms)  # bad values: before connecting
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
        return cls(
            client,
            prefix=prefix,
            url=url,
            rq_client=rq_client,
            wait_replicas=wait.replicas if wait else 0,
            wait_timeout_ms=wait.timeout_ms if wait else None,
        )

    def with_prefix(self, prefix: str) -> Self:
        """A store on the same clients under another key prefix (waiting for the same
        replicas)."""
        wait = self.replica_wait
        return type(self)(
            self.client,
            prefix=prefix,
            url=self.url,
            rq_client=self._rq,
            wait_replicas=wait.replicas if wait else 0,
            wait_timeout_ms=wait.timeout_ms if wait else None,
        )

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
        """Returns the error translator for this store's calls.

        See :func:`~..connection.translate.translating_errors`. Around a block, it turns
        Redis failures and script error replies into this library's errors
        (RedisUnavailable, LeaseLost, NotFound, ...). Its ``error()`` translates an error
        reply taken from a pipeline."""
        return translating_errors(self.url, run_id=run_id, item_id=item_id, token=token)

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
        if self.replica_wait is not None and waits_for_replicas(name, args):
            return self._run_waited(self.replica_wait, name, run_id, shard, keys, args, item_id)
        try:  # the hot path: errors are translated only when the call failed
            return self.scripts.call(name, keys, args)
        except REDIS_FAILURES as error:
            raise self.translating_errors(run_id, item_id, token).error(error) from None

    def _run_waited(
        self,
        wait: ReplicaWait,
        name: str,
        run_id: str,
        shard: int,
        keys: list[str],
        args: Sequence[Any],
        item_id: str | None,
    ) -> Any:
        """A call and its WAIT in one round trip; its reply once the replicas have it.

        Raises:
            NotReplicated: fewer replicas acknowledged it in time; what its reply held was
                given back first (:meth:`_hold_back`).
        """
        token = int(args[1]) if name == "record_effect" else None
        try:
            reply, acked = self.scripts.call_waited(
                name, keys, args, wait.replicas, wait.timeout_ms
            )
        except REDIS_FAILURES as error:
            raise self.translating_errors(run_id, item_id, token).error(error) from None
        if acked >= wait.replicas:
            return reply
        undone = self._hold_back(name, run_id, shard, reply, keys, args)
        raise NotReplicated(
            f"{where(self.url)}: {acked} of {wait.replicas} replicas acknowledged the "
            f"{name} call within {wait.timeout_ms} ms, so it was not handed out{undone}; "
            "retry once the replicas catch up (check INFO replication), or lower wait_replicas",
            wanted=wait.replicas,
            acked=acked,
            run_id=run_id,
            item_id=item_id,
            token=token,
        )

    def _hold_back(
        self,
        name: str,
        run_id: str,
        shard: int,
        reply: Any,
        keys: list[str],
        args: Sequence[Any],
    ) -> str:
        """Undoes what a reply the replicas did not acknowledge would have handed out;
        returns how, for the error's message. Here: an effect's intent written by this call
        (nothing doubtful before it) is marked ``failed``, not sent, as it was not, so that
        the next attempt sends it without a reconciliation. An intent found open is left as
        it is. Safe to fail and to repeat: an intent left ``intended`` is reconciled by the
        next attempt, the careful way (claims: :class:`~.claims.StoreClaims`).
        """
        if name != "record_effect" or getattr(reply, "previous", None) not in ("", INTENT_NOT_SENT):
            return ""
        item, token, lease_id, key, effect = args[:5]
        detail = json.dumps("not sent: its intent was not on enough replicas in time")
        trace = args[9] if len(args) > 9 else ""
        marked = [
            item,
            token,
            lease_id,
            reply.key or key,
            effect,
            INTENT_NOT_SENT,
            detail,
            "",
            "",
            trace,
        ]
        try:
            self.scripts.call("record_effect", keys, marked)
        except REDIS_FAILURES:
            return " (the intent stays recorded: the next attempt reconciles it)"
        return " (the intent is marked failed, not sent)"

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

    A run's planner lock (a job's tick lock is
    :func:`redis_lease.protocol.store.leader.job_tick_lock`): the key holds a random owner
    token with a TTL, so a holder that dies frees it by expiry. It is released through the
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
