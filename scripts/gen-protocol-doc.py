#!/usr/bin/env python3
"""Writes docs/protocol.md from the headers of lua/*.lua and lua/include/limits.json.

Every script's purpose, KEYS, ARGV (with their bounds), counters, log entries, replies
and error replies come from its header, so the document cannot drift from the scripts:
tests/test_protocol_doc.py compares this script's output with the committed file.

    scripts/gen-protocol-doc.py          rewrite docs/protocol.md
    scripts/gen-protocol-doc.py --check  exit 1 when docs/protocol.md is out of date
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Each error code: its fields, what it means, the Python and Node.js classes, the CLI exit.
CODES = (
    ("INVALID", "free text", "a bad argument or key; nothing written", "InvalidInput", 2),
    (
        "LEASE_LOST",
        "item, token, current_token, state, reason (state, token, lease, expired), expires_at",
        "the caller does not hold the lease: stop, do not commit",
        "LeaseLost",
        3,
    ),
    (
        "CONDITION_FAILED",
        "item, condition (1-based)",
        "a guarded commit's condition failed; nothing written, the lease kept",
        "ConditionFailed",
        3,
    ),
    (
        "NOT_CLAIMABLE",
        "item, state, until (ms)",
        "leased by another, not yet due, or finished",
        "NotClaimable",
        4,
    ),
    ("RUN_CLOSED", "run, reason (closed, deadline), deadline", "no lease granted", "RunClosed", 4),
    ("NOT_FOUND", "item, or run", "no such item or run", "NotFound", 5),
)
ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "lua"
DOC = ROOT / "docs" / "protocol.md"

SHARD_KEYS = ("meta", "counts", "items", "due", "leases", "held", "dead", "attempts")
SHARD_KEY_WHAT = {
    "meta": "run, shard, max_attempts, backoff_base_ms, backoff_cap_ms, deadline_at, closed",
    "counts": "done and the event counters",
    "items": "item id -> packed record; `<id>#r` the result, `<id>#e` the last errors",
    "due": "pending items by eligible-at (ms)",
    "leases": "leased items by lease expiry (ms)",
    "held": "leased items by lease start (ms)",
    "dead": "dead items by time of death (ms)",
    "attempts": "the attempt log, one entry per ended attempt",
}
#: The types a key may be documented to hold (what TYPE answers), or ``any type``.
KEY_TYPES = "hash|zset|set|list|string|stream|any type"
#: A key of a script's own (not a shard's): ``name: type, what it holds``.
_OWN_KEY = re.compile(rf"^([a-z_]+): ({KEY_TYPES}), (.*)$")
#: A shard key in include/shard_keys.lua's header: ``KEYS[n] name     type: what``.
_SHARD_KEY = re.compile(rf"^--\s+KEYS\[\d+\] ([a-z]+) +({KEY_TYPES}):", re.MULTILINE)
SHARD_TAG = "<prefix>:{<run_id>#<shard>}"
_JOB, _ADHOC = "`<prefix>:job:{<job>}", "`<prefix>:adhoc:{adhoc}"
_TALLIES = f"{_JOB}:tallies` (ad-hoc runs: {_ADHOC}:tallies`)"
#: Key patterns of the keys that are not a shard's seven or its attempt log.
OTHER_KEYS = {
    ("commit", "9..."): (
        "any key with no hash tag or the shard's `{<run_id>#<shard>}` (never another tag); "
        f"a key under `<prefix>:` must carry the shard's tag (`{SHARD_TAG}:...`); never one "
        "of the shard's own keys"
    ),
    ("create_run", "1"): "`<prefix>:run:{<run_id>}`",
    ("run_transition", "1"): "`<prefix>:run:{<run_id>}`",
    ("run_transition", "2"): "`<prefix>:run:{<run_id>}:events`",
    ("record_effect", "9"): f"`{SHARD_TAG}:effects`",
    ("record_effect", "10"): f"`{SHARD_TAG}:effects_unknown`",
    ("shard_status", "8"): f"`{SHARD_TAG}:effects_unknown`",
    ("slot_acquire", "1"): "`<prefix>:provider:{<name>}:slots`",
    ("slot_acquire", "2"): "`<prefix>:provider:{<name>}:state`",
    ("slot_release", "1"): "`<prefix>:provider:{<name>}:slots`",
    ("slot_release", "2"): "`<prefix>:provider:{<name>}:state`",
    ("release_lock", "1"): "any lock key, e.g. `<prefix>:run:{<run_id>}:planner`",
    ("record_job_failure", "1"): "`<prefix>:run:{<run_id>}`",
    ("end_failure_streak", "1"): "`<prefix>:run:{<run_id>}`",
    ("start_backoff", "1"): "`<prefix>:run:{<run_id>}`",
    ("record_age", "1"): "`<prefix>:run:{<run_id>}`",
    ("record_age", "2"): "`<prefix>:run:{<run_id>}:ages`",
    ("count_finished", "1"): _TALLIES,
    ("count_finished", "2"): f"{_JOB}:finished_runs` (ad-hoc runs: {_ADHOC}:finished_runs`)",
    ("count_missed", "1"): _TALLIES,
    ("count_missed", "2"): f"{_JOB}:dates`",
    ("record_lost_run", "1"): _TALLIES,
    ("record_lost_run", "2"): f"{_JOB}:lost` (ad-hoc runs: {_ADHOC}:lost`)",
    ("observe_data_set", "1"): "`<prefix>:dataset`",
    ("tick_leader", "1"): "`<prefix>:{tick_leader}`",
    ("declare_jobs", "1"): "`<prefix>:{tick_leader}:declared`",
    ("declare_jobs", "2"): "`<prefix>:{tick_leader}:declared:seen`",
    ("tick_lock", "1"): f"{_JOB}:tick`",
    ("tick_lock", "2"): f"{_JOB}:tick:fence`",
}
_START = re.compile(r"^(KEYS\[[^\]]+\]|ARGV\[[^\]]+\]|\(no ARGV\)|Counters:|Log:|Returns:|Errors:)")
_KIND = re.compile(r"\((id\??|int|num|json|text|one of [^)]+)(?:, bound ([a-z_]+))?\)")
_BOUND_WORD = re.compile(r"\bbound ([a-z_]+)\b|\bat most ([a-z_]+) (?:pairs|groups|ids)\b")


@dataclass
class Header:
    """A script's header, in its parts."""

    name: str
    purpose: list[str] = field(default_factory=list)
    #: Each KEYS or ARGV: (position, its line and continuation lines, as indented).
    keys: list[tuple[str, list[str]]] = field(default_factory=list)
    argv: list[tuple[str, list[str]]] = field(default_factory=list)
    #: Counters, Log, Returns, Errors: their lines.
    sections: dict[str, list[str]] = field(default_factory=dict)


