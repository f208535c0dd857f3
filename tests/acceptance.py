"""Running ``python -m compliance`` against a server as a separate process, as anyone
would, and reading its verdicts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def run_acceptance(
    base_url: str, model: str, *transports: str, concurrent: bool = False
) -> tuple[dict[str, str], subprocess.CompletedProcess[str]]:
    """The verdict (PASS, FAIL, SKIP) of every check that ran, in the order they ran;
    ``concurrent`` runs them all at once, as the official harness does."""
    command = [sys.executable, "-m", "compliance", "--base-url", base_url, "--model", model, "--times"]
    if concurrent:
        command.append("--concurrent")
    for transport in transports:
        command += ["--transport", transport]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPOSITORY)
    verdicts: dict[str, str] = {}
    for line in result.stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in ("PASS", "FAIL", "SKIP"):
            verdicts[rest.split(":")[0].split()[0]] = verdict
    return verdicts, result
