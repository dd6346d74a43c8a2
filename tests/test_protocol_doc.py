"""docs/protocol.md cannot drift from the scripts: it is what scripts/gen-protocol-doc.py
makes of the lua/ headers now, and it names every script, KEYS, ARGV, bound and error code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from redis_lease.limits import lua_dir, table
from redis_lease.protocol.error_replies import SCRIPT_CODES

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "protocol.md"
GENERATOR = ROOT / "scripts" / "gen-protocol-doc.py"
SCRIPTS = sorted(path.stem for path in lua_dir().glob("*.lua"))


def header(name: str) -> str:
    """The comment lines that open a script, up to its first include or code line."""
    lines = []
    for line in (lua_dir() / f"{name}.lua").read_text().splitlines():
        if not line.startswith("--") or line.startswith("-- @include"):
            break
        lines.append(line)
    return "\n".join(lines)


def section(name: str) -> str:
    """The doc's section of one script: from its heading to the next."""
    text = DOC.read_text()
    start = text.index(f"\n### `{name}`\n")
    end = text.find("\n### ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_the_doc_is_what_the_generator_makes_of_the_headers_now() -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_doc_lists_every_key_and_argument_of_the_script(name: str) -> None:
    text = section(name)
    keys_part, _, argv_part = text.partition("| ARGV |")
    keys = re.findall(r"KEYS\[(\d+(?:\.\.\.)?)\]", header(name))
    argv = re.findall(r"ARGV\[(\d+(?:\.\.\.)?)\]", header(name).split("\n-- Returns")[0])
    assert keys, f"{name}.lua names no KEYS in its header"
    for position in keys:
        assert f"\n| {position} | " in keys_part, f"KEYS[{position}] of {name} is not listed"
    for position in dict.fromkeys(argv):
        assert f"\n| {position} | " in argv_part, f"ARGV[{position}] of {name} is not listed"
    if not argv:
        assert "No ARGV." in text
    for bound in re.findall(r"\bbound ([a-z_]+)", header(name)):
        lowest, highest = table()["bounds"][bound]
        assert f"{bound}: {lowest} to {highest}" in text


def test_the_doc_names_every_error_code_and_bound() -> None:
    text = DOC.read_text()
    for code in SCRIPT_CODES:
        assert f"| `{code}` |" in text, f"error code {code} is not in the table"
    for bound, (lowest, highest) in table()["bounds"].items():
        assert f"| `{bound}` | {lowest} | {highest} |" in text


def test_the_generator_refuses_an_unknown_option_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--bogus"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (2, "usage: scripts/gen-protocol-doc.py [--check]\n")


def leaves(value: object) -> list[object]:
    """The scalars inside nested lists and tables."""
    if isinstance(value, list):
        return [leaf for item in value for leaf in leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in leaves(item)]
    return [value]


def test_limits_hold_integers_and_strings_only() -> None:
    # A float's decimal text differs between languages: the expanded scripts' SHA1 would too.
    data = json.loads((lua_dir() / "include" / "limits.json").read_text())
    for part in ("bounds", "defaults", "run_states"):
        odd = [v for v in leaves(data[part]) if type(v) not in (int, str)]
        assert not odd, f"limits.json {part} holds {odd}: use integers or strings"
    assert "integers and strings only" in DOC.read_text()
