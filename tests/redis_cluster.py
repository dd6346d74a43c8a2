"""Private Redis Cluster and Sentinel processes for tests, on free loopback ports.

Both classes start real ``redis-server`` processes under a given base directory and
never touch any other server. They do not depend on pytest: fixtures wrap them.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.cluster import ClusterNode, RedisCluster

from tests.redis_server import RedisServer

HOST = "127.0.0.1"
SLOTS = 16384

T = TypeVar("T")

# One contiguous slot range and the port of the primary that serves it.
SlotRange = tuple[int, int, int]


def _unique_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (all bound at once, so no repeats)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _admin(port: int) -> redis.Redis:
    """A plain RESP2 client of one server, for raw admin replies."""
    return redis.Redis(
        host=HOST,
        port=port,
        decode_responses=True,
        protocol=2,
        socket_connect_timeout=1,
        socket_timeout=5,
    )


def _log_tail(server: RedisServer, chars: int = 1500) -> str:
    path = server.directory / "redis.log"
    try:
        text = path.read_text(errors="replace")[-chars:]
    except OSError:
        text = "(no log)"
    return f"--- {HOST}:{server.port} ({server.directory.name}) ---\n{text}"


def _poll(what: str, check: Callable[[], T | None], timeout: float, interval: float = 0.05) -> T:
    """Calls ``check`` until it returns a value other than None; TimeoutError at the deadline.

    Connection and response errors count as "not yet" (a node may be restarting or
    answering CLUSTERDOWN while gossip settles).
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = check()
            if value is not None:
                return value
        except redis.RedisError as exc:
            last = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last!r})" if last else ""
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)


def _terminate(servers: Iterable[RedisServer], sig: int) -> None:
    """Signals every live process first, then waits for each."""
    live = [s.process for s in servers if s.process is not None and s.process.poll() is None]
    for process in live:
        process.send_signal(sig)
    for process in live:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


