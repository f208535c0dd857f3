"""``ors check``: the conformance suite against an endpoint, with a JSON report, the run as
JSON on standard output, and one self-contained HTML page."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


def _run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", "check", *arguments],
                          capture_output=True, text=True, timeout=300)


def test_json_prints_the_run_with_each_checks_requests_and_events(server: LiveServer) -> None:
    result = _run("--base-url", f"{server.url}/v1", "--model", "scripted-text", "--api-key", "sekret-key",
                  "--only", "streaming-response", "--json")
    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout)  # nothing but the JSON on standard output
    [check] = run["checks"]
    assert (check["name"], check["status"], check["json_path"]) == ("streaming-response", "PASS", None)
    [exchange] = check["exchanges"]
    assert (exchange["method"], exchange["status"]) == ("POST", 200)
    assert exchange["sent"][0]["model"] == "scripted-text" and exchange["sent"][0]["stream"] is True
    events = exchange["received"]
    assert events[0]["type"] == "response.created" and events[-1] == "[DONE]"
    assert events[-2]["type"] == "response.completed"
    assert "sekret-key" not in result.stdout


class _BrokenEndpoint(BaseHTTPRequestHandler):
    """A deliberately non-conformant endpoint on loopback (a test double, named as
    such): every response it returns has a status the spec does not know."""

    def do_POST(self) -> None:  # noqa: N802 - the http.server interface
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"id": "resp_broken", "object": "response", "status": "done", "output": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_html_is_one_page_with_the_violation_its_json_path_and_the_exchange(tmp_path: Path) -> None:
    broken = ThreadingHTTPServer(("127.0.0.1", 0), _BrokenEndpoint)
    threading.Thread(target=broken.serve_forever, daemon=True).start()
    page = tmp_path / "check.html"
    try:
        result = _run("--base-url", f"http://127.0.0.1:{broken.server_address[1]}/v1", "--model", "m",
                      "--only", "basic-response", "--html", str(page))
    finally:
        broken.shutdown()
    assert result.returncode == 1 and "FAIL basic-response" in result.stdout
    text = page.read_text()
    assert text.startswith("<!doctype html>") and "not conformant" in text
    assert "<script" not in text and "<link" not in text and "src=" not in text  # self-contained
    assert "class='violation'" in text and "<br>at <code>$" in text  # the first violation and its JSON path
    assert "Say hello in exactly 3 words." in text  # the request as sent
    assert "resp_broken" in text  # and what the server answered
