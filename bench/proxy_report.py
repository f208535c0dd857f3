"""What the proxy benchmark's figures mean: the added cost of ors over the stub, held to
the targets; a printed table, ``bench/results/proxy-<time>.json`` and ``.png``.

Added figures are differences of the same quantile, ors minus direct, measured by the
same client in the same rounds. Throughput is given as a share of direct's. The floor
(:mod:`bench.floor`, when measured) gets the same figures as a reference row, held to no
target: what the stack itself costs on the machine. Targets, each in both formats:

* added latency p50 <= 4 ms stored, <= 3 ms with ``store: false``;
* throughput at concurrency 16 >= 8% of direct, stored or not;
* 1,000 streams open at once, each completed (``response.completed``), under 500 MB RSS.

The other figures (p99, time to first text, the ``previous_response_id`` chain, worker
processes) are reported beside them, held to no target.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.proxy_load import Samples
from bench.report_files import RESULTS, write_report

PATHS = {"stored": "stored", "unstored": "store:false"}
FLOOR = "floor"
ADDED_P50_MS = {"stored": 4.0, "unstored": 3.0}
SHARE_C16 = 0.08
STREAM_RSS_MB = 500.0


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile (``nan`` for no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _ms(values: list[float], q: float) -> float:
    return quantile(values, q) * 1000


def _figures(samples: Samples) -> dict[str, float]:
    return {"p50_ms": _ms(samples.latency, 0.5), "p99_ms": _ms(samples.latency, 0.99),
            "first_byte_p50_ms": _ms(samples.first_byte, 0.5), "first_text_p50_ms": _ms(samples.first_text, 0.5),
            "new_connection_p50_ms": _ms(samples.new_connection, 0.5),
            "requests_per_s": samples.requests / samples.wall_s if samples.wall_s else math.nan,
            "cpu_ms_per_request": samples.cpu_s * 1000 / samples.requests if samples.requests else math.nan,
            "requests": samples.requests, "failures": samples.failures}


def summarize(raw: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """The report: every block's figures, the added ones, the targets and the samples."""
    phases: dict[str, dict[str, Samples]] = raw["phases"]
    figures = {phase: {key: _figures(samples) for key, samples in blocks.items()} for phase, blocks in phases.items()}
    cpu: dict[str, float] = {}
    for key in phases["c1"]:
        total = Samples()
        for blocks in phases.values():
            total.merge(blocks[key])
        cpu[key] = total.cpu_s * 1000 / total.requests if total.requests else math.nan
    added: dict[str, dict[str, float]] = {}
    for fmt in ("json", "sse"):
        direct = {phase: figures[phase][f"{fmt}/direct"] for phase in figures}
        for path in _rows(figures):
            ors = {phase: figures[phase][f"{fmt}/{path}"] for phase in figures}
            added[f"{fmt}/{path}"] = {
                "p50_ms": ors["c1"]["p50_ms"] - direct["c1"]["p50_ms"],
                "p99_ms": ors["c1"]["p99_ms"] - direct["c1"]["p99_ms"],
                "first_byte_ms": ors["c1"]["first_byte_p50_ms"] - direct["c1"]["first_byte_p50_ms"],
                "first_text_ms": ors["c1"]["first_text_p50_ms"] - direct["c1"]["first_text_p50_ms"],
                "new_connection_ms": ors["c1"]["new_connection_p50_ms"] - direct["c1"]["new_connection_p50_ms"],
                **{f"share_{phase}": ors[phase]["requests_per_s"] / direct[phase]["requests_per_s"]
                   for phase in figures if phase != "c1"},
                "cpu_ms_per_request": cpu[f"{fmt}/{path}"],
            }
    workers = None
    if raw.get("workers"):
        workers = {count: {phase: {key: _figures(samples) for key, samples in blocks.items()}
                           for phase, blocks in phases_of.items()}
                   for count, phases_of in raw["workers"].items()}
    report = {"context": context, "figures": figures, "cpu_ms_per_request": cpu, "added": added,
              "streams": raw["streams"], "chain": raw["chain"], "workers": workers,
              "samples": {phase: {key: {"latency_ms": [round(v * 1000, 3) for v in samples.latency],
                                        "first_text_ms": [round(v * 1000, 3) for v in samples.first_text],
                                        "new_connection_ms": [round(v * 1000, 3) for v in samples.new_connection]}
                                  for key, samples in blocks.items()}
                          for phase, blocks in phases.items()}}
    report["targets"] = _targets(report)
    return report


