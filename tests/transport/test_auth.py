"""Bearer keys, and what the server says (or refuses) about its exposure at start."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re

import pytest

from app.config import Settings
from app.errors import Unauthorized
from app.main import ExposureRefused, check_exposure
from app.transport.auth import ANONYMOUS, TENANT_DOMAIN, KeyAuthenticator, derived_tenant, parse_key


def test_no_keys_means_one_anonymous_tenant() -> None:
    assert KeyAuthenticator([]).tenant(None) == ANONYMOUS


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic abc", "Bearer wrong", "bearer k"])
def test_missing_or_wrong_keys_are_refused(header: str | None) -> None:
    with pytest.raises(Unauthorized):
        KeyAuthenticator(["k1", "k2"]).tenant(header)


def test_each_key_is_its_own_tenant_and_never_the_key_itself() -> None:
    auth = KeyAuthenticator(["first-secret", "second-secret"])
    first, second = auth.tenant("Bearer first-secret"), auth.tenant("bearer second-secret")
    assert first != second
    assert re.fullmatch(r"key-[0-9a-f]{16}", first) and re.fullmatch(r"key-[0-9a-f]{16}", second)
    assert "secret" not in first + second


def test_an_unnamed_keys_tenant_is_a_keyed_digest_of_the_secret() -> None:
    digest = hmac.new(TENANT_DOMAIN, b"first-secret", hashlib.sha256).hexdigest()
    assert derived_tenant("first-secret") == f"key-{digest[:16]}"
    assert hashlib.sha256(b"first-secret").hexdigest()[:16] not in derived_tenant("first-secret")


def test_a_named_key_is_its_names_tenant() -> None:
    auth = KeyAuthenticator(["alice:s3cret", "bob:other"])
    assert auth.tenant("Bearer s3cret") == "alice"
    assert auth.tenant("Bearer other") == "bob"
    assert auth.tenant("Bearer alice:s3cret") == "alice"  # the whole entry works too
    for wrong in ("alice", "Bearer alice", "Bearer bob:s3cret", "Bearer alice:other"):
        with pytest.raises(Unauthorized):
            auth.tenant(wrong)


def test_the_order_of_the_keys_does_not_matter() -> None:
    entries = ["alice:a-secret", "bare-secret", "bob:b-secret"]
    before = KeyAuthenticator(entries)
    after = KeyAuthenticator(list(reversed(entries)))
    removed = KeyAuthenticator(entries[1:])
    for token in ("a-secret", "bare-secret", "b-secret"):
        assert before.tenant(f"Bearer {token}") == after.tenant(f"Bearer {token}")
    for token in ("bare-secret", "b-secret"):
        assert before.tenant(f"Bearer {token}") == removed.tenant(f"Bearer {token}")


def test_rotation_two_secrets_one_name() -> None:
    auth = KeyAuthenticator(["alice:old-secret", "bob:b", "alice:new-secret"])
    assert auth.tenant("Bearer old-secret") == auth.tenant("Bearer new-secret") == "alice"
    assert auth.tenants == ["alice", "bob"]
    rotated = KeyAuthenticator(["bob:b", "alice:new-secret"])
    assert rotated.tenant("Bearer new-secret") == "alice"
    with pytest.raises(Unauthorized):
        rotated.tenant("Bearer old-secret")


def test_colons_in_secrets() -> None:
    auth = KeyAuthenticator(["team:ab:cd", "sk-live/x:y", "a b:c", "plain"])
    assert auth.tenant("Bearer ab:cd") == "team"  # only the first ':' separates the name
    # text before the first ':' that is not a name: the whole entry is the secret
    assert auth.tenant("Bearer sk-live/x:y") == derived_tenant("sk-live/x:y")
    assert auth.tenant("Bearer a b:c") == derived_tenant("a b:c")
    with pytest.raises(Unauthorized):
        auth.tenant("Bearer y")
    assert parse_key("n" * 64 + ":s").named and not parse_key("n" * 65 + ":s").named


@pytest.mark.parametrize("entries", [["key-1:secret"], ["alice:"], ["alice:same", "bob:same"],
                                     ["alice:bob:x", "bob:x"]])
def test_ambiguous_or_reserved_keys_are_refused(entries: list[str]) -> None:
    with pytest.raises(ValueError) as refused:
        KeyAuthenticator(entries)
    assert "same" not in str(refused.value) and ":x" not in str(refused.value)  # never quotes a secret


def test_positional_tenants_follow_the_configured_order() -> None:
    auth = KeyAuthenticator(["alice:a", "bare", "alice:b"])
    assert auth.positional_tenants() == {"key-0": "alice", "key-1": derived_tenant("bare"), "key-2": "alice"}
    assert KeyAuthenticator([]).positional_tenants() == {}


def test_a_key_named_anonymous_keeps_the_anonymous_tenant() -> None:
    assert KeyAuthenticator(["anonymous:s"]).tenant("Bearer s") == ANONYMOUS


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
    check_exposure(Settings(host="0.0.0.0", api_keys=["alice:k1", "alice:k2", "bob:k3"]))
    assert "anyone" not in caplog.text and "3 key(s), 2 tenant(s): alice, bob" in caplog.text
    assert "k1" not in caplog.text
