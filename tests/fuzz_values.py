"""Hypothesis strategies shared by the fuzz tests (test_fuzz_*.py), and their settings.

Values are built per kind, as the scripts' headers name them (``int``, ``num``, ``id``,
``text``, ``json``, ``one of``): valid ones, and ones pushed past the bounds of
``lua/include/limits.json``. :func:`fuzz_settings` gives every fuzz test its example count,
raisable for long runs with ``FUZZ_EXAMPLES=N`` (N examples per test), no deadline, and a
``@reproduce_failure`` blob printed with every failure (failures are also kept in
hypothesis's database, ``.hypothesis/``).
"""

from __future__ import annotations

import json
import os
import re
import string
from functools import cache
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings

from redis_lease import limits
from redis_lease.protocol.scripts import KEY_COUNTS
from tests.test_registry import ANNOTATION, header

NAMES = sorted(KEY_COUNTS)
ID_CHARS = string.ascii_letters + string.digits + "_-.:@/+="
ID_MAX = limits.ID_MAX_LENGTH
JSON_MAX = limits.JSON_MAX_BYTES


def examples(default: int) -> int:
    """``default``, or ``FUZZ_EXAMPLES`` when it is set (for long runs)."""
    raw = os.environ.get("FUZZ_EXAMPLES", "")
    return int(raw) if raw.strip() else default


def fuzz_settings(default: int) -> settings:
    """Settings of every fuzz test: ``default`` examples, no deadline, failures replayable."""
    return settings(
        max_examples=examples(default),
        deadline=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


# -- values ---------------------------------------------------------------------------------

NUMBER_FORMS = [
    "nan", "-nan", "NaN", "inf", "-inf", "Infinity", "1e309", "-1e309", "0x10", "0X1F", "-0x1",
    "1e3", "1E3", "1e-3", "2.5e2", "+5", " 5", "5 ", "5\n", "05", "-0", "0.0", "1.", ".5", "-",
    "", "1_000", "0b1", "1e", "e5", "--1", "\u0661", "\uff15", "1,5", "9" * 15, "9" * 16,
    "1" + "0" * 40, "0" * 50 + "1", "4e-400",
]  # fmt: skip
#: Words of every ``one of`` argument, and near misses.
WORDS = [
    "1", "0", "", "planning", "running", "succeeded", "partial", "failed", "canceled", "ok",
    "throttled", "error", "intended", "applied", "unknown", "*", "RUNNING", " ok", "ok\x00",
    "true", "yes",
]  # fmt: skip
#: Text that is not UTF-8: a stray byte, overlong, a surrogate, past U+10FFFF, cut short.
NOT_UTF8 = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"a\x80b"]
#: Text a JSON parser might be lenient about.
NEAR_JSON = [
    "nan", "NaN", "inf", "Infinity", "-Infinity", "0x10", "+1", "01", "1e400", " 1", "[1,]",
    "{'a': 1}", '"\\ud800"', '"\\u0000"', '{"a": 1, "a": 2}', "[1] [2]", "", "tru", "null",
    '""', "[]", "{}", "[", '"', "-", "1.", ".5",
]  # fmt: skip


def numbers() -> st.SearchStrategy[Any]:
    """Numbers as text in every form: special, huge, negative, hex, exponents; also raw."""
    return st.one_of(
        st.sampled_from(NUMBER_FORMS),
        st.integers(-(2**70), 2**70).map(str),
        st.floats().map(repr),
        st.integers(-(2**40), 2**40).map(hex),
        st.builds("{}e{}".format, st.integers(-999, 999), st.integers(-400, 400)),
        st.integers(-(2**63), 2**63),
    )


def around(bound: str) -> st.SearchStrategy[str]:
    """Whole numbers at and just past both ends of a bound, and decimals near them."""
    low, high = limits.bound(bound)
    edges = [low - 1, low, low + 1, high - 1, high, high + 1, 0, -1, 2 * high]
    return st.sampled_from(edges).map(str) | st.sampled_from(
        [f"{high}.0", f"{low}.5", f"{high}e0", f"{high}.5", f"{low}e-1"]
    )


