"""Facts written once: the exit codes only in docs/reference/exit-codes.md (and that table
is every code the command line uses, no other), the metrics table only in
docs/reference/metrics.md, the ACL lines only in docs/security.md. Other pages link."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import redis_lease.cli
from redis_lease import errors
from tests.doc_pages import pages

ROOT = Path(__file__).resolve().parent.parent
EXIT_CODES = "docs/reference/exit-codes.md"
#: typer's (click's) usage error: an unknown option, a missing argument.
USAGE_EXIT = 2


def error_codes() -> dict[str, int]:
    """Every error class of the library that sets its own exit code: its code."""
    return {
        name: value.__dict__["exit_code"]
        for name, value in vars(errors).items()
        if inspect.isclass(value) and "exit_code" in value.__dict__
    }


def exit_constants() -> dict[str, int]:
    """The command line's ``*_EXIT`` constants, from every module of redis_lease.cli."""
    found: dict[str, int] = {}
    for module in vars(redis_lease.cli).values():
        if inspect.ismodule(module) and module.__name__.startswith("redis_lease.cli"):
            for name, value in vars(module).items():
                if name.endswith("_EXIT") and isinstance(value, int):
                    found[name] = value
    return found


def exit_rows() -> dict[int, str]:
    """The rows of the exit-code table: code -> the row's text."""
    text = (ROOT / EXIT_CODES).read_text()
    rows = re.findall(r"^\| (\d+) \|(.*)$", text, re.MULTILINE)
    codes = [int(code) for code, _ in rows]
    assert codes == sorted(set(codes)), "one row per code, in order"
    return {int(code): rest for code, rest in rows}


def test_the_exit_code_table_is_every_code_the_command_line_uses() -> None:
    constants = exit_constants()
    assert {"TICK_FAILED_EXIT", "JOBS_FAILED_EXIT", "WAIT_TIMED_OUT_EXIT"} <= set(constants)
    used = {0, USAGE_EXIT, *error_codes().values(), *constants.values()}
    documented = set(exit_rows())
    assert used - documented == set(), "codes the command line uses without a row"
    assert documented - used == set(), "rows of codes nobody uses"


def test_each_error_class_is_named_in_the_row_of_its_code() -> None:
    rows = exit_rows()
    for name, code in error_codes().items():
        assert f"`{name}`" in rows[code].split("|")[-2], (name, code)
    for code, row in rows.items():
        for name in re.findall(r"`(\w+)`", row.split("|")[-2]):
            assert getattr(errors, name).exit_code == code, (name, code)


@pytest.mark.parametrize(
    ("fact", "pattern", "home"),
    [
        ("the exit-code table", r"^\| *Code *\| *Meaning", EXIT_CODES),
        ("the metrics table", r"^\| `redis_lease_\w+`", "docs/reference/metrics.md"),
        ("the ACL lines", r"ACL SETUSER rl-", "docs/security.md"),
    ],
)
def test_a_fact_is_written_on_one_page(fact: str, pattern: str, home: str) -> None:
    found = [path for path, text in pages().items() if re.search(pattern, text, re.MULTILINE)]
    assert found == [home], f"{fact} belongs on {home} only (other pages link to it)"
