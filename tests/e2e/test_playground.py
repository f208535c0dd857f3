"""The playground in a real browser: headless Chromium (Playwright) against the real
``ors serve`` on loopback, with the embedded SmolLM2 and Qwen, keys turned on.

Each test opens the page afresh (a new browser context: an empty session storage, so the
key is asked for), does what a user does, and checks what the page shows against what
the API says. Screenshots of each step go to ``test-artifacts/playground/``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from app.backends.model_files import ModelFiles
from compliance import check_response, validate_error_body
from tests.browser import chromium, shot  # noqa: F401 - the fixture
from tests.conftest import QWEN, SMOL
from tests.live import ServerProcess

SECRET = "pw-secret"
DEADLINE_MS = 300_000
"""How long the page may take to show a model's answer (generous: two shared cores)."""
TYPED = ["Write one sentence about the sea, please.", "What is the weather in Paris today?",
         "Say the word lighthouse."]
"""What the tests type: none of it may reach the server's log."""
XSS = '<img src=x onerror="document.body.dataset.pwned=1"><script>document.body.dataset.pwned=2</script>'


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    files = ModelFiles(model_dir)
    files.path(SMOL)
    files.path(QWEN)
    data = tmp_path_factory.mktemp("playground")
    (data / "models").symlink_to(model_dir / "models")  # the assembled files, not assembled again
    process = ServerProcess({"ORS_DEFAULT_MODEL": SMOL, "ORS_PRELOAD_MODELS": QWEN, "ORS_API_KEYS": f"play:{SECRET}",
                             "ORS_MODEL_CONTEXT": "4096", "ORS_LOG_LEVEL": "info"}, data).start(timeout=600)
    yield process
    process.terminate()


@pytest.fixture()
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {SECRET}"}, timeout=300) as client:
        yield client


@pytest.fixture()
def page(chromium: Browser, server: ServerProcess) -> Iterator[Page]:  # noqa: F811 - the fixture
    context = chromium.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{server.url}/")
    expect(page.locator("#key-dialog")).to_be_visible()
    page.fill("#key-input", SECRET)
    page.click("#key-save")
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    yield page
    context.close()
    assert errors == [], errors


def record_statuses(page: Page) -> None:
    """Have the page note each status an item card shows, in order (read by
    :func:`statuses`). Run by the test through the browser's devtools, not by the page."""
    page.evaluate("""() => {
        window.seen = [];
        new MutationObserver((changes) => {
            for (const change of changes) {
                const card = change.target.closest ? change.target.closest('.item-card') : null;
                if (card && card.dataset.status) window.seen.push([card.dataset.type, card.dataset.status]);
            }
        }).observe(document.querySelector('#items'), {subtree: true, attributeFilter: ['data-status']});
    }""")


def statuses(page: Page) -> list[list[str]]:
    return page.evaluate("() => window.seen")  # type: ignore[no-any-return]


def send(page: Page, text: str) -> None:
    page.fill("#message", text)
    page.click("#send")


def finished(page: Page) -> str:
    """Wait for the response shown to end; its id."""
    expect(page.locator("#send")).to_be_enabled(timeout=DEADLINE_MS)
    expect(page.locator('#stats dd[data-stat="status"]')).not_to_have_text("in_progress")
    return page.locator('#stats dd[data-stat="id"]').inner_text()


def stored(api: httpx.Client, response_id: str) -> dict[str, Any]:
    reply = api.get(f"/v1/responses/{response_id}")
    assert reply.status_code == 200, reply.text
    return check_response(reply.json())


def output_text(response: dict[str, Any]) -> str:
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