def _rows(figures: dict[str, dict[str, Any]]) -> list[str]:
    """The paths with added figures: ors's, then the floor if it was measured."""
    return [*PATHS, *([FLOOR] if f"json/{FLOOR}" in figures["c1"] else [])]


def _label(path: str) -> str:
    return PATHS.get(path, path)


def _target(name: str, value: float | None, limit: float, unit: str, *, at_least: bool = False) -> dict[str, Any]:
    met = value is not None and not math.isnan(value) and (value >= limit if at_least else value <= limit)
    return {"name": name, "value": value, "limit": ("≥ " if at_least else "≤ ") + f"{limit:g}{unit}", "met": met}


def _targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []
    for fmt in ("json", "sse"):
        for path, label in PATHS.items():
            added = report["added"][f"{fmt}/{path}"]
            where = f"{fmt} {label}"
            targets += [
                _target(f"added p50, {where} (ms)", added["p50_ms"], ADDED_P50_MS[path], " ms"),
                _target(f"req/s at c=16 as a share of direct, {where}", added["share_c16"], SHARE_C16, "",
                        at_least=True),
            ]
    streams = report["streams"]
    if streams:
        count = streams["streams"]
        targets += [
            _target(f"streams open with text at once, of {count}", streams["open_with_text_at_once"], count, "",
                    at_least=True),
            _target(f"streams completed (response.completed), of {count}",
                    streams["terminal_events"].get("completed", 0), count, "", at_least=True),
            _target("server RSS with the streams open (MB)", streams["rss_mib_peak"] * 1.048576, STREAM_RSS_MB,
                    " MB"),
        ]
    return targets


