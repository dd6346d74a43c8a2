"""The pure parts of benchmarks/peers.py and peers_report.py: medians, ratios, figures and the
JSON report.

Nothing here starts a worker or times anything: the rounds are made up.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import peers, peers_report


def _round(items: int, seconds: float, cpu: float, commands: float) -> peers_report.Round:
    return peers_report.Round(
        items=items, seconds=seconds, cpu_seconds=cpu, commands=commands, startup_seconds=0.5
    )


def _figures(rate: float, us: float, commands: float) -> dict[str, dict[str, object] | None]:
    # one round per handler whose rate, CPU and commands per item are the given ones
    rounds = {
        handler: [_round(1000, 1000 / rate, us * 1000 / 1e6, commands * 1000)]
        for handler in peers.HANDLERS
    }
    return {handler: peers_report.summarize(rs, 1000) for handler, rs in rounds.items()}


def test_median_of_odd_and_even_counts_and_of_none() -> None:
    assert peers_report.median([3.0, 1.0, 2.0]) == 2.0
    assert peers_report.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert peers_report.median([]) is None


def test_ratio_is_ours_over_theirs_and_none_when_it_cannot_be_taken() -> None:
    assert peers_report.ratio(9000.0, 3000.0) == 3.0
    assert peers_report.ratio(1.0, 3.0) == 0.33
    assert peers_report.ratio(None, 3.0) is None
    assert peers_report.ratio(3.0, None) is None
    assert peers_report.ratio(3.0, 0.0) is None


def test_a_round_gives_rate_cpu_and_commands_per_item() -> None:
    measured = _round(items=2000, seconds=0.5, cpu=0.1, commands=22_000)
    assert measured.items_per_s == 4000.0
    assert measured.server_us_per_item == pytest.approx(50.0)
    assert measured.commands_per_item == 11.0
    assert _round(items=0, seconds=0.0, cpu=0.0, commands=0).items_per_s == 0.0


def test_summarize_takes_the_median_of_each_figure_separately() -> None:
    rounds = [
        _round(1000, 1.0, 0.050, 10_000),  # 1000/s, 50 us, 10 commands
        _round(1000, 0.5, 0.030, 12_000),  # 2000/s, 30 us, 12 commands
        _round(1000, 0.25, 0.070, 11_000),  # 4000/s, 70 us, 11 commands
    ]
    figure = peers_report.summarize(rounds, 1000)
    assert figure["items_per_s"] == 2000.0
    assert figure["server_us_per_item"] == 50.0
    assert figure["commands_per_item"] == 11.0
    assert figure["items"] == 1000
    assert [r["items_per_s"] for r in figure["rounds"]] == [1000.0, 2000.0, 4000.0]


def test_summarize_of_no_rounds_has_no_figures() -> None:
    figure = peers_report.summarize([], 500)
    assert figure["items_per_s"] is None
    assert figure["rounds"] == []


def test_the_report_marks_an_unavailable_peer_null_with_its_reason() -> None:
    figures: peers_report.FigureMap = {
        "redis_lease": _figures(rate=8000, us=60, commands=11),
        "bullmq": None,
        "rq_simple": _figures(rate=500, us=300, commands=55),
        "rq_fork": _figures(rate=80, us=800, commands=58),
        "celery": _figures(rate=1000, us=100, commands=9),
    }
    cycles = {"lease_cycles_per_s": 3000.0, "lock_cycles_per_s": 6000.0, "ratio": 0.5}
    report = peers_report.build_report(
        figures,
        {"bullmq": "Node.js and npm are not installed: apt-get install nodejs npm"},
        cycles,
        {"mode": "quick", "load_average": {"start": [0.5, 0.4, 0.3], "end": [1.0, 0.5, 0.3]}},
    )
    decoded = json.loads(json.dumps(report))
    assert decoded["mode"] == "quick"
    assert decoded["peers"]["bullmq"] is None
    assert "nodejs" in decoded["unavailable"]["bullmq"]
    assert decoded["ratios"]["bullmq"] is None
    assert set(decoded["peers"]) == set(peers.PEERS)
    assert set(decoded["ratios"]) == set(peers.PEERS) - {"redis_lease"}
    rq_noop = decoded["ratios"]["rq_simple"]["noop"]
    assert rq_noop == {"items_per_s": 16.0, "server_us_per_item": 0.2, "commands_per_item": 0.2}
    assert decoded["ratios"]["celery"]["20ms"]["items_per_s"] == 8.0
    assert decoded["redis_lease_cycle_vs_lock"]["ratio"] == 0.5
    for handler in peers.HANDLERS:
        figure = decoded["peers"]["redis_lease"][handler]
        assert set(figure) >= {"items_per_s", "server_us_per_item", "commands_per_item", "items"}


def test_a_handler_that_failed_has_no_ratio() -> None:
    ours = _figures(rate=8000, us=60, commands=11)
    theirs = _figures(rate=500, us=300, commands=55)
    theirs["20ms"] = None
    ratios = peers_report.peer_ratios({"redis_lease": ours, "rq_simple": theirs})
    assert ratios["rq_simple"] is not None
    assert ratios["rq_simple"]["20ms"] == {
        "items_per_s": None,
        "server_us_per_item": None,
        "commands_per_item": None,
    }
    assert ratios["rq_simple"]["1ms"]["items_per_s"] == 16.0


def test_the_table_shows_figures_ratios_and_the_unavailable_peer() -> None:
    figures: peers_report.FigureMap = {
        "redis_lease": _figures(rate=8000, us=60, commands=11),
        "bullmq": None,
        "celery": _figures(rate=1000, us=100, commands=9),
    }
    report = peers_report.build_report(figures, {"bullmq": "no node"}, None, {})
    text = peers_report.table(report)
    assert "| bullmq | - | | unavailable: no node |" in text
    assert "| celery | noop | 1000 | 1,000 | 100.0 | 9.0 | 8.00x | 0.60x | 1.22x |" in text


def test_item_counts_grow_in_full_mode_and_shrink_without_overlap() -> None:
    quick = peers.item_counts("quick", overlap=True)
    full = peers.item_counts("full", overlap=True)
    for handler in peers.HANDLERS:
        assert set(quick[handler]) - {peers.C32} == set(peers.PEERS)
        assert all(full[handler][p] > quick[handler][p] for p in quick[handler])
    # the concurrency-32 run has its one handler only
    assert [h for h in peers.HANDLERS if peers.C32 in quick[h]] == [peers.C32_HANDLER]
    sequential = peers.item_counts("quick", overlap=False)
    assert sequential["20ms"]["redis_lease"] == peers.SEQUENTIAL_LEASE_ITEMS["quick"]["20ms"]
    assert sequential["20ms"]["redis_lease"] < quick["20ms"]["redis_lease"]
    assert sequential["20ms"]["bullmq"] == quick["20ms"]["bullmq"]
    assert peers.ITEMS["quick"]["20ms"]["redis_lease"] == quick["20ms"]["redis_lease"]


def test_the_command_line_keeps_the_peer_order_and_refuses_unknown_peers() -> None:
    args = peers.parse_args(["--quick", "--peers", "celery,redis_lease"])
    assert args.peers == ["redis_lease", "celery"]
    assert args.quick
    with pytest.raises(SystemExit):
        peers.parse_args(["--peers", "sidekiq"])
    with pytest.raises(SystemExit):
        peers.parse_args(["--rounds", "0"])
    assert peers.parse_args([]).peers == [*peers.PEERS, peers.C32]
    assert peers.parse_args([]).handlers == list(peers.HANDLERS)
    assert peers.parse_args(["--handlers", "20ms,noop"]).handlers == ["noop", "20ms"]
    with pytest.raises(SystemExit):
        peers.parse_args(["--handlers", "5ms"])
    with pytest.raises(SystemExit):
        peers.parse_args(["--handlers", ","])


def test_the_concurrency_32_run_is_its_own_entry_with_its_ratio_against_rq() -> None:
    ours = {"20ms": _figures(rate=3000, us=45, commands=0.8)["20ms"]}
    rq = _figures(rate=85, us=500, commands=57)
    extra = peers_report.concurrency_run(ours, "20ms", 32, 3200.0, rq)
    assert extra["concurrency"] == 32 and extra["handler"] == "20ms"
    assert extra["items_per_s_vs_rq_simple"] == 35.29
    assert extra["of_ideal"] == 0.938
    figures: peers_report.FigureMap = {
        "redis_lease": _figures(rate=1500, us=45, commands=0.8),
        "rq_simple": rq,
    }
    report = json.loads(json.dumps(peers_report.build_report(figures, {}, None, {}, extra)))
    assert set(report["peers"]) == {"redis_lease", "rq_simple"}, "not one of the peers"
    assert set(report["ratios"]) == {"rq_simple"}
    assert report["redis_lease_c32"]["figure"]["items_per_s"] == 3000.0
    text = peers_report.table(report)
    assert "| redis_lease at concurrency 32 | 20ms | 1000 | 3,000 | 45.0 | 0.8 " in text
    assert "| 35.29x rq_simple |" in text
    # not run, or RQ missing: no ratio, no row
    missing = peers_report.concurrency_run(ours, "20ms", 32, 3200.0, None)
    assert missing["items_per_s_vs_rq_simple"] is None
    assert peers_report.concurrency_run(None, "20ms", 32, 3200.0, rq)["of_ideal"] is None
    assert "concurrency 32" not in peers_report.table(
        peers_report.build_report(figures, {}, None, {})
    )


def test_peer_calls_leave_out_the_harness_info_and_polls() -> None:
    before = peers.Snapshot(cpu=1.0, calls={"info": 10, "evalsha": 100, "zcard": 50})
    after = peers.Snapshot(
        cpu=2.0, calls={"info": 11, "evalsha": 160, "zcard": 90, "hgetall": 20, "multi": 4}
    )
    # 4 polls, each a MULTI, 10 ZCARD and 5 HGETALL: all but 60 EVALSHA are the harness's
    calls = peers.peer_calls(before, after, {"multi": 1, "zcard": 10, "hgetall": 5}, polls=4)
    assert calls == {"evalsha": 60}
    assert sum(calls.values()) == 60


def test_peer_calls_keep_what_the_peer_ran_besides_the_polls() -> None:
    before = peers.Snapshot(cpu=0.0, calls={"llen": 3})
    after = peers.Snapshot(cpu=0.0, calls={"llen": 23, "brpop": 7})
    assert peers.peer_calls(before, after, {"llen": 2}, polls=5) == {"llen": 10, "brpop": 7}
