"""The proxy benchmark's report, from made-up samples: added figures are ors minus direct,
targets are judged as documented, the floor is a reference row held to no target, and the
table and the plot are produced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import proxy_report
from bench.proxy_load import Samples


def _samples(ms: float, *, per_s: float, cpu_ms: float) -> Samples:
    count = 100
    seconds = [ms / 1000] * count
    return Samples(latency=seconds, first_byte=seconds, first_text=seconds, requests=count,
                   wall_s=count / per_s, cpu_s=cpu_ms * count / 1000, new_connection=[2 * ms / 1000] * 10)


def _raw(*, floor: bool = False) -> dict[str, object]:
    phases = {}
    for phase in ("c1", "c16", "c64"):
        blocks = {}
        for fmt in ("json", "sse"):
            blocks[f"{fmt}/direct"] = _samples(0.5, per_s=1000, cpu_ms=0.1)
            blocks[f"{fmt}/stored"] = _samples(2.0, per_s=50, cpu_ms=10)  # +1.5 ms, 5% of direct
            blocks[f"{fmt}/unstored"] = _samples(1.0, per_s=200, cpu_ms=3)  # +0.5 ms, 20% of direct
            if floor:
                blocks[f"{fmt}/floor"] = _samples(0.75, per_s=400, cpu_ms=1)  # +0.25 ms, 40% of direct
        phases[phase] = blocks
    streams = {"streams": 10, "hold_s": 1.0, "wall_s": 2.0, "received_text": 10, "ended_with_terminal_event": 9,
               "terminal_events": {"completed": 8, "failed": 1}, "failure_codes": {"upstream_timeout": 1}, "cut": 1,
               "errors": {}, "open_with_text_at_once": 10, "rss_mib_before": 100.0, "rss_mib_peak": 120.0,
               "rss_mib_after": 110.0, "rss_mib_timeline": [(0.0, 100.0), (0.1, 120.0)],
               "open_with_text_timeline": [(0.0, 0), (0.1, 10)]}
    chained = {"turns": 30, "completed_turns": 30, "failure": None, "early_turns": "2", "late_turns": "30",
               "alternations": 60, "early_ms": 10.0, "late_ms": 12.0, "late_over_early": 1.2,
               "sequential_early_ms": 9.0, "sequential_late_ms": 13.0, "timings_ms": [10.0] * 30}
    return {"phases": phases, "streams": streams, "chain": chained}


def test_added_figures_and_targets() -> None:
    report = proxy_report.summarize(_raw(), {"plan": {"rounds": 1, "latency_requests": 100,
                                                      "throughput_requests": 100}})
    added = report["added"]["json/stored"]
    assert added["p50_ms"] == pytest.approx(1.5)
    assert added["share_c16"] == pytest.approx(0.05)
    assert report["added"]["sse/unstored"]["first_text_ms"] == pytest.approx(0.5)
    assert report["added"]["sse/stored"]["new_connection_ms"] == pytest.approx(3.0)  # 4 ms against 1
    assert report["cpu_ms_per_request"]["json/stored"] == pytest.approx(10)
    met = {target["name"]: target["met"] for target in report["targets"]}
    assert met["added p50, json stored (ms)"] and met["added p50, json store:false (ms)"]
    assert not met["req/s at c=16 as a share of direct, json stored"]
    assert met["req/s at c=16 as a share of direct, json store:false"]
    assert not met["streams completed (response.completed), of 10"]
    assert met["streams open with text at once, of 10"]
    assert met["server RSS with the streams open (MB)"]


def _with_ors(raw: dict[str, object], *, stored_ms: float, unstored_ms: float, per_s: float) -> dict[str, object]:
    """``raw`` with ors's blocks replaced: direct answers in 0.5 ms at 1,000 req/s."""
    for blocks in raw["phases"].values():  # type: ignore[attr-defined]
        for fmt in ("json", "sse"):
            blocks[f"{fmt}/stored"] = _samples(stored_ms, per_s=per_s, cpu_ms=1)
            blocks[f"{fmt}/unstored"] = _samples(unstored_ms, per_s=per_s, cpu_ms=1)
    return raw