def header_lines(path: Path) -> list[str]:
    """The comment lines that open a script, up to its first include or code line."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("--") or line.startswith("-- @include"):
            break
        lines.append(line[3:] if line.startswith("-- ") else line[2:])
    return lines


def parse(path: Path) -> Header:
    """Splits a script's header into its purpose, KEYS, ARGV and titled sections."""
    lines = header_lines(path)
    body = lines.index("") if "" in lines else len(lines)
    first = lines[0].removeprefix(f"{path.stem}: ").strip()
    purpose = [first[:1].upper() + first[1:], *lines[1:body]]
    header = Header(path.stem, purpose)
    blocks: list[tuple[str, str, list[str]]] = []  # (KEYS or ARGV, position, lines)
    current: list[str] | None = None
    for line in lines[body:]:
        if not line:
            continue
        found = _START.match(line)
        if found is None:
            if current is None:
                raise SystemExit(f"{path.name}: header line outside a block: {line!r}")
            current.append(line.rstrip())
            continue
        word, rest = found.group(1), line[found.end() :].strip()
        if word.startswith("KEYS") and ", KEYS[" in line:  # the shard's keys, named
            header.keys += [(n, [name]) for n, name in re.findall(r"KEYS\[(\d+)\] ([a-z]+)", line)]
            current = None
        elif word.startswith(("KEYS", "ARGV")):
            current = [rest]
            blocks.append((word[:4], word[5:-1], current))
        elif word == "(no ARGV)":
            current = None
        else:
            current = [rest] if rest else []
            header.sections[word.rstrip(":")] = current
    for kind, position, block in blocks:
        (header.keys if kind == "KEYS" else header.argv).append((position, block))
    return header


def shard_key_types() -> dict[str, str]:
    """Each shard key's type, by name, from include/shard_keys.lua's header."""
    text = (LUA / "include" / "shard_keys.lua").read_text()
    return dict(_SHARD_KEY.findall(text))


def limits() -> dict[str, Any]:
    """The parsed limits.json."""
    data: dict[str, Any] = json.loads((LUA / "include" / "limits.json").read_text())
    return data


