"""The official acceptance suite's 17 tests (HTTP, the fixture, WebSocket), run by the
independent checker in ``compliance/`` as a separate process against the real server on
its default embedded model (which must decide on its own to call a tool), as anyone
would run it."""

from __future__ import annotations

from subprocess import CompletedProcess

from tests.acceptance import run_acceptance
from tests.conftest import QWEN
from tests.live import LiveServer

ACCEPTANCE_SUITE = {
    "basic-response",
    "assistant-phase",
    "response-output-phase-schema",
    "streaming-response",
    "system-prompt",
    "tool-calling",
    "image-input",
    "multi-turn",
    "compact-response",
    "compact-missing-model",
    "websocket-response",
    "websocket-sequential-responses",
    "websocket-continuation",
    "websocket-reconnect-store-false-recovery",
    "websocket-previous-response-not-found",
    "websocket-failed-continuation-evicts-cache",
    "websocket-compact-new-chain",
}


def _assert_all_pass(verdicts: dict[str, str], result: CompletedProcess[str]) -> None:
    assert set(verdicts) == ACCEPTANCE_SUITE, result.stdout + result.stderr
    failed = sorted(name for name, verdict in verdicts.items() if verdict != "PASS")
    assert not failed, result.stdout + result.stderr
    assert result.returncode == 0


def test_all_17_acceptance_tests_pass_on_the_default_model(server: LiveServer) -> None:
    _assert_all_pass(*run_acceptance(f"{server.url}/v1", QWEN))


def test_all_17_at_once_as_the_official_harness_runs_them(server: LiveServer) -> None:
    """All at once, with the 30 s WebSocket turn timer: the embedded model serves several
    generations together, so the WebSocket tests do not starve behind the HTTP ones."""
    _assert_all_pass(*run_acceptance(f"{server.url}/v1", QWEN, concurrent=True))


def test_all_17_at_once_under_the_suite_default_model_name(server: LiveServer) -> None:
    """Without --model the harness asks for gpt-4o-mini: ORS_MODEL_ALIASES maps it."""
    verdicts, result = run_acceptance(f"{server.url}/v1", "gpt-4o-mini", concurrent=True)
    _assert_all_pass(verdicts, result)
