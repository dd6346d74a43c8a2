"""benchmarks/cluster.py: its pure parts (counters, spread, medians, the scale-out arithmetic,
the report) on made-up rounds, and one short real run on private servers.
"""

from __future__ import annotations

import json
import shutil

import pytest

from benchmarks import cluster as bench


def _usage(cpu: float, scripts: float, other: float = 0.0) -> bench.Usage:
    return bench.Usage(cpu, {"evalsha": scripts, "zadd": other} if other else {"evalsha": scripts})


def _round(
    backend: str,
    items: int,
    seconds: float,
    nodes: dict[str, bench.Usage],
    shards: dict[str, int] | None = None,
    shard_items: dict[str, int] | None = None,
) -> bench.Round:
    return bench.Round(
        backend=backend,
        items=items,
        seconds=seconds,
        startup_seconds=0.5,
        nodes=nodes,
        rq=bench.Usage(0.001, {}),
        load_1m=1.0,
        shards=shards or {},
        shard_items=shard_items or {},
    )


def test_usage_leaves_out_the_polls_and_the_info_and_never_goes_below_zero() -> None:
    before = bench.Snapshot(cpu=1.0, calls={"info": 4, "evalsha": 100, "hget": 10})
    after = bench.Snapshot(cpu=1.5, calls={"info": 5, "evalsha": 160, "hget": 50, "zadd": 7})
    poll = bench.Usage(cpu=0.01, calls={"hget": 4.0})
    used = bench.usage(before, after, poll, polls=10, info_cpu=0.1)
    assert used.calls == {"evalsha": 60, "zadd": 7}  # the 40 HGET and the INFO were the harness's
    assert used.scripts == 60 and used.commands == 67
    assert used.cpu == pytest.approx(0.5 - 0.1 - 0.1)
    idle = bench.usage(before, bench.Snapshot(1.01, before.calls), poll, polls=10, info_cpu=0.1)
    assert idle.cpu == 0.0 and idle.calls == {}


def test_a_round_sums_its_servers_and_shares_them_out() -> None:
    measured = _round(
        "cluster",
        items=2000,
        seconds=0.5,
        nodes={"primary-1": _usage(0.06, 150, 50), "primary-2": _usage(0.04, 50)},
        shards={"primary-1": 10, "primary-2": 6},
        shard_items={"primary-1": 1300, "primary-2": 700},
    )
    assert measured.items_per_s == 4000.0
    assert measured.server_us_per_item == pytest.approx(50.0)
    assert measured.scripts_per_item == 0.1
    assert measured.commands_per_item == 0.125
    assert measured.spread() == {
        "primary-1": {"shards": 10, "items": 1300, "script_share": 0.75, "cpu_share": 0.6},
        "primary-2": {"shards": 6, "items": 700, "script_share": 0.25, "cpu_share": 0.4},
    }
    data = measured.to_dict()
    assert data["node_us_per_item"] == {"primary-1": 30.0, "primary-2": 20.0}
    assert data["rq_server_us_per_item"] == 0.5
    assert _round("one", 0, 0.0, {"one": _usage(0.0, 0)}).items_per_s == 0.0


def test_the_spread_totals_the_rounds_and_takes_the_median_busiest_primary() -> None:
    shares = [(0.5, 0.3, 0.2), (0.4, 0.3, 0.3), (0.34, 0.33, 0.33)]
    rounds = [
        _round(
            "cluster",
            1000,
            1.0,
            {f"p{i}": _usage(share, 1000 * share) for i, share in enumerate(row)},
            {f"p{i}": n for i, n in enumerate((8, 5, 3))},
            {f"p{i}": int(1000 * share) for i, share in enumerate(row)},
        )
        for row in shares
    ]
    summary = bench.spread_summary(rounds)
    assert summary["rounds"] == 3
    assert summary["per_primary"]["p0"]["shards"] == 24
    assert summary["per_primary"]["p1"]["items"] == 300 + 300 + 330
    assert summary["per_primary"]["p0"]["script_share"] == round(1.24 / 3, 3)
    assert summary["busiest_script_share"] == 0.4
    assert summary["busiest_cpu_share"] == 0.4
    assert summary["busiest_shards"] == 8.0
    assert bench.spread_summary([])["busiest_script_share"] is None


