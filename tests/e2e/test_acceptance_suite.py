"""The acceptance suite's HTTP requests (on the default model), run by the independent checker in
``compliance/`` as a separate process against the real server, as anyone would run it."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import QWEN
from tests.live import LiveServer

STATELESS_HTTP_CHECKS = {
    "basic-response",
    "assistant-phase",
    "streaming-response",
    "system-prompt",
    "image-input",
    "multi-turn",
    "tool-calling",
    "compact-response",
    "compact-missing-model",
}


def test_stateless_http_checks_pass(server: LiveServer) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "compliance", "--base-url", f"{server.url}/v1", "--model", QWEN, "--transport", "http"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    verdicts = {}
    for line in result.stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in ("PASS", "FAIL", "SKIP"):
            verdicts[rest.split(":")[0].split()[0]] = verdict
    missing = STATELESS_HTTP_CHECKS - set(verdicts)
    assert not missing, result.stdout
    failed = {name for name in STATELESS_HTTP_CHECKS if verdicts[name] != "PASS"}
    assert not failed, result.stdout + result.stderr
