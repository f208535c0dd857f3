"""Running ``python -m compliance`` against a server as a separate process, as anyone
would, and reading its verdicts."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def run_acceptance(
    base_url: str, model: str, *transports: str, concurrent: bool = False, only: Sequence[str] = ()
) -> tuple[dict[str, str], subprocess.CompletedProcess[str]]:
    """The verdict (PASS, FAIL, SKIP) of every check that ran, in the order they ran;
    ``concurrent`` runs them all at once, as the official harness does; ``only`` runs
    just the checks named."""
    command = [sys.executable, "-m", "compliance", "--base-url", base_url, "--model", model, "--times"]
    if concurrent:
        command.append("--concurrent")
    for transport in transports:
        command += ["--transport", transport]
    for name in only:
        command += ["--only", name]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPOSITORY)
    verdicts: dict[str, str] = {}
    for line in result.stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in ("PASS", "FAIL", "SKIP"):
            verdicts[rest.split(":")[0].split()[0]] = verdict
    return verdicts, result


RAN_OUT = "expected a completed response, got a incomplete response"
"""How a check fails when the model wrote until its token cap instead of answering."""


def rerun_ran_out(base_url: str, model: str, verdicts: dict[str, str], output: str) -> tuple[dict[str, str], str]:
    """Run once more each check that failed only because the model ran to its token cap
    (a small model at a low temperature sometimes repeats itself until its cap, as
    SmolLM2 does about one time in seven on ``websocket-compact-new-chain``): the new
    verdicts, and everything printed. Any other failure, or running out twice, stands."""
    failed = {line.split(":")[0].removeprefix("FAIL ").strip() for line in output.splitlines()
              if line.startswith("FAIL ") and RAN_OUT in line}
    verdicts = dict(verdicts)
    for name in sorted(failed):
        again, result = run_acceptance(base_url, model, only=[name])
        verdicts[name] = again.get(name, "FAIL")
        output += f"\n(run once more)\n{result.stdout}{result.stderr}"
    return verdicts, output