def _print(report: dict[str, Any]) -> None:
    figures, added = report["figures"], report["added"]
    plan = report["context"]["plan"]
    print(f"\nproxy: ors in front of a stub upstream vs the stub directly, interleaved in {plan['rounds']} rounds "
          f"({plan['latency_requests']} sequential, {plan['throughput_requests']} per concurrency, per row)")
    for fmt in ("json", "sse"):
        c1, c16, c64 = (figures[phase][f"{fmt}/direct"] for phase in ("c1", "c16", "c64"))
        print(f"  direct {fmt}: p50 {c1['p50_ms']:.2f} ms, p99 {c1['p99_ms']:.2f} ms, first text "
              f"{c1['first_text_p50_ms']:.2f} ms, {c16['requests_per_s']:,.0f} req/s at c=16, "
              f"{c64['requests_per_s']:,.0f} at c=64, stub CPU {report['cpu_ms_per_request'][f'{fmt}/direct']:.2f} "
              "ms/request")
    head = (f"{'path':18}{'+p50':>9}{'+p99':>9}{'+TTFB':>8}{'+1st text':>10}{'req/s c=16':>17}{'p99 c=16':>10}"
            f"{'req/s c=64':>17}{'CPU/req':>9}{'fail':>6}")
    print(head)
    rows = _rows(figures)
    for fmt in ("json", "sse"):
        for path in rows:
            label = _label(path)
            a, c16, c64 = added[f"{fmt}/{path}"], figures["c16"][f"{fmt}/{path}"], figures["c64"][f"{fmt}/{path}"]
            failures = sum(figures[phase][f"{fmt}/{path}"]["failures"] for phase in figures)
            text = f"{a['first_text_ms']:+9.2f}" if fmt == "sse" else f"{'':>9}"
            print(f"{fmt + ' ' + label:18}{a['p50_ms']:+8.2f} {a['p99_ms']:+8.2f} {a['first_byte_ms']:+7.2f} {text}"
                  f"{c16['requests_per_s']:8.1f} ({a['share_c16']:5.1%}){c16['p99_ms']:8.1f}ms"
                  f"{c64['requests_per_s']:8.1f} ({a['share_c64']:5.1%}){a['cpu_ms_per_request']:7.2f}ms{failures:6d}")
    print("  (+: added over direct, ms, p50 unless named; CPU/req: ors and its processes; fail: failed requests)")
    if FLOOR in rows:
        cpu = {key: row["cpu_ms_per_request"] for key, row in added.items()}
        above = ", ".join(f"{fmt} {label} {cpu[f'{fmt}/{path}'] - cpu[f'{fmt}/{FLOOR}']:+.2f} ms"
                          for fmt in ("json", "sse") for path, label in PATHS.items())
        print("  floor: a bare forwarder on ors's stack (uvicorn, ors's upstream client), "
              "nothing validated, translated or stored; "
              f"a reference, held to no target. ors's CPU per request above it: {above}")
    direct_first = {fmt: figures["c1"][f"{fmt}/direct"]["new_connection_p50_ms"] for fmt in ("json", "sse")}
    print("  a connection's first request, p50 (not in the figures above): direct json "
          f"{direct_first['json']:.2f} ms, sse {direct_first['sse']:.2f} ms; added: " + ", ".join(
              f"{fmt} {_label(path)} {added[f'{fmt}/{path}']['new_connection_ms']:+.2f}"
              for fmt in ("json", "sse") for path in rows))
    streams, chained = report["streams"], report["chain"]
    if streams:
        print(f"{streams['streams']} streams at once (held {streams['hold_s']:g} s): "
              f"{streams['received_text']} received text, {streams['open_with_text_at_once']} open with text at "
              f"once, {streams['ended_with_terminal_event']} ended with a terminal event {streams['terminal_events']}"
              f"{' (failed: ' + str(streams['failure_codes']) + ')' if streams['failure_codes'] else ''}, "
              f"{streams['cut']} cut{' ' + str(streams['errors']) if streams['errors'] else ''}; RSS "
              f"{streams['rss_mib_before']:.0f} -> peak {streams['rss_mib_peak']:.0f} MiB "
              f"(after {streams['rss_mib_after']:.0f}); {streams['wall_s']:.1f} s")
    if chained:
        if chained["late_over_early"] is not None:
            print(f"chain of {chained['completed_turns']} turns, then turn {chained['early_turns']} and turn "
                  f"{chained['late_turns']} in alternation ({chained['alternations']} each): "
                  f"{chained['early_ms']:.1f} ms and {chained['late_ms']:.1f} ms ({chained['late_over_early']:.2f}x)")
            if chained.get("sequential_late_ms"):
                print(f"  while the chain was built: turns 2-12 {chained['sequential_early_ms']:.1f} ms, the last 11 "
                      f"{chained['sequential_late_ms']:.1f} ms")
        if chained.get("added_late_over_early") is not None:
            print(f"  the upstream alone, same conversations: {chained['direct_early_ms']:.1f} ms and "
                  f"{chained['direct_late_ms']:.1f} ms; added by ors: {chained['added_early_ms']:.1f} ms and "
                  f"{chained['added_late_ms']:.1f} ms ({chained['added_late_over_early']:.2f}x)")
        if chained["failure"]:
            print(f"chain failed at {chained['failure']}")
    _print_workers(report.get("workers"))
    print("targets:")
    for target in report["targets"]:
        value = target["value"]
        shown = "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"
        print(f"  {'met    ' if target['met'] else 'NOT met'}  {target['name']}: {shown} (target {target['limit']})")
    met = sum(target["met"] for target in report["targets"])
    print(f"  {met} of {len(report['targets'])} targets met")