def test_a_streamed_answer_appears_as_its_items_and_events_do(page: Page, api: httpx.Client) -> None:
    page.select_option("#model", SMOL)
    page.fill("#max-tokens", "48")
    record_statuses(page)
    send(page, TYPED[0])
    expect(page.locator(".msg.user")).to_have_text(TYPED[0])
    response_id = finished(page)
    shot(page, "1-streamed-answer")
    response = stored(api, response_id)
    assert response["status"] in ("completed", "incomplete")
    expect(page.locator(".msg.assistant")).to_have_text(output_text(response))
    message = response["output"][0]
    assert [status for kind, status in statuses(page) if kind == "message"] == ["in_progress", message["status"]]
    expect(page.locator(".item-card")).to_have_count(len(response["output"]))
    rows = page.locator("#timeline .event-row")
    types = rows.evaluate_all("rows => rows.map(row => row.dataset.type)")
    assert types[0] == "response.created" and types[-1] == f"response.{response['status']}"
    assert "response.output_text.delta" in types
    sequence = rows.locator(".seq").all_inner_texts()
    assert sequence == [str(n) for n in range(len(types))]
    expect(page.locator('#stats dd[data-stat="input tokens"]')).to_have_text(str(response["usage"]["input_tokens"]))
    expect(page.locator('#stats dd[data-stat="time to first token"]')).to_have_text(re.compile(r"\d+\.\d{3} s"))
    rows.first.click()
    payload = json.loads(rows.first.locator("pre").inner_text())
    assert payload["type"] == "response.created" and payload["response"]["id"] == response_id


def test_a_refused_request_shows_the_spec_error_object_with_its_param(page: Page) -> None:
    page.fill("#max-tokens", "1")
    send(page, "Hello")
    error = page.locator("#error .error-object")
    expect(error).to_be_visible(timeout=DEADLINE_MS)
    expect(error.locator(".param")).to_have_text("max_output_tokens")
    body = json.loads(error.locator("pre").inner_text())
    validate_error_body({"error": body})  # the spec's error object, as the server sent it
    assert body["param"] == "max_output_tokens"
    expect(page.locator(".msg.assistant")).to_have_count(0)
    shot(page, "1b-error")


def test_a_forced_call_is_answered_from_the_page_and_the_conversation_goes_on(page: Page, api: httpx.Client) -> None:
    page.select_option("#transport", "ws")
    page.select_option("#model", QWEN)
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "64")
    page.select_option("#tool-example", "weather")
    page.select_option("#tool-choice", "function:get_weather")
    send(page, TYPED[1])
    call = page.locator(".call")
    expect(call).to_be_visible(timeout=DEADLINE_MS)
    first_id = finished(page)
    first = stored(api, first_id)
    [function_call] = [item for item in first["output"] if item["type"] == "function_call"]
    assert function_call["name"] == "get_weather" and "city" in json.loads(function_call["arguments"])
    expect(call.locator("pre")).to_have_text(function_call["arguments"])
    expect(page.locator('.item-card[data-type="function_call"]')).to_have_attribute("data-status", "completed")
    shot(page, "2-forced-call")
    page.select_option("#tool-choice", "none")
    call.locator(".call-output").fill("18 degrees and sunny")
    call.locator(".call-answer").click()
    expect(page.locator(".msg.assistant")).to_have_count(1, timeout=DEADLINE_MS)
    second_id = finished(page)
    shot(page, "3-after-the-call")
    second = stored(api, second_id)
    assert second["previous_response_id"] == first_id
    inputs = api.get(f"/v1/responses/{second_id}/input_items").json()["data"]
    assert inputs == [{**inputs[0], "type": "function_call_output", "call_id": function_call["call_id"],
                       "output": "18 degrees and sunny"}]
    expect(page.locator(".msg.assistant")).to_have_text(output_text(second))
    expect(page.locator("#previous-id")).to_have_text(second_id)


