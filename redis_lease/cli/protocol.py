"""``protocol``: the protocol the data under the prefix is in, and those this release speaks."""

from __future__ import annotations

import typer

from .app import app
from .options import JsonOpt, open_store


@app.command()
def protocol(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Show the protocol stamped under the prefix and the protocols this release speaks.

    A release that does not speak the stamped protocol exits 9 with one line naming
    both, as every command does (docs/upgrading.md). Writes nothing: the first worker
    stamps the protocol.
    """
    from ..operate.cli_printing import print_fields, print_json
    from ..protocol.store.stamp import PROTOCOL, SPOKEN, protocol_number, read_stamp
    from ..version import __version__

    store = open_store(ctx)  # refuses a stamp this release does not speak
    found = read_stamp(store)
    data = {
        "prefix": store.prefix,
        "stamped": protocol_number(found) if found is not None else None,
        "speaks": sorted(SPOKEN),
        "stamps": PROTOCOL,
        "release": __version__,
    }
    if as_json:
        print_json(data)
        return
    print_fields(
        {
            "prefix": store.prefix,
            "stamped": found if found is not None else f"none yet (a worker stamps {PROTOCOL})",
            "speaks": ", ".join(str(n) for n in sorted(SPOKEN)),
            "release": f"redis-lease {__version__}",
        }
    )