def _print_workers(workers: dict[str, Any] | None) -> None:
    """Throughput on PostgreSQL by worker processes: each path's req/s, its share of the
    stub measured in the same rounds, and the gain over one worker."""
    if not workers:
        return
    counts = sorted(workers, key=int)
    print("ors on PostgreSQL by worker processes (req/s, share of direct in the same rounds):")
    for phase in ("c16", "c64"):
        for fmt in ("json", "sse"):
            for path, label in PATHS.items():
                key = f"{fmt}/{path}"
                cells = []
                for count in counts:
                    ors, direct = workers[count][phase][key], workers[count][phase][f"{fmt}/direct"]
                    cells.append(f"{count} worker{'s' if count != '1' else ''}: {ors['requests_per_s']:7.1f} "
                                 f"({ors['requests_per_s'] / direct['requests_per_s']:5.1%}, p99 "
                                 f"{ors['p99_ms']:.0f} ms)")
                first, last = workers[counts[0]][phase][key], workers[counts[-1]][phase][key]
                gain = last["requests_per_s"] / first["requests_per_s"] if first["requests_per_s"] else math.nan
                print(f"  {phase} {fmt + ' ' + label:16} " + "   ".join(cells) + f"   x{gain:.2f}")


def _cdf(axis: Any, values: list[float], label: str) -> None:
    if values:
        ordered = sorted(values)
        axis.plot(ordered, [(k + 1) / len(ordered) for k in range(len(ordered))], label=label)


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    figure, axes = plt.subplots(2, 3, figsize=(16, 9))
    panels = [(axes[0][0], "c1", "json", "latency_ms", "JSON, one at a time: latency"),
              (axes[0][1], "c1", "sse", "first_text_ms", "SSE, one at a time: first text"),
              (axes[1][0], "c16", "json", "latency_ms", "JSON at c=16: latency")]
    for axis, phase, fmt, kind, title in panels:
        for target in ("direct", *_rows(report["figures"])):
            _cdf(axis, samples[phase][f"{fmt}/{target}"][kind], _label(target))
        axis.set_xscale("log")
        axis.set_xlabel("ms")
        axis.set_ylabel("share of requests")
        axis.set_title(title)
        axis.legend()
    shares = axes[0][2]
    keys = [f"{fmt}/{path}" for fmt in ("json", "sse") for path in _rows(report["figures"])]
    for offset, phase in ((-0.2, "c16"), (0.2, "c64")):
        shares.bar([k + offset for k in range(len(keys))], [report["added"][key][f"share_{phase}"] for key in keys],
                   0.4, label=phase.replace("c", "c="))
    shares.axhline(SHARE_C16, color="red", linestyle="--", linewidth=1, label="target at c=16")
    shares.set_xticks(range(len(keys)), [key.replace("unstored", "store:false").replace("/", "\n") for key in keys])
    shares.set_title("throughput as a share of direct")
    shares.legend()
    streams, chained = report["streams"], report["chain"]
    if streams:
        timeline, open_streams = streams["rss_mib_timeline"], streams["open_with_text_timeline"]
        axes[1][1].plot([t for t, _ in timeline], [rss for _, rss in timeline], color="tab:blue")
        axes[1][1].set_xlabel("s")
        axes[1][1].set_ylabel("ors RSS, MiB", color="tab:blue")
        counts = axes[1][1].twinx()
        counts.plot([t for t, _ in open_streams], [n for _, n in open_streams], color="tab:orange")
        counts.set_ylabel("streams open with text", color="tab:orange")
        axes[1][1].set_title(f"{streams['streams']} streams: {streams['terminal_events'].get('completed', 0)} "
                             f"completed, {streams['cut']} cut")
    if chained and chained["timings_ms"]:
        timings = chained["timings_ms"]
        axes[1][2].plot(range(1, len(timings) + 1), timings, linewidth=0.6)
        axes[1][2].set_xlabel("turn")
        axes[1][2].set_ylabel("ms")
        axes[1][2].set_yscale("log")
        axes[1][2].set_title("previous_response_id chain: each turn's time")
    figure.suptitle("ors in front of a stub upstream vs the stub directly")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def write(report: dict[str, Any]) -> Path:
    """Print the report and write it under ``bench/results/``: ``proxy-<time>.json`` and
    ``.png``. Returns their common path without suffix."""
    _print(report)
    return write_report(RESULTS, "proxy", _clean(report), lambda path: _plot(report, path), indent=1)


def _clean(value: Any) -> Any:
    """``value`` with NaN as ``null`` (JSON has no NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value