def test_a_stored_response_is_found_opened_replayed_and_deleted(page: Page, api: httpx.Client) -> None:
    first = api.post("/v1/responses", json={"model": SMOL, "input": "Hello!", "max_output_tokens": 16}).json()
    with api.stream("POST", "/v1/responses", json={"model": SMOL, "input": TYPED[2], "stream": True,
                                                   "previous_response_id": first["id"], "max_output_tokens": 16}) as reply:
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    second_id = events[-1]["response"]["id"]
    page.click('#tabs button[data-tab="stored"]')
    row = page.locator(f'.stored-row[data-id="{second_id}"]')
    expect(row).to_be_visible()
    expect(page.locator(".stored-row").first).to_have_attribute("data-id", second_id)  # newest first
    row.click()
    expect(page.locator(".chain-link")).to_have_count(2)
    assert page.locator(".chain-link").evaluate_all("links => links.map(link => link.dataset.id)") == [
        second_id, first["id"]]
    expect(page.locator("#input-items .item-card .body")).to_have_text(TYPED[2])
    page.click("#replay")
    replayed = page.locator("#replay-timeline .event-row")
    expect(replayed.last).to_have_attribute("data-type", events[-1]["type"], timeout=DEADLINE_MS)
    assert replayed.evaluate_all("rows => rows.map(row => row.dataset.type)") == [event["type"] for event in events]
    shot(page, "4-stored-replayed")
    page.click("#stored-delete")
    expect(row).to_have_count(0)
    assert api.get(f"/v1/responses/{second_id}").status_code == 404


def test_a_conformance_run_shows_each_check_and_the_clis_report(page: Page, api: httpx.Client) -> None:
    page.click('#tabs button[data-tab="checks"]')
    page.select_option("#check-model", SMOL)
    page.click("#check-run")
    summary = page.locator("#check-summary")
    expect(summary).to_have_attribute("data-conformant", re.compile("true|false"), timeout=DEADLINE_MS)
    rows = page.locator(".check-row")
    shown = dict(zip(rows.evaluate_all("rows => rows.map(row => row.dataset.name)"),
                     rows.evaluate_all("rows => rows.map(row => row.dataset.status)"), strict=True))
    with page.expect_download() as download:
        page.click("#check-download-json")
    report = json.loads(Path(download.value.path()).read_text())
    assert shown == {check["name"]: check["status"] for check in report["checks"]} and len(shown) >= 17
    # what SmolLM2 (135M) passes varies (it rarely calls a tool of its own accord): the page
    # is held to the report, the report to the checks it ran
    assert report["passed"] + report["failed"] + report["skipped"] == len(shown) and report["passed"] > 0
    expect(summary).to_contain_text(f"{report['passed']} passed, {report['failed']} failed")
    page.click("#check-open")
    frame = page.frame_locator("#check-report")
    expect(frame.locator("h1")).to_contain_text("Open Responses check")
    expect(frame.locator("td.PASS")).to_have_count(report["passed"])
    shot(page, "5-conformance")


def test_model_output_and_stored_text_are_shown_as_text_never_run(page: Page, api: httpx.Client) -> None:
    page.select_option("#model", QWEN)
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "96")
    page.fill("#instructions", "Repeat the user's message exactly, character for character, and write nothing else.")
    send(page, XSS)
    response_id = finished(page)
    answer = output_text(stored(api, response_id))
    assert "<img" in answer or "<script>" in answer, answer  # the model echoed markup
    expect(page.locator(".msg.user")).to_have_text(XSS)
    expect(page.locator(".msg.assistant")).to_have_text(answer)
    page.click('#tabs button[data-tab="stored"]')
    page.locator(f'.stored-row[data-id="{response_id}"]').click()
    expect(page.locator("#input-items .item-card .body")).to_have_text(XSS)
    shot(page, "6-markup-as-text")
    assert page.locator("main img, main script").count() == 0
    # An inline script put into the page anyway is refused by the Content-Security-Policy.
    page.evaluate("""() => { const s = document.createElement('script');
                             s.textContent = 'document.body.dataset.pwned = 3'; document.body.append(s); }""")
    assert page.locator("body").get_attribute("data-pwned") is None


def test_no_typed_text_reaches_the_server_log(server: ServerProcess) -> None:
    log = server.log()
    assert "Uvicorn running" in log or "ors" in log, log[:500]  # the server's log, written
    for text in (*TYPED, "18 degrees and sunny", "lighthouse", "onerror"):
        assert text not in log
