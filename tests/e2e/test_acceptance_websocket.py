"""The acceptance suite's seven WebSocket tests, run by the independent checker in
``compliance/`` as a separate process against the real server, as anyone would run it:
on the embedded test model, and on the scripted model (which answers instantly)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SMOL
from tests.live import LiveServer

REPOSITORY = Path(__file__).resolve().parents[2]
WEBSOCKET_CHECKS = [
    "websocket-response",
    "websocket-sequential-responses",
    "websocket-continuation",
    "websocket-reconnect-store-false-recovery",
    "websocket-previous-response-not-found",
    "websocket-failed-continuation-evicts-cache",
    "websocket-compact-new-chain",
]


@pytest.mark.parametrize("model", [SMOL, "scripted-text"])
def test_every_websocket_check_passes(server: LiveServer, model: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "compliance", "--base-url", f"{server.url}/v1", "--model", model,
         "--transport", "websocket"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPOSITORY,
    )
    verdicts = {}
    for line in result.stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in ("PASS", "FAIL", "SKIP"):
            verdicts[rest.split(":")[0]] = verdict
    assert list(verdicts) == WEBSOCKET_CHECKS, result.stdout + result.stderr
    assert set(verdicts.values()) == {"PASS"}, result.stdout + result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
