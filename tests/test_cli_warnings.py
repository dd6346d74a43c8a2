"""A warning that reaches the command line, a library's as much as its own, is one
``warning: ...`` line on stderr: never Python's two lines with the warning's source line."""

from __future__ import annotations

import subprocess
import sys

from tests.fleet_helpers import REPO

#: Runs ``redis-lease status`` after a library warned from inside the command, as RQ's
#: worker did when the ACL refused it CLIENT SETNAME.
PROGRAM = """
import importlib, sys, warnings
# The command line's global options check the prefix with it, imported when they run.
validation = importlib.import_module("redis_lease.protocol.validation")

checked = validation.check_id

warned = []

def check_id(value, what):
    if not warned:  # once: other checks of the command use it too
        warned.append(what)
        text = "CLIENT SETNAME command not supported, setting ip_address to unknown"
        warnings.warn(text, Warning)
    return checked(value, what)

validation.check_id = check_id
sys.argv = ["redis-lease", "--url", "fakeredis://warnings", "status", "--json"]
from redis_lease.cli import main
main()
"""


def test_a_library_warning_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", PROGRAM],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "warning: CLIENT SETNAME command not supported, setting ip_address to unknown"
    ]
    assert done.stdout.strip().startswith("[")  # the command ran: an empty list of runs