class ClusterServers:
    """A local Redis Cluster of ``size`` primaries (no replicas unless asked), one directory
    each.

    Args:
        base: directory under which each node gets ``node-<i>/``.
        size: number of primaries (at least 3 for ``redis-cli --cluster create``).
        replicas: replicas of each primary (``--cluster-replicas``): ``size * (1 + replicas)``
            nodes in all.
    """

    def __init__(self, base: Path, size: int = 3, replicas: int = 0) -> None:
        if size < 3:
            raise ValueError("a Redis Cluster needs at least 3 primaries")
        count = size * (1 + replicas)
        ports = _unique_ports(2 * count)
        self.base = base
        self.replicas = replicas
        self.nodes: list[RedisServer] = []
        for index in range(count):
            directory = base / f"node-{index}"
            directory.mkdir(parents=True, exist_ok=True)
            # The bus port is set explicitly: the default (port + 10000) may be taken or > 65535.
            server = RedisServer(
                directory,
                {
                    "cluster-enabled": "yes",
                    "cluster-config-file": "nodes.conf",
                    "cluster-node-timeout": "2000",
                    "cluster-port": str(ports[count + index]),
                },
            )
            server.port = ports[index]
            self.nodes.append(server)
        self._ids: dict[int, str] = {}

    @property
    def ports(self) -> list[int]:
        """The client ports of all nodes, in start order."""
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`` naming every node."""
        return "redis+cluster://" + ",".join(f"{HOST}:{port}" for port in self.ports)

    @property
    def node_urls(self) -> list[str]:
        """The plain ``redis://127.0.0.1:P/0`` URL of each node."""
        return [f"redis://{HOST}:{port}/0" for port in self.ports]

    def start(self, timeout: float = 30.0) -> None:
        """Starts the nodes, joins them into a cluster and waits until all agree on the slots.

        On any failure every node is killed and the error carries the tails of their logs.
        """
        deadline = time.monotonic() + timeout
        try:
            for node in self.nodes:
                node.start(timeout=max(1.0, deadline - time.monotonic()))
            self._create(max(1.0, deadline - time.monotonic()))
            self._ids = {port: self._node_id(port) for port in self.ports}
            _poll(
                "every node to report cluster_state:ok and the same full slot map",
                self._converged,
                max(1.0, deadline - time.monotonic()),
            )
        except BaseException as exc:
            self.kill()
            logs = "\n".join(_log_tail(node) for node in self.nodes)
            raise RuntimeError(f"cluster did not start: {exc}\n{logs}") from exc

    def _create(self, timeout: float) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed: apt-get install redis-tools")
        args = [cli, "--cluster", "create", *(f"{HOST}:{port}" for port in self.ports)]
        args += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed ({result.returncode}):\n"
                f"{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
            )

    def _node_id(self, port: int) -> str:
        with _admin(port) as client:
            return str(client.execute_command("CLUSTER", "MYID"))

    def _slot_map(self, port: int) -> list[SlotRange]:
        """``CLUSTER SLOTS`` of one node as sorted (start, end, primary port) ranges."""
        with _admin(port) as client:
            reply = client.execute_command("CLUSTER", "SLOTS")
        return sorted((int(r[0]), int(r[1]), int(r[2][1])) for r in reply)

    @staticmethod
    def _covers_all(ranges: list[SlotRange]) -> bool:
        expected = 0
        for start, end, _ in ranges:
            if start != expected:
                return False
            expected = end + 1
        return expected == SLOTS

    def _converged(self) -> bool | None:
        maps = []
        for port in self.ports:
            with _admin(port) as client:
                info = str(client.execute_command("CLUSTER", "INFO"))
            if "cluster_state:ok" not in info:
                return None
            maps.append(self._slot_map(port))
        if not self._covers_all(maps[0]) or any(m != maps[0] for m in maps[1:]):
            return None
        return True

    def client(self, **options: Any) -> RedisCluster:
        """A RedisCluster client of this cluster (the caller closes it)."""
        nodes = [ClusterNode(HOST, port) for port in self.ports]  # type: ignore[no-untyped-call]
        return RedisCluster(startup_nodes=nodes, **options)

    def slot_owner(self, slot: int) -> int:
        """The port of the primary serving ``slot``, as the first live node answers."""
        for port in self.ports:
            try:
                ranges = self._slot_map(port)
            except redis.ConnectionError:
                continue
            for start, end, owner in ranges:
                if start <= slot <= end:
                    return owner
            raise LookupError(f"slot {slot} is not served by any node")
        raise redis.ConnectionError("no cluster node answers")

    def primaries(self) -> list[int]:
        """The ports of the nodes that call themselves primaries, in start order."""
        result = []
        for port in self.ports:
            try:
                with _admin(port) as client:
                    role = client.execute_command("ROLE")
            except redis.ConnectionError:
                continue
            if role[0] == "master":
                result.append(port)
        return result

    def begin_migration(self, slot: int, to_port: int) -> None:
        """Marks ``slot`` IMPORTING on ``to_port`` and then MIGRATING on its current owner."""
        source = self.slot_owner(slot)
        if source == to_port:
            raise ValueError(f"slot {slot} is already served by {to_port}")
        with _admin(to_port) as target:
            target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self._ids[source])
        with _admin(source) as origin:
            origin.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self._ids[to_port])

    def _migrating_source(self, slot: int) -> tuple[int, int]:
        """(source port, target port) of a slot whose migration has begun."""
        for port in self.ports:
            with _admin(port) as client:
                nodes = str(client.execute_command("CLUSTER", "NODES"))
            for line in nodes.splitlines():
                fields = line.split()
                if "myself" not in fields[2].split(","):
                    continue
                for entry in fields[8:]:
                    marker = f"[{slot}->-"
                    if entry.startswith(marker):
                        target_id = entry[len(marker) : -1]
                        return port, self._port_of(target_id)
        raise RuntimeError(f"slot {slot} is not being migrated (call begin_migration first)")

    def _port_of(self, node_id: str) -> int:
        for port, known in self._ids.items():
            if known == node_id:
                return port
        raise LookupError(f"unknown node id {node_id}")

    def move_keys(self, slot: int, batch: int = 100) -> int:
        """MIGRATEs the keys of a migrating ``slot`` to its target until the source has none.

        Returns how many keys were moved.
        """
        source, target = self._migrating_source(slot)
        moved = 0
        with _admin(source) as origin:
            while True:
                keys = origin.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if not keys:
                    return moved
                origin.execute_command("MIGRATE", HOST, target, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)

    def finish_migration(self, slot: int, to_port: int, timeout: float = 10.0) -> None:
        """Assigns ``slot`` to ``to_port`` everywhere and waits until every node agrees.

        CLUSTER SETSLOT ... NODE goes to the target first, then the source, then the rest.
        """
        source, target = self._migrating_source(slot)
        if target != to_port:
            raise ValueError(f"slot {slot} is migrating to {target}, not {to_port}")
        order = [to_port, source] + [p for p in self.ports if p not in (to_port, source)]
        for port in order:
            with _admin(port) as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", self._ids[to_port])

        def agreed() -> bool | None:
            for port in self.ports:
                owners = [o for s, e, o in self._slot_map(port) if s <= slot <= e]
                if owners != [to_port]:
                    return None
            return True

        _poll(f"every node to name {to_port} as the owner of slot {slot}", agreed, timeout)

    def migrate_slot(self, slot: int, to_port: int, batch: int = 100) -> int:
        """Moves ``slot`` with its keys to ``to_port``; returns how many keys moved."""
        self.begin_migration(slot, to_port)
        moved = self.move_keys(slot, batch)
        self.finish_migration(slot, to_port)
        return moved

    def stop(self) -> None:
        """Stops every node (SIGTERM) and waits for them to end."""
        _terminate(self.nodes, signal.SIGTERM)

    def kill(self) -> None:
        """Kills every node (SIGKILL) and waits for them to end."""
        _terminate(self.nodes, signal.SIGKILL)


