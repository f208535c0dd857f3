"""Where a benchmark's report goes: ``bench/results/<name>-<time>.json`` and its plot
beside it, ``.png`` (not committed)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def write_report(directory: Path, name: str, report: dict[str, Any], plot: Callable[[Path], None],
                 indent: int = 2) -> Path:
    """Write ``report`` as JSON and have ``plot`` draw its figure, both named after
    ``name`` and the time; print where. Returns their common path without suffix."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=indent))
    plot(stem.with_suffix(".png"))
    print(f"wrote {stem}.json and .png")
    return stem
