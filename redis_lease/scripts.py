"""The Lua scripts: loaded from ``lua/``, includes expanded, registered once per client.

A script file may say ``-- @include "name.lua"``; the line is replaced by
``lua/include/name.lua``. :func:`source` gives the expanded text, which is what
any other language sends with ``EVAL``/``EVALSHA``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import redis
from redis.commands.core import Script

#: Each script and the number of KEYS it takes (commit takes more: its guarded keys).
KEY_COUNTS: dict[str, int] = {
    "add_items": 7,
    "claim": 7,
    "claim_next": 7,
    "renew": 7,
    "commit": 7,
    "fail": 7,
    "release": 7,
    "reap": 7,
    "requeue": 7,
    "close_shard": 7,
    "shard_status": 7,
    "create_run": 1,
    "run_transition": 2,
    "release_lock": 1,
    "record_effect": 9,
    "slot_acquire": 2,
    "slot_release": 2,
}

_INCLUDE = re.compile(r'^-- @include "([a-z_]+\.lua)"$', re.MULTILINE)


def lua_dir() -> Path:
    """The folder of the scripts: inside the installed package, else the source tree."""
    packaged = Path(str(resources.files("redis_lease"))) / "lua"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "lua"


@cache
def source(name: str) -> str:
    """The script's text with its includes expanded."""
    folder = lua_dir()
    text = (folder / f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda m: (folder / "include" / m.group(1)).read_text(), text)


class Scripts:
    """Every script registered on one client (``register_script`` reloads on NOSCRIPT)."""

    def __init__(self, client: redis.Redis) -> None:
        self._scripts: dict[str, Script] = {
            name: client.register_script(source(name)) for name in KEY_COUNTS
        }

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]

    def run(self, name: str, keys: list[str], args: Sequence[Any], client: Any = None) -> Any:
        """Runs a script; ``client`` may be a pipeline to queue it there."""
        return self._scripts[name](keys=keys, args=args, client=client)
