"""The acceptance suite's seven WebSocket tests, run by the independent checker in
``compliance/`` as a separate process against the real server, as anyone would run it:
on the embedded test model, and on the scripted model (which answers instantly). On the
embedded model, a check whose only failure is the model writing until its token cap is
run once more (see :func:`tests.acceptance.rerun_ran_out`)."""

from __future__ import annotations

import pytest

from tests.acceptance import rerun_ran_out, run_acceptance
from tests.conftest import SMOL
from tests.live import LiveServer

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
    verdicts, result = run_acceptance(f"{server.url}/v1", model, "websocket")
    output = result.stdout + result.stderr
    assert list(verdicts) == WEBSOCKET_CHECKS, output
    if model == SMOL:
        verdicts, output = rerun_ran_out(f"{server.url}/v1", model, verdicts, output)
    assert set(verdicts.values()) == {"PASS"}, output
