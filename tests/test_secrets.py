"""A password never shows: every output of a fleet run against a server with ``requirepass``
(CLI views and their JSON, the tick, worker logs, metrics, dashboard pages, errors) is
searched for it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from redis_lease import LeaseStore
from redis_lease.operate.dashboard import create_app
from tests.fleet_helpers import Processes
from tests.redis_server import RedisServer
from tests.security_helpers import FLEET, Cli, fleet_env, fleet_run

pytestmark = pytest.mark.slow

PASSWORD = "Zq9-sEcReT-4417"
USER_PASSWORD = "Uv3-hIdDeN-8812"
WRONG_PASSWORD = "Wx5-wRoNg-2290"


def test_no_output_of_a_run_shows_the_password(
    private_redis: Callable[..., RedisServer], procs: Processes
) -> None:
    server = private_redis(requirepass=PASSWORD)
    assert PASSWORD in server.url
    cli = Cli(server.url, env=fleet_env("secret-q"))
    run_id = fleet_run(cli, procs, "secret-q", "2031-06-03")
    for args in (
        ("status",),
        ("status", "--json"),
        ("status", run_id),
        ("status", run_id, "--json"),
        ("runs",),
        ("runs", "--json"),
        ("items", run_id, "--json"),
        ("inspect", run_id, "item-0000"),
        ("inspect", run_id, "item-0000", "--json"),
        ("dead", run_id),
        ("dead", run_id, "--json"),
        ("metrics",),
        ("tick", FLEET),
        ("tick", FLEET, "--json"),
    ):
        cli.ok(*args)
    outputs = list(cli.outputs)

    store = LeaseStore.from_url(server.url)
    client = create_app(store, read_only=True).test_client()
    pages = ["/", f"/runs/{run_id}", f"/runs/{run_id}/items/item-0000", "/metrics", "/healthz"]
    pages += ["/rq/", "/rq/0/data/queues.json", "/rq/0/data/workers.json", "/rq/0/view/workers"]
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, page
        outputs.append(response.get_data(as_text=True))
    store.client.close()

    # Errors: a refused command, a refused login, an unreachable server.
    default = redis.Redis.from_url(server.url)
    default.execute_command("ACL", "SETUSER", "limited", "on", f">{USER_PASSWORD}", "+ping")  # type: ignore[no-untyped-call]
    default.close()
    limited = Cli(f"redis://limited:{USER_PASSWORD}@127.0.0.1:{server.port}/0")
    refused = limited.run("status")
    assert refused.returncode == 6 and "may not run" in refused.stderr
    assert "password" not in refused.stderr.lower()
    wrong = Cli(f"redis://:{WRONG_PASSWORD}@127.0.0.1:{server.port}/0").run("status")
    gone = Cli(f"redis://:{PASSWORD}@127.0.0.1:1/0").run("status")
    assert wrong.returncode == 6 and gone.returncode == 6
    outputs += [*limited.outputs, wrong.stdout, wrong.stderr, gone.stdout, gone.stderr]

    assert len(outputs) > 40 and any("***" in text for text in outputs)
    for secret in (PASSWORD, USER_PASSWORD, WRONG_PASSWORD):
        shown = [text for text in outputs if secret in text]
        assert not shown, f"{secret} shown in: {shown[0][:500]}"
