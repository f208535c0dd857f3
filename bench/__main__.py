"""``python -m bench [overhead|embedded|proxy] [options]``: the benchmarks; with no name,
all of them (what ``make bench`` runs). Each prints its figures; ``embedded`` and ``proxy``
also write a JSON report and a plot under ``bench/results/`` (not committed)."""

from __future__ import annotations

import sys

from bench import embedded, overhead, proxy

BENCHMARKS = {"overhead": overhead.main, "embedded": embedded.main, "proxy": proxy.main}


def main(argv: list[str]) -> None:
    if argv and argv[0] in BENCHMARKS:
        BENCHMARKS[argv[0]](argv[1:])
        return
    if argv:
        sys.exit(f"unknown benchmark {argv[0]!r}; choose from {', '.join(BENCHMARKS)}")
    for run in BENCHMARKS.values():
        run([])


if __name__ == "__main__":
    main(sys.argv[1:])