def cell(text: str) -> str:
    """Text for Markdown (a table cell): pipes escaped, ``<`` as an entity outside code."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def joined(lines: list[str]) -> str:
    """A header entry as one cell: a continuation (indented 2) goes on the same line, a
    line of a nested list (indented more) on a line of its own."""
    out = cell(lines[0].strip())
    for line in lines[1:]:
        nested = len(line) - len(line.lstrip()) > 2
        out += ("<br>" if nested else " ") + cell(line.strip())
    return out


def dedent(lines: list[str]) -> list[str]:
    """A section's lines without the two spaces that mark a continuation."""
    return [line.removeprefix("  ") for line in lines]


def bounds_of(text: str, bounds: dict[str, list[int]]) -> str:
    """The bounds an ARGV's text names, as ``name: low to high``."""
    names = dict.fromkeys(a or b for a, b in _BOUND_WORD.findall(text))
    return "; ".join(f"{n}: {bounds[n][0]} to {bounds[n][1]}" for n in names if n in bounds)


def kinds_of(text: str) -> str:
    """The kinds an ARGV's text names (``id``, ``int``, ``one of a|b`` ...)."""
    return ", ".join(dict.fromkeys(f"`{kind}`" for kind, _ in _KIND.findall(text)))


def summary(header: Header) -> str:
    """The first sentence of a script's purpose."""
    text = " ".join(header.purpose)
    return cell(text.split(". ")[0].rstrip("."))


def render_script(header: Header, bounds: dict[str, list[int]]) -> list[str]:
    """One script's section."""
    out = [f"### `{header.name}`", "", cell(" ".join(header.purpose)), ""]
    if header.keys:
        out += ["| KEYS | key | type | pattern |", "| --- | --- | --- | --- |"]
        for position, block in header.keys:
            text = " ".join(line.strip() for line in block)
            if text in SHARD_KEYS:
                pattern = f"`{SHARD_TAG}:{text}`"
                what, kind = cell(f"{text} ({SHARD_KEY_WHAT[text]})"), shard_key_types()[text]
            else:
                own = _OWN_KEY.match(text)
                if own is None:
                    raise SystemExit(
                        f"{header.name}.lua: KEYS[{position}] must read 'name: type, what it holds'"
                    )
                pattern = OTHER_KEYS.get((header.name, position), "")
                what, kind = cell(f"{own.group(1)} ({own.group(3)})"), own.group(2)
            out.append(f"| {position} | {what} | {kind} | {pattern} |")
        out.append("")
    if header.argv:
        out += ["| ARGV | argument | kind | bound |", "| --- | --- | --- | --- |"]
        for position, block in header.argv:
            text = " ".join(line.strip() for line in block)
            kinds, ranges = kinds_of(text), bounds_of(text, bounds)
            out.append(f"| {position} | {joined(block)} | {cell(kinds)} | {ranges} |")
        out.append("")
    else:
        out += ["No ARGV.", ""]
    for title in ("Counters", "Log"):
        if title in header.sections:
            out += [f"**{title}:** {joined(header.sections[title])}", ""]
    for title in ("Returns", "Errors"):
        if title in header.sections:
            out += [f"**{title}:**", "", "```text", *dedent(header.sections[title]), "```", ""]
    return out