@pytest.mark.parametrize(("stored_ms", "unstored_ms", "per_s", "met"), [
    (4.4, 3.4, 85, True),  # +3.9 ms, +2.9 ms, 8.5% of direct
    (4.6, 3.4, 85, False),  # stored +4.1 ms
    (4.4, 3.6, 85, False),  # store:false +3.1 ms
    (4.4, 3.4, 75, False),  # 7.5% of direct
])
def test_the_targets_are_added_p50_share_at_c16_and_streams(stored_ms: float, unstored_ms: float, per_s: float,
                                                           met: bool) -> None:
    plan = {"plan": {"rounds": 1, "latency_requests": 100, "throughput_requests": 100}}
    report = proxy_report.summarize(_with_ors(_raw(), stored_ms=stored_ms, unstored_ms=unstored_ms, per_s=per_s),
                                    plan)
    held = [target for target in report["targets"] if not target["name"].startswith(("streams", "server RSS"))]
    assert len(held) == 8  # added p50 and share at c=16, for json and sse, stored and store:false
    assert all(target["met"] for target in held) is met
    limits = {target["name"]: target["limit"] for target in report["targets"]}
    assert limits["added p50, sse stored (ms)"] == "≤ 4 ms" and limits["added p50, sse store:false (ms)"] == "≤ 3 ms"
    assert limits["req/s at c=16 as a share of direct, json stored"] == "≥ 0.08"
    assert limits["server RSS with the streams open (MB)"] == "≤ 500 MB"
    # p99, time to first text and the chain are reported, held to no target
    assert not any(word in name for name in limits for word in ("p99", "first text", "chain", "turn"))


def test_written_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(proxy_report, "RESULTS", tmp_path)
    report = proxy_report.summarize(_raw(), {"plan": {"rounds": 1, "latency_requests": 100,
                                                      "throughput_requests": 100}})
    stem = proxy_report.write(report)
    assert json.loads(stem.with_suffix(".json").read_text())["added"]["json/stored"]["p50_ms"] == pytest.approx(1.5)
    assert stem.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "json store:false" in printed and "1 cut" in printed and "targets met" in printed


def test_workers_are_reported_by_count_with_their_gain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    raw = _raw()
    raw["workers"] = {
        str(count): {phase: {f"{fmt}/{path}": _samples(1.0, per_s=per_s, cpu_ms=0)
                             for fmt in ("json", "sse")
                             for path, per_s in (("direct", 1000), ("stored", 100 * count), ("unstored", 150 * count))}
                     for phase in ("c16", "c64")}
        for count in (1, 2)
    }
    monkeypatch.setattr(proxy_report, "RESULTS", tmp_path)
    report = proxy_report.summarize(raw, {"plan": {"rounds": 1, "latency_requests": 100, "throughput_requests": 100}})
    assert report["workers"]["2"]["c16"]["json/stored"]["requests_per_s"] == pytest.approx(200)
    stem = proxy_report.write(report)
    assert json.loads(stem.with_suffix(".json").read_text())["workers"]["1"]["c64"]["sse/unstored"]
    printed = capsys.readouterr().out
    assert "ors on PostgreSQL by worker processes" in printed
    assert "2 workers:   200.0 (20.0%" in printed and "x2.00" in printed


def test_the_floor_is_a_reference_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(proxy_report, "RESULTS", tmp_path)
    plan = {"plan": {"rounds": 1, "latency_requests": 100, "throughput_requests": 100}}
    report = proxy_report.summarize(_raw(floor=True), plan)
    floor = report["added"]["sse/floor"]
    assert floor["p50_ms"] == pytest.approx(0.25) and floor["share_c16"] == pytest.approx(0.4)
    assert floor["cpu_ms_per_request"] == pytest.approx(1)
    # held to no target: the same targets as without it
    assert [t["name"] for t in report["targets"]] == [t["name"] for t in proxy_report.summarize(_raw(), plan)["targets"]]
    assert not any("floor" in target["name"] for target in report["targets"])
    stem = proxy_report.write(report)
    assert json.loads(stem.with_suffix(".json").read_text())["added"]["json/floor"]["share_c64"] == pytest.approx(0.4)
    printed = capsys.readouterr().out
    assert "json floor" in printed and "sse floor" in printed
    # ors's CPU per request above the floor's: 10 - 1 stored, 3 - 1 store:false
    assert "json stored +9.00 ms" in printed and "sse store:false +2.00 ms" in printed