def valid_ids(max_size: int = 12) -> st.SearchStrategy[str]:
    """Ids the protocol accepts."""
    return st.text(ID_CHARS, min_size=1, max_size=max_size)


def ids() -> st.SearchStrategy[Any]:
    """Ids: valid, around the length limit, with a foreign character, empty, any text."""
    foreign = st.sampled_from(list("{}# \t\n\x00\x7f\u00e9\u20ac\U0001f600\\\"'%*?[]")) | (
        st.characters()
    )
    return st.one_of(
        valid_ids(),
        st.integers(ID_MAX - 2, ID_MAX + 2).map(lambda n: "i" * n),
        st.builds(lambda a, c, b: a + c + b, valid_ids(4), foreign, valid_ids(4)),
        st.just(""),
        st.text(max_size=12),
        st.sampled_from(NOT_UTF8),
    )


def texts(bound: str | None) -> st.SearchStrategy[Any]:
    """Text: short, not UTF-8, or sized around the bound in one- and two-byte characters."""
    high = limits.bound(bound)[1] if bound else 4000
    sized = st.builds(
        lambda n, ch: ch * n,
        st.integers(-2, 2).map(lambda d: high + d),
        st.sampled_from(["x", "\u00e9"]),
    )
    return st.one_of(st.text(max_size=20), st.sampled_from(NOT_UTF8), sized, st.just(""))


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=12,
)


def _huge(char: str, count: int) -> str:
    return json.dumps(char * count, ensure_ascii=False)


def json_texts() -> st.SearchStrategy[Any]:
    """JSON text of random shapes, nested past every depth, sized around the bound (raw and
    escaped as stored), not UTF-8, or text a lenient parser might take for JSON."""
    deep = st.builds(
        lambda depth, as_list: (
            ("[" * depth + "]" * depth) if as_list else ('{"a":' * depth + "1" + "}" * depth)
        ),
        st.sampled_from([31, 32, 33, 100, 1001]),
        st.booleans(),
    )
    # For each character: raw bytes per character in the JSON text, and bytes once escaped.
    huge = st.sampled_from(
        [("x", 1, 1), ("/", 1, 2), ('"', 2, 4), ("\u00e9", 2, 2), ("\x7f", 1, 6)]
    )
    sized = huge.flatmap(
        lambda spec: st.integers((JSON_MAX - 4) // spec[2] - 2, (JSON_MAX - 2) // spec[1] + 2).map(
            lambda n: _huge(spec[0], n)
        )
    )
    return st.one_of(
        st.builds(lambda v, a: json.dumps(v, ensure_ascii=a), JSON_VALUES, st.booleans()),
        deep,
        sized,
        st.sampled_from(NOT_UTF8).map(lambda b: b'"' + b + b'"'),
        st.sampled_from(NEAR_JSON),
        st.text(max_size=20),
    )


def garbage() -> st.SearchStrategy[Any]:
    """Anything a client could send: text, bytes, numbers."""
    return st.one_of(st.text(max_size=20), st.binary(max_size=20), numbers())


Kind = tuple[str, str | None, list[str] | None]


def value_for(kind: Kind | None) -> st.SearchStrategy[Any]:
    """Hostile values for an argument of ``kind`` (from its header), or garbage."""
    if kind is None:
        return garbage()
    name, bound, words = kind
    specific: st.SearchStrategy[Any]
    if name in ("int", "num"):
        specific = around(bound) | numbers() if bound else numbers()
    elif name.startswith("id"):
        specific = ids()
    elif name == "json":
        specific = json_texts()
    elif name == "text":
        specific = texts(bound)
    else:
        specific = st.sampled_from(words or [""]) | st.sampled_from(WORDS)
    return st.one_of(specific, garbage())


