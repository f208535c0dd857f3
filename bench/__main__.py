"""``python -m bench [overhead|embedded|model-load|proxy|codex|instructions] [options]``: the benchmarks;
with no name, all of them but ``instructions`` (what ``make bench`` runs). Each prints its
figures; ``embedded``, ``model-load``, ``proxy`` and ``codex`` also write a JSON report and a plot under
``bench/results/`` (not committed)."""

from __future__ import annotations

import sys

from bench import codex_session, embedded, instructions, model_load, overhead, proxy

BENCHMARKS = {"overhead": overhead.main, "embedded": embedded.main, "model-load": model_load.main, "proxy": proxy.main,
              "codex": codex_session.main}
TOOLS = {"instructions": instructions.main}
"""Run by name only, never by ``make bench``: instruments, not targets."""


def main(argv: list[str]) -> None:
    if argv and argv[0] in {**BENCHMARKS, **TOOLS}:
        {**BENCHMARKS, **TOOLS}[argv[0]](argv[1:])
        return
    if argv:
        sys.exit(f"unknown benchmark {argv[0]!r}; choose from {', '.join([*BENCHMARKS, *TOOLS])}")
    for run in BENCHMARKS.values():
        run([])


if __name__ == "__main__":
    main(sys.argv[1:])
