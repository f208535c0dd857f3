"""A real browser for the playground's tests: Debian's Chromium (``make`` installs it),
driven headless by Playwright. A test that uses the ``chromium`` fixture is marked
``browser`` (tests/conftest.py). Screenshots go to ``test-artifacts/`` (not committed)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = Path(os.environ.get("ORS_TEST_CHROMIUM", "/usr/bin/chromium"))
SHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "playground"


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """Headless Chromium. Fails, never skips, when it is missing."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (ORS_TEST_CHROMIUM names another)")
    with sync_playwright() as playwright:
        # --no-sandbox: Chromium's sandbox refuses to run as root, as CI does.
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield browser
        browser.close()


def shot(page: Page, name: str) -> None:
    """A screenshot of the page as it is, for a person to look at."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