@cache
def argv_kinds(name: str) -> tuple[dict[int, Kind], int, list[Kind], str | None]:
    """A script's documented ARGV: fixed kinds by index, the variadic tail's first index,
    its kinds and the bound of its group count."""
    fixed: dict[int, Kind] = {}
    first, rest, most = 0, [], None
    for line in header(name):
        match = re.match(r"ARGV\[(\d+)(\.\.\.)?\]", line)
        if not match:
            continue
        found: list[Kind] = [
            (
                "one" if one else kind,
                bound or None,
                [w.strip("'") for w in one.split("|")] if one else None,
            )
            for kind, bound, one in ANNOTATION.findall(line)
        ]
        if match.group(2):
            first, rest = int(match.group(1)), found
            bound = re.search(r"at most (\w+)", line)
            most = bound.group(1) if bound else None
        else:
            fixed[int(match.group(1))] = found[0]
    if first and most is None:  # the bound is on the header's next line
        text_ = " ".join(header(name))
        bound = re.search(r"at most (\w+) (?:pairs|ids)", text_)
        most = bound.group(1) if bound else None
    return fixed, first, rest, most


# -- guard specs ----------------------------------------------------------------------------

CONDITION_OPS = ["equals", "exists", "missing"]
WRITE_OPS = ["hset", "hdel", "sadd", "srem", "zadd", "zrem", "del"]
NONSENSE_OPS = ["eval", "set", "HSET", "", "incr", "flushall"]


def _well_formed(keys: int, writes: bool) -> st.SearchStrategy[Any]:
    """Documented specs naming keys 1..keys, with data of the documented shapes."""
    key = st.integers(1, max(keys, 1))
    word = st.sampled_from(["f", "n", "m", "x", ""]) | st.text(max_size=4)
    scalar = word | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False)

    def spec(op: str, **data: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.fixed_dictionaries({"do" if writes else "if": st.just(op), "key": key, **data})

    if not writes:
        return spec("exists") | spec("missing") | spec("equals", field=word, value=scalar)
    members = st.lists(scalar, min_size=1, max_size=3)
    return st.one_of(
        spec("hset", fields=st.dictionaries(word, scalar, min_size=1, max_size=3)),
        spec("hdel", fields=st.lists(word, min_size=1, max_size=3)),
        spec("sadd", members=members) | spec("srem", members=members),
        spec("zrem", members=members),
        spec("zadd", scores=st.dictionaries(word, st.integers() | st.floats(), min_size=1)),
        spec("del"),
    )


def guard_json(keys: int, writes: bool) -> st.SearchStrategy[Any]:
    """Conditions (or writes) as JSON: documented specs; nonsense ops, keys and data; other
    shapes; too many specs; any JSON or text."""
    scalar = st.one_of(
        st.text(max_size=6), st.integers(-(2**64), 2**64), st.floats(), st.none(), st.booleans()
    )
    number = st.one_of(st.integers(-1, keys + 1), st.floats(), st.text(max_size=2), st.none())
    data = st.one_of(
        st.dictionaries(st.text(max_size=4), scalar | JSON_VALUES, max_size=3),
        st.lists(scalar | JSON_VALUES, max_size=3),
        scalar,
    )
    ops = st.sampled_from(WRITE_OPS if writes else CONDITION_OPS) | st.sampled_from(NONSENSE_OPS)
    nonsense = st.fixed_dictionaries(
        {"do" if writes else "if": ops, "key": number},
        optional={"field": scalar, "value": scalar | JSON_VALUES, "fields": data,
                  "members": data, "scores": data},
    )  # fmt: skip
    many = st.integers(limits.GUARD_SPECS_MAX - 1, limits.GUARD_SPECS_MAX + 1).map(
        lambda n: [{"if": "exists", "key": 1}] * n
    )
    good = _well_formed(keys, writes)
    other = st.one_of(many, JSON_VALUES, st.dictionaries(st.text(max_size=3), good, max_size=2))
    branches = {
        "good": st.lists(good, max_size=3).map(json.dumps),
        "mixed": st.lists(good | nonsense, max_size=4).map(lambda v: json.dumps(v, allow_nan=True)),
        "other": other.map(lambda v: json.dumps(v, allow_nan=True)) | json_texts() | st.just("[]"),
    }
    return st.sampled_from(["good", "good", "mixed", "other"]).flatmap(branches.__getitem__)


def mostly(usual: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``usual`` three times in four, else ``other`` (so that many calls get past the checks)."""
    return st.integers(0, 3).flatmap(lambda n: other if n == 3 else usual)