INTRO = """\
# The protocol: Lua scripts any language can send

<!-- Generated by scripts/gen-protocol-doc.py from the headers of lua/*.lua and
lua/include/limits.json: edit those, then run the script. tests/test_protocol_doc.py
fails when this file is out of date. -->

redis-lease keeps no state outside Redis and does nothing to it but through the scripts
of `lua/`: a client in any language that can send `EVALSHA` takes part in the
same runs, under the same fence, as the Python library. Two clients do: the Python one
(`redis_lease`) and a Node.js one (`clients/node/`). This page says
what a client sends and what it gets back, for every script.

## The protocol stamp

This page is protocol 1. The protocol the data under a prefix is in is stamped in the
string `<prefix>:protocol` (a decimal number). Before its first script a client reads it
(`GET`); where there is none, a worker stamps the protocol it writes
(`SET <prefix>:protocol <n> NX`, then `GET` again if another stamped first). A client that
does not speak the stamped number sends nothing and stops, naming both numbers (the
Python and Node.js clients raise `ProtocolMismatch`; the CLI and `worker.js` exit 9).
[upgrading.md](upgrading.md) says which releases speak which protocol and how it changes.

## Sending a script

1. Read `lua/<name>.lua` and expand its includes (below). The expanded text is the script.
2. Its SHA1 (hex, of the UTF-8 text) names it: send `EVALSHA <sha1> <numkeys> KEYS... ARGV...`.
3. A `NOSCRIPT` error means the server does not have it (a new server, a restart, a
   `SCRIPT FLUSH`): send `SCRIPT LOAD <text>` and the same `EVALSHA` again. A call
   refused with `NOSCRIPT` did not run; both clients try up to three times.
4. Every argument is sent as a string (integers in decimal). Replies are RESP: Lua
   numbers arrive as integers, strings as bulk strings, tables as arrays.
5. All keys of one call share one hash tag, so on Redis Cluster each call goes to one slot.
   A commit's guarded keys may have no tag at all; on Redis Cluster give them the
   shard's tag too, or the call spans slots and the server refuses it.

### Expanding includes

A line that is exactly `-- @include "<name>.lua"` is replaced by the text of
`lua/include/<name>.lua`, itself expanded the same way (includes nest). Each file is
expanded at most once per script: a second include of it becomes an empty line. A line
`-- @include "limits.json"` becomes, after the whole expansion, the single line

    local LIMITS = {bounds = {<name> = {<low>, <high>}, ...}, defaults = {<name> = <value>, ...},
      run_states = {<name> = {<word>, ...}, ...}}

(shown here on two lines), holding each table of `limits.json` (`bounds`, `defaults`,
`run_states`) in the file's order, each with only the entries whose names occur as words
(`[A-Za-z_]+`) in the expanded text (a table with none stays, empty); strings are written
as JSON strings, lists as `{a, b}`, tables as `{k = v, ...}`, with `, ` between entries.
Files are read as UTF-8 with `\\n` line ends.
`limits.json` holds integers and strings only (in lists and tables), never floats: a
float's decimal text differs between languages, and so would the SHA1.
(`redis_lease/scripts.py` `source(name)` and `clients/node/scripts.js` `source(name)` do
exactly this.)

### The SHA check

A client's expansion is right when its SHA1 of every script equals the Python one's:

    .venv/bin/python - <<'EOF'
    import hashlib
    from redis_lease.limits import lua_dir
    from redis_lease import source
    for path in sorted(lua_dir().glob("*.lua")):
        print(path.stem, hashlib.sha1(source(path.stem).encode()).hexdigest())
    EOF
    echo '{"op": "scripts"}' | node clients/node/ops.js redis://127.0.0.1:6379/0

`SCRIPT LOAD` answers the SHA1 the server computed, a third check.
tests/test_node_client.py compares all three for every script.

## Keys

Every key starts with the store's prefix (`rl` unless set). A run has `shards` shards
(1 to 1024); an item's shard is `crc32(utf8(item_id)) % shards` (CRC-32 as zlib's), and
the shard count is the field `shards` of the run's hash `<prefix>:run:{<run_id>}`.
A shard's keys share the hash tag `{<run_id>#<shard>}`:

| # | key | type | pattern | holds |
| --- | --- | --- | --- | --- |
@shard_keys@

The scripts that change a shard take its seven keys in this order; those that end
attempts (claim, claim_next, renew, commit, fail, release, settle, reap, record_effect)
take the attempt log as the eighth. The scripts check the keys before their first write:
one base, the names in this order, a hash tag, and each key's type (what `TYPE` answers;
a missing key is fine). Anything else is `INVALID` and changes nothing: a key of another
type is `INVALID KEYS[<n>] (<name>) holds a <type>, not a <type>`, never Redis's own
`WRONGTYPE` after part of the writes. Every script's keys and their types are in its
section below. A commit's guarded keys may be of any type: each write checks the type it
needs first (`INVALID write <n> needs a <type> but key <k> holds a <type>`).

## Arguments

Each ARGV has a kind, checked before the first write (a bad one is `INVALID ARGV[n] ...`
and nothing changes):

| kind | accepted |
| --- | --- |
| `id` | 1 to 200 characters from `A-Z a-z 0-9 _ - . : @ / + =` |
| `id?` | an id, or `''` for none |
| `int` | a decimal integer (`-?[0-9]+`, at most 15 characters) within its bound |
| `num` | a finite decimal number (an exponent allowed; no `nan`, `inf`, hex) within its bound |
| `text` | UTF-8 text whose length in bytes is within its bound |
| `json` | strict UTF-8 JSON, at most `json_depth` deep, within its bound (raw and escaped) |
| `one of a\\|b` | exactly one of the words (`''` is the empty string) |

An argument with a default may be left out or sent as `''`.

### Bounds (`lua/include/limits.json`)

Each bound is `[lowest, highest]`, both allowed.

| bound | lowest | highest |
| --- | --- | --- |
@bounds@

### Defaults

| default | value |
| --- | --- |
@defaults@

### Run states

A run's record holds its state (`state`), one of these words; a run is created `running`
unless `create_run` is told `planning`, and `run_transition` moves it between them.

| run states | words |
| --- | --- |
@run_states@

## Replies and errors

Times in replies are milliseconds on the server clock (`TIME`), the only clock that
decides lease expiry. A claim row is
`{item id, token, lease id, expires_at ms, attempt, payload, takeover 0|1, now ms}`;
the payload is the JSON text as added (`''` for null).

A script that refuses answers an error reply `CODE key=value ...`. Read the fields by
name (later versions may add some); a refusal writes nothing but its counters and, for
`LEASE_LOST`, one attempt-log entry.

| code | fields | meaning | Python | Node.js | CLI exit |
| --- | --- | --- | --- | --- | --- |
@codes@

## The holder's part

A claim answers a fencing token (it goes up by one on every claim of the item, never
back) and a lease id. The holder sends both with every renew, commit, fail and release,
with its trace id (`id?`, logged) as the last argument. Once a call answers `LEASE_LOST`,
the lease is gone for good: another holder may have the item; the holder stops and never
retries the write. A commit repeated with the same token and lease id answers
`repeated` with the stored result and writes nothing, so a commit whose reply was lost
may be sent again. Leases are renewed well before `expires_at` (the Python worker renews
every third of the TTL); a lease is expired at `expires_at` on the server clock, whatever
the holder's clock says.

An external effect goes through `record_effect`: first with ARGV[8] `'1'` (record the
intent unless an attempt is open) and ARGV[11] the lease's TTL, so that the same call
checks the lease and renews it right before the provider call. A reply whose previous
state is `intended` or `unknown` means the effect may have been applied (an earlier
attempt, or a run made again after a loss of data: its record then says `after_loss`):
the holder asks the provider by the key, sends the same key again only to a provider that
dedupes by key, or stops and leaves it to an operator; it records `intended` again (with
ARGV[11]) right before it sends. What each kind of provider is then promised:
[effects and idempotency](concepts/effects-and-idempotency.md#what-each-provider-is-promised).

## Scripts

@index@

"""


