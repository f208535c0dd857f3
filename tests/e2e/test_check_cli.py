"""``ors check``: the conformance suite against an endpoint, with a JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.live import LiveServer


def _check(server: LiveServer, tmp_path: Path, *arguments: str) -> tuple[int, dict[str, object], str]:
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "check", "--base-url", f"{server.url}/v1", "--report", str(report),
         *arguments],
        capture_output=True, text=True, timeout=300,
    )
    return result.returncode, json.loads(report.read_text()), result.stdout


def test_a_conformant_endpoint_passes(server: LiveServer, tmp_path: Path) -> None:
    code, report, output = _check(server, tmp_path, "--model", "scripted-text",
                                  "--only", "basic-response", "--only", "streaming-response")
    assert code == 0, output
    assert "PASS basic-response" in output and "PASS streaming-response" in output
    assert report["endpoint"] == f"{server.url}/v1" and report["model"] == "scripted-text"
    assert (report["passed"], report["failed"], report["conformant"]) == (2, 0, True)
    assert [check["name"] for check in report["checks"]] == ["basic-response", "streaming-response"]  # type: ignore[index]


def test_a_failing_check_fails_the_run_and_the_report(server: LiveServer, tmp_path: Path) -> None:
    code, report, output = _check(server, tmp_path, "--model", "no-such-model", "--only", "basic-response")
    assert code == 1
    assert "FAIL basic-response" in output
    assert (report["passed"], report["failed"], report["conformant"]) == (0, 1, False)
    check = report["checks"][0]  # type: ignore[index]
    assert check["status"] == "FAIL" and check["reason"]