def test_the_scale_out_arithmetic() -> None:
    figures = bench.scale_out(
        one_us=50.0, cluster_us=60.0, busiest_share=0.5, one_rate=8000.0, workers=2, nproc=2
    )
    assert figures["one_core_items_per_s"] == 20_000  # 1e6 / 50
    assert figures["separate_machines_items_per_s"] == 60_000  # 3 x that
    assert figures["separate_machines_items_per_s_cluster_cost"] == 50_000  # 3e6 / 60
    assert figures["separate_machines_items_per_s_measured_spread"] == 33_333  # 1e6 / 30
    assert figures["items_per_s_per_worker_here"] == 4000.0
    assert figures["workers_needed"] == 15  # 60,000 / 4,000
    assert "2 cores" in figures["caveat"] and "not the scale-out figure" in figures["caveat"]
    lines = bench.arithmetic_lines(figures)
    assert lines[0].endswith("1e6 / 50.0 = 20,000 items/s")
    assert "~3 x 20,000 = 60,000 items/s" in lines[1]
    assert lines[-1] == figures["caveat"]
    missing = bench.scale_out(None, None, None, None, 2, 2)
    assert missing["separate_machines_items_per_s"] is None and missing["workers_needed"] is None
    assert bench.arithmetic_lines(missing)[0].startswith("scale-out arithmetic: no server CPU")


def test_the_report_has_medians_the_ratio_the_spread_and_the_arithmetic() -> None:
    one = [_round("one", 1000, seconds, {"one": _usage(0.05, 100)}) for seconds in (0.25, 0.2, 0.5)]
    spread_nodes = {"primary-1": _usage(0.03, 60), "primary-2": _usage(0.02, 40)}
    cluster = [
        _round("cluster", 1000, 0.25, spread_nodes, {"primary-1": 9, "primary-2": 7}),
        _round("cluster", 1000, 0.5, spread_nodes, {"primary-1": 8, "primary-2": 8}),
    ]
    for number, measured in enumerate(one, 1):
        measured.number = number
    for number, measured in enumerate(cluster, 1):
        measured.number = number
    context = {"workers": 2, "machine": {"nproc": 2}, "load_average": {"start": [1.0]}}
    report = bench.build_report({"one": one, "cluster": cluster}, 1000, context)
    decoded = json.loads(json.dumps(report))
    assert decoded["figures"]["one"]["items_per_s"] == 4000.0  # median of 4000, 5000, 2000
    assert decoded["figures"]["cluster"]["items_per_s"] == 3000.0  # median of 4000, 2000
    assert decoded["ratio_cluster_over_one"] == {"items_per_s": 0.75, "server_us_per_item": 1.0}
    # round by round: 4000 / 4000 and 2000 / 5000; round 3 has no cluster run to pair with
    assert decoded["paired_ratios"] == {"items_per_s": {"1": 1.0, "2": 0.4}, "median": 0.7}
    assert decoded["spread"]["per_primary"]["primary-1"]["shards"] == 17
    assert decoded["scale_out"]["one_core_items_per_s"] == 20_000
    assert decoded["scale_out"]["busiest_primary_share"] == 0.6
    text = bench.table(decoded)
    assert "| one | 1000 | 4,000 | 4,000 / 5,000 / 2,000 | 50.0 | one 50.0 |" in text
    assert "| primary-2 |  | 15 | 0 | 0.4 | 0.4 |" in text
    assert "ratio cluster / one: items/s 0.75x" in text
    assert "round by round 1.0x / 0.4x (median 0.7x)" in text
    assert decoded["scale_out"]["caveat"] in text


def test_the_command_line_bounds() -> None:
    args = bench.parse_args(["--quick", "--rounds", "2", "--warmup", "0"])
    assert args.quick and args.rounds == 2 and args.warmup == 0
    for bad in (["--rounds", "0"], ["--items", "3"], ["--workers", "0"], ["--handler-ms", "-1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
    reason="needs redis-server and redis-cli",
)
def test_a_short_real_run_measures_both_sides_and_the_spread(
    capsys: pytest.CaptureFixture[str],
) -> None:
    items = 1600
    argv = ["--quick", "--rounds", "1", "--items", str(items), "--warmup", "0", "--json"]
    assert bench.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failures"] == {}
    for side in bench.BACKENDS:
        figure = report["figures"][side]
        (measured,) = figure["rounds"]
        assert 0 < measured["items"] <= items and measured["failed"] == 0
        assert figure["items_per_s"] > 0 and figure["server_us_per_item"] > 0
        assert figure["scripts_per_item"] > 0
    assert set(report["figures"]["one"]["node_us_per_item"]) == {"one"}
    primaries = report["spread"]["per_primary"]
    assert len(primaries) == bench.PRIMARIES
    assert sum(p["shards"] for p in primaries.values()) == bench.SHARDS
    assert sum(p["items"] for p in primaries.values()) == items
    assert sum(p["script_share"] for p in primaries.values()) == pytest.approx(1.0, abs=0.01)
    assert report["scale_out"]["one_core_items_per_s"] > 0