class _SentinelServer(RedisServer):
    """A ``redis-server <conf> --sentinel`` process with a generated sentinel.conf."""

    def __init__(
        self, directory: Path, port: int, primary_port: int, down_after_ms: int = 1000
    ) -> None:
        super().__init__(directory)
        self.port = port
        self.primary_port = primary_port
        self.down_after_ms = down_after_ms

    def start(self, timeout: float = 10.0) -> None:
        """Writes sentinel.conf and starts the sentinel; waits until it answers PING."""
        conf = self.directory / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\n"
            f"bind {HOST}\n"
            f"dir {self.directory}\n"
            f"logfile {self.directory / 'redis.log'}\n"
            f"sentinel monitor mymaster {HOST} {self.primary_port} 1\n"
            f"sentinel down-after-milliseconds mymaster {self.down_after_ms}\n"
            "sentinel failover-timeout mymaster 5000\n"
        )
        self.process = subprocess.Popen(
            [self.binary, str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise


class SentinelGroup:
    """A primary, one replica and one sentinel watching them as ``mymaster``.

    Args:
        base: directory under which ``primary/``, ``replica/`` and ``sentinel/`` are made.
        down_after_ms: how long the primary must not answer before the sentinel fails over.
    """

    MASTER = "mymaster"

    def __init__(self, base: Path, down_after_ms: int = 1000) -> None:
        primary_port, replica_port, sentinel_port = _unique_ports(3)
        dirs = {}
        for name in ("primary", "replica", "sentinel"):
            dirs[name] = base / name
            dirs[name].mkdir(parents=True, exist_ok=True)
        # No delay before a diskless full sync (5 s by default): replicas link at once.
        fast_sync = {"repl-diskless-sync-delay": "0"}
        self.primary = RedisServer(dirs["primary"], fast_sync)
        self.primary.port = primary_port
        self.replica = RedisServer(
            dirs["replica"], {**fast_sync, "replicaof": f"{HOST} {primary_port}"}
        )
        self.replica.port = replica_port
        self.sentinel = _SentinelServer(
            dirs["sentinel"], sentinel_port, primary_port, down_after_ms
        )

    @property
    def servers(self) -> list[RedisServer]:
        """The two data servers (initial primary first), whatever their roles now."""
        return [self.primary, self.replica]

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:S/mymaster/0``."""
        return f"redis+sentinel://{HOST}:{self.sentinel.port}/{self.MASTER}/0"

    def start(self, timeout: float = 30.0) -> None:
        """Starts all three; waits for replication and for the sentinel to know both servers.

        On any failure all three are killed and the error carries their logs' tails.
        """
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        try:
            self.primary.start(timeout=left())
            self.replica.start(timeout=left())
            self.sentinel.start(timeout=left())
            _poll("the replica's master link", self._replica_linked, left())
            _poll("the sentinel to see primary and replica", self._sentinel_sees_both, left())
        except BaseException as exc:
            self.kill()
            logs = "\n".join(_log_tail(s) for s in (self.primary, self.replica, self.sentinel))
            raise RuntimeError(f"sentinel group did not start: {exc}\n{logs}") from exc

    def _replica_linked(self) -> bool | None:
        with _admin(self.replica.port) as client:
            info = client.info("replication")
        return True if info.get("master_link_status") == "up" else None

    def _sentinel_sees_both(self) -> bool | None:
        if self.primary_port() != self.primary.port:
            return None
        with _admin(self.sentinel.port) as client:
            replicas = client.execute_command("SENTINEL", "REPLICAS", self.MASTER)
        for flat in replicas:
            # RESP2 replies are flat [name, value, ...] lists per replica.
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            # A replica can be promoted once the sentinel has its INFO (info-refresh is
            # the time since then, or the epoch in ms before the first one).
            if (
                int(fields["port"]) == self.replica.port
                and fields["flags"] == "slave"
                and fields["master-link-status"] == "ok"
                and int(fields["info-refresh"]) < 30_000
            ):
                return True
        return None

    def primary_port(self) -> int:
        """The primary's port as the sentinel names it now."""
        with _admin(self.sentinel.port) as client:
            _host, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.MASTER)
        return int(port)

    def _server_at(self, port: int) -> RedisServer:
        for server in self.servers:
            if server.port == port:
                return server
        raise LookupError(f"no server of this group listens on {port}")

    def _promoted(self, old_port: int) -> int | None:
        """The new primary's port once the sentinel names it and it answers ROLE master."""
        now = self.primary_port()
        if now == old_port:
            return None
        with _admin(now) as client:
            role = client.execute_command("ROLE")
        return now if role[0] == "master" else None

    def failover(self, timeout: float = 30.0) -> int:
        """Runs ``SENTINEL FAILOVER mymaster`` and waits for the other server to take over.

        Returns the new primary's port.
        """
        deadline = time.monotonic() + timeout
        old = self.primary_port()

        def accepted() -> bool:
            # NOGOODSLAVE until the sentinel has fresh INFO from the replica: retried.
            with _admin(self.sentinel.port) as client:
                client.execute_command("SENTINEL", "FAILOVER", self.MASTER)
            return True

        _poll("the sentinel to accept SENTINEL FAILOVER", accepted, timeout)
        return self.wait_for_new_primary(old, max(1.0, deadline - time.monotonic()))

    def kill_primary(self) -> int:
        """SIGKILLs the server the sentinel names as primary; returns its port."""
        port = self.primary_port()
        self._server_at(port).kill()
        return port

    def wait_for_new_primary(self, old_port: int, timeout: float = 30.0) -> int:
        """Polls until the sentinel names a primary other than ``old_port`` that answers
        ROLE as master; returns its port.
        """
        return _poll(f"a primary other than {old_port}", lambda: self._promoted(old_port), timeout)

    def stop(self) -> None:
        """Stops all three (SIGTERM) and waits for them to end."""
        _terminate([self.sentinel, self.primary, self.replica], signal.SIGTERM)

    def kill(self) -> None:
        """Kills all three (SIGKILL) and waits for them to end."""
        _terminate([self.sentinel, self.primary, self.replica], signal.SIGKILL)