def render() -> str:
    """The whole document."""
    table = limits()
    bounds: dict[str, list[int]] = table["bounds"]
    defaults: dict[str, Any] = table["defaults"]
    headers = [parse(path) for path in sorted(LUA.glob("*.lua"))]
    types = shard_key_types()
    shard_rows = "\n".join(
        f"| {n} | {name} | {types[name]} | `{SHARD_TAG}:{name}` | {cell(SHARD_KEY_WHAT[name])} |"
        for n, name in enumerate(SHARD_KEYS, 1)
    )
    parts = {
        "shard_keys": shard_rows,
        "bounds": "\n".join(f"| `{n}` | {lo} | {hi} |" for n, (lo, hi) in bounds.items()),
        "defaults": "\n".join(f"| `{n}` | `{json.dumps(v)}` |" for n, v in defaults.items()),
        "run_states": "\n".join(
            f"| `{part}` | {', '.join(f'`{w}`' for w in words)} |"
            for part, words in table["run_states"].items()
        ),
        "codes": "\n".join(
            f"| `{code}` | {fields} | {meaning} | `{name}` | `{name}` | {exit_code} |"
            for code, fields, meaning, name, exit_code in CODES
        ),
        "index": "\n".join(f"- [`{h.name}`](#{h.name}): {summary(h)}" for h in headers),
    }
    intro = INTRO
    for name, text in parts.items():
        intro = intro.replace(f"@{name}@", text)
    lines = [intro.rstrip("\n"), ""]
    for header in headers:
        lines += render_script(header, bounds)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    """Writes the document, or with ``--check`` says whether it is up to date."""
    text = render()
    if argv[1:] == ["--check"]:
        if DOC.read_text() != text:
            print(
                "docs/protocol.md is out of date: run scripts/gen-protocol-doc.py", file=sys.stderr
            )
            return 1
        return 0
    if argv[1:]:
        print("usage: scripts/gen-protocol-doc.py [--check]", file=sys.stderr)
        return 2
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
