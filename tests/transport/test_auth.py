"""Bearer keys, and what the server says (or refuses) about its exposure at start."""

from __future__ import annotations

import logging

import pytest

from app.config import Settings
from app.errors import Unauthorized
from app.main import ExposureRefused, check_exposure
from app.transport.auth import ANONYMOUS, KeyAuthenticator


def test_no_keys_means_one_anonymous_tenant() -> None:
    assert KeyAuthenticator([]).tenant(None) == ANONYMOUS


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic abc", "Bearer wrong", "bearer k"])
def test_missing_or_wrong_keys_are_refused(header: str | None) -> None:
    with pytest.raises(Unauthorized):
        KeyAuthenticator(["k1", "k2"]).tenant(header)


def test_each_key_is_its_own_tenant_and_never_the_key_itself() -> None:
    auth = KeyAuthenticator(["first-secret", "second-secret"])
    assert auth.tenant("Bearer first-secret") == "key-0"
    assert auth.tenant("bearer second-secret") == "key-1"
    assert "secret" not in auth.tenant("Bearer second-secret")


def test_exposure_is_refused_or_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ors")
    check_exposure(Settings(host="127.0.0.1"))
    assert "anonymous tenant" in caplog.text and "anyone who can reach it" not in caplog.text
    caplog.clear()
    with pytest.raises(ExposureRefused, match="ORS_API_KEYS"):
        check_exposure(Settings(host="0.0.0.0"))
    check_exposure(Settings(host="0.0.0.0", allow_unauthenticated=True))
    assert "anyone who can reach it" in caplog.text
    caplog.clear()
    check_exposure(Settings(host="0.0.0.0", api_keys=["k"]))
    assert "anyone" not in caplog.text and "1 tenant" in caplog.text
