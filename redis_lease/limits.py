"""The protocol's bounds and defaults, defined once in ``lua/include/limits.json``.

The same file is expanded into the Lua prelude (``LIMITS``), so a bound checked
here is the bound the scripts enforce: Python and Lua cannot drift apart.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any


def lua_dir() -> Path:
    """The folder of the scripts: inside the installed package, else the source tree."""
    packaged = Path(str(resources.files("redis_lease"))) / "lua"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "lua"


@cache
def table() -> dict[str, Any]:
    """The parsed ``limits.json``: ``bounds`` (name -> [low, high]) and ``defaults``."""
    data: dict[str, Any] = json.loads((lua_dir() / "include" / "limits.json").read_text())
    return data


def bound(name: str) -> tuple[int, int]:
    """The inclusive ``(low, high)`` bound called ``name``."""
    low, high = table()["bounds"][name]
    return low, high


def default(name: str) -> Any:
    """The default called ``name``."""
    return table()["defaults"][name]


TTL_MIN_MS, TTL_MAX_MS = bound("ttl_ms")
DELAY_MAX_MS = bound("delay_ms")[1]
ATTEMPTS_MAX = bound("attempts")[1]
BATCH_MAX = bound("batch")[1]
ADD_BATCH_MAX = bound("add_batch")[1]
SWEEP_MAX = bound("sweep")[1]
SHARD_COUNT_MAX = bound("shard_count")[1]
TOKEN_MAX = bound("token")[1]
TIME_MAX_MS = bound("time_ms")[1]
CAP_MAX = bound("cap")[1]
ID_MAX_LENGTH = bound("id_length")[1]
JSON_MAX_BYTES = bound("json_bytes")[1]
ERROR_MAX_BYTES = bound("error_bytes")[1]
TEXT_MAX_BYTES = bound("text_bytes")[1]
GUARD_SPECS_MAX = bound("guard_specs")[1]
JSON_MAX_DEPTH = bound("json_depth")[1]
CONCURRENCY_MAX = bound("concurrency")[1]

DEFAULT_PREFIX: str = default("prefix")
DEFAULT_TTL: float = default("lease_ttl_ms") / 1000
#: Seconds between a shard job's heartbeats (and a worker's).
HEARTBEAT: float = default("heartbeat_ms") / 1000
#: Milliseconds a heartbeat lives: a shard job silent this long is taken for dead, and
#: its leases are taken over (:mod:`redis_lease.fleet.takeover`).
DEAD_AFTER_MS: int = default("dead_after_ms")
DEAD_AFTER: float = DEAD_AFTER_MS / 1000
DEFAULT_MAX_ATTEMPTS: int = default("max_attempts")
DEFAULT_BACKOFF_BASE: float = default("backoff_base_ms") / 1000
DEFAULT_BACKOFF_CAP: float = default("backoff_cap_ms") / 1000
DEFAULT_RETENTION_DAYS: int = default("retention_days")
DEFAULT_SWEEP: int = default("sweep")
ATTEMPT_LOG_CAP: int = default("attempt_log")
ERROR_HISTORY: int = default("error_history")
