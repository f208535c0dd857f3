"""The upstreams file (``ORS_CONFIG``): a good file, and each way of getting it wrong,
from the parser up to ``ors serve``'s exit code."""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.backends.chat_completions import ChatCompletionsBackend, ChatDialect
from app.backends.responses_upstream import ResponsesDialect, ResponsesUpstreamBackend
from app.config import Settings
from app.main import upstream_routes
from app.upstreams_config import UpstreamsConfigError, load_upstreams

GOOD = """
[upstreams.alpha]
base_url = "http://127.0.0.1:11434/v1"
api_key = "alpha-secret"
wire_api = "chat"
models = ["alpha-model"]
prefixes = ["alpha/"]
input_modalities = ["text"]
[upstreams.alpha.model_input_modalities]
"alpha-model" = ["text", "image"]
[upstreams.alpha.dialect]
replay_reasoning = true
token_limit_field = "max_completion_tokens"

[upstreams.beta]
base_url = "https://beta.example/v1"
api_key_env = "BETA_KEY"
wire_api = "responses"
prefixes = ["beta/", "b/"]
strip_prefix = false
list_models = true
[upstreams.beta.dialect]
hold_text = true
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ors.toml"
    path.write_text(text)
    return path


def problem(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(UpstreamsConfigError) as caught:
        load_upstreams(write(tmp_path, text), environ or {})
    return str(caught.value)


def test_a_good_file(tmp_path: Path) -> None:
    alpha, beta = load_upstreams(write(tmp_path, GOOD), {"BETA_KEY": "beta-secret"})
    assert (alpha.name, alpha.base_url, alpha.api_key, alpha.wire_api) == (
        "alpha", "http://127.0.0.1:11434/v1", "alpha-secret", "chat")
    assert (alpha.models, alpha.prefixes, alpha.strip_prefix, alpha.list_models) == (
        ("alpha-model",), ("alpha/",), True, False)
    assert alpha.dialect == ChatDialect(replay_reasoning=True, token_limit_field="max_completion_tokens")
    assert (beta.api_key, beta.wire_api, beta.prefixes, beta.strip_prefix, beta.list_models) == (
        "beta-secret", "responses", ("beta/", "b/"), False, True)
    assert beta.dialect == ResponsesDialect(hold_text=True)
    assert (alpha.input_modalities, beta.input_modalities) == (("text",), ("text", "image"))
    assert (alpha.model_input_modalities, beta.model_input_modalities) == ({"alpha-model": ("text", "image")}, {})


def test_the_file_builds_one_backend_per_upstream_with_its_dialect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BETA_KEY", "beta-secret")
    routes = upstream_routes(Settings(config=write(tmp_path, GOOD), upstream_url="http://127.0.0.1:9/v1"))
    assert [route.name for route in routes] == ["alpha", "beta", "upstream"]
    alpha, beta, shortcut = (route.backend for route in routes)
    assert isinstance(alpha, ChatCompletionsBackend) and alpha.replay_reasoning
    assert alpha.token_limit_field == "max_completion_tokens" and alpha.owned_by == "alpha"
    assert isinstance(beta, ResponsesUpstreamBackend) and beta.hold_text and not beta.replay_reasoning
    assert isinstance(shortcut, ChatCompletionsBackend) and routes[2].prefixes == ("",)
    assert (alpha.takes_images("m"), alpha.takes_images("alpha-model"), beta.takes_images("m"),
            shortcut.takes_images("m")) == (False, True, True, True)


@pytest.mark.parametrize(("text", "expected"), [
    ("[upstreams.a]\nmodels = ['m']\n", "upstreams.a.base_url: Field required"),
    ("[upstreams.a]\nbase_url = 'ftp://x/v1'\nmodels = ['m']\n", "upstreams.a.base_url: Value error, must be an http(s) URL"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nwire_api = 'grpc'\nmodels = ['m']\n", "upstreams.a.wire_api: Input should be 'chat' or 'responses'"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = 'm'\n", "upstreams.a.models: Input should be a valid list"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\nstrip_prefix = 'yes'\n", "upstreams.a.strip_prefix: Input should be a valid boolean"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\ntimeout = 3\n", "upstreams.a.timeout: unknown field"),
    ("[server]\nport = 1\n", "server: unknown field"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\n", "upstreams.a: routes nothing"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['']\n", "upstreams.a.models: Value error, model ids must not be empty"),
    ("[upstreams.'a b']\nbase_url = 'http://x/v1'\nmodels = ['m']\n", "upstreams.a b: an upstream name is"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\napi_key = 'k'\napi_key_env = 'K'\n", "upstreams.a.api_key_env: give either"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\napi_key_env = 'MISSING_KEY'\n", "upstreams.a.api_key_env: the environment variable 'MISSING_KEY' is not set"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\n[upstreams.a.dialect]\nreplay_reasonning = true\n",
     "upstreams.a.dialect.replay_reasonning: not a dialect option of wire_api 'chat' (known: token_limit_field, schema_style, replay_reasoning, file_parts, named_tool_choice)"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nwire_api = 'responses'\nmodels = ['m']\n[upstreams.a.dialect]\nschema_style = 'json_schema'\n",
     "upstreams.a.dialect.schema_style: not a dialect option of wire_api 'responses'"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\n[upstreams.a.dialect]\nschema_style = 'xml'\n",
     "upstreams.a.dialect: schema_style: Input should be 'json_schema' or 'json_object_schema'"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\n[upstreams.a.dialect]\nreplay_reasoning = 1\n",
     "upstreams.a.dialect: replay_reasoning: Input should be a valid boolean"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\ninput_modalities = ['image']\n",
     'upstreams.a.input_modalities: Value error, must include "text"'),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\ninput_modalities = ['text', 'audio']\n",
     "upstreams.a.input_modalities.1: Input should be 'text' or 'image'"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\ninput_modalities = ['text', 'text']\n",
     "upstreams.a.input_modalities: Value error, names a modality twice"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\n[upstreams.a.model_input_modalities]\nm = ['image']\n",
     "upstreams.a.model_input_modalities: Value error, 'm': must include \"text\""),
    ("[upstreams.a\nbase_url = 'http://x/v1'\n", "not valid TOML"),
])
def test_each_error_names_the_upstream_and_the_field(tmp_path: Path, text: str, expected: str) -> None:
    message = problem(tmp_path, text)
    assert message.startswith(f"ORS_CONFIG {tmp_path / 'ors.toml'}: ")
    assert expected in message


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UpstreamsConfigError, match="cannot be read"):
        load_upstreams(tmp_path / "absent.toml")


@pytest.mark.parametrize(("text", "expected"), [
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\n[upstreams.b]\nbase_url = 'http://y/v1'\nmodels = ['m']\n",
     "the model id 'm' is routed to two upstreams, 'a' and 'b'"),
    ("[upstreams.a]\nbase_url = 'http://x/v1'\nprefixes = ['p/']\n[upstreams.b]\nbase_url = 'http://y/v1'\nprefixes = ['p/']\n",
     "the prefix 'p/' is routed to two upstreams, 'a' and 'b'"),
])
def test_two_upstreams_may_not_claim_the_same_ids(tmp_path: Path, text: str, expected: str) -> None:
    from app.engine.models import ModelRouter

    with pytest.raises(ValueError, match=expected):
        ModelRouter([], "m", routes=upstream_routes(Settings(config=write(tmp_path, text))))


def test_the_shortcut_and_a_file_catch_all_conflict(tmp_path: Path) -> None:
    from app.main import create_app

    path = write(tmp_path, "[upstreams.a]\nbase_url = 'http://x/v1'\nprefixes = ['']\n")
    with pytest.raises(ValueError, match="the prefix '' is routed to two upstreams, 'a' and 'upstream'"):
        create_app(Settings(config=path, upstream_url="http://127.0.0.1:9/v1", data_dir=tmp_path))


@pytest.mark.parametrize(("dialect", "backend"), [(ChatDialect, ChatCompletionsBackend),
                                                   (ResponsesDialect, ResponsesUpstreamBackend)])
def test_each_dialect_option_is_a_keyword_of_its_adapter_with_the_same_default(dialect: type, backend: type) -> None:
    parameters = inspect.signature(backend).parameters
    for option in dataclasses.fields(dialect):
        assert parameters[option.name].default == option.default, option.name


def test_ors_serve_refuses_a_bad_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[upstreams.alpha]\nbase_url = 'http://x/v1'\nmodels = ['m']\n"
                           "[upstreams.alpha.dialect]\nreplay = true\n")
    result = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--data-dir", str(tmp_path)],
                            capture_output=True, text=True, env={**os.environ, "ORS_CONFIG": str(path)})
    assert result.returncode == 2
    assert result.stderr.startswith("ors serve: ORS_CONFIG ")
    assert "upstreams.alpha.dialect.replay: not a dialect option" in result.stderr
    assert "Traceback" not in result.stderr


# -- TLS files -------------------------------------------------------------------------------


@pytest.fixture
def tls_files(tmp_path: Path) -> Path:
    """A directory with a CA (``ca.pem``), a client certificate and key issued by it
    (``client.pem``, ``client.key``), the two in one file (``both.pem``), an encrypted key
    (``encrypted.key``) and a file that is not PEM (``junk.pem``)."""
    import trustme
    from cryptography.hazmat.primitives import serialization

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client = ca.issue_cert("ors@example")
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    client.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    client.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "both.pem"))
    key = serialization.load_pem_private_key(client.private_key_pem.bytes(), None)
    (tmp_path / "encrypted.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")))
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    return tmp_path


def _tls_entry(**files: str) -> str:
    lines = "".join(f"{field} = '{value}'\n" for field, value in files.items())
    return f"[upstreams.a]\nbase_url = 'https://x.example/v1'\nmodels = ['m']\n{lines}"


def test_tls_files_relative_to_the_file(tls_files: Path) -> None:
    (spec,) = load_upstreams(write(tls_files, _tls_entry(ca_bundle="ca.pem", client_cert="client.pem",
                                                          client_key="client.key")), {})
    assert spec.tls is not None
    assert (spec.tls.ca_bundle, spec.tls.client_cert, spec.tls.client_key) == (
        tls_files / "ca.pem", tls_files / "client.pem", tls_files / "client.key")
    (both,) = load_upstreams(write(tls_files, _tls_entry(client_cert=str(tls_files / "both.pem"))), {})
    assert both.tls is not None and both.tls.client_cert == tls_files / "both.pem" and both.tls.client_key is None
    (plain,) = load_upstreams(write(tls_files, "[upstreams.a]\nbase_url = 'https://x/v1'\nmodels = ['m']\n"), {})
    assert plain.tls is None


@pytest.mark.parametrize(("files", "expected"), [
    ({"ca_bundle": "absent.pem"}, "upstreams.a.ca_bundle: the CA bundle {dir}/absent.pem cannot be read: No such file"),
    ({"ca_bundle": "junk.pem"}, "upstreams.a.ca_bundle: the CA bundle {dir}/junk.pem holds no usable PEM certificate"),
    ({"client_cert": "client.pem"}, "upstreams.a.client_cert: the client certificate and key in {dir}/client.pem "
                                    "cannot be used"),
    ({"client_cert": "client.pem", "client_key": "encrypted.key"},
     "upstreams.a.client_cert: the client certificate and key in {dir}/client.pem and {dir}/encrypted.key cannot "
     "be used (a PEM certificate and its unencrypted private key are needed): the key is encrypted"),
    ({"client_cert": "client.pem", "client_key": "ca.pem"}, "upstreams.a.client_cert: the client certificate and key"),
    ({"client_cert": "absent.pem"}, "upstreams.a.client_cert: the client certificate {dir}/absent.pem cannot be read"),
    ({"client_cert": "client.pem", "client_key": "absent.key"},
     "upstreams.a.client_key: the client key {dir}/absent.key cannot be read"),
    ({"client_key": "client.key"}, "upstreams.a.client_key: a client key ({dir}/client.key) needs its client_cert"),
])  # fmt: skip
def test_each_tls_problem_names_the_field_and_the_file(tls_files: Path, files: dict[str, str], expected: str) -> None:
    message = problem(tls_files, _tls_entry(**files))
    assert message.startswith(f"ORS_CONFIG {tls_files / 'ors.toml'}: ")
    assert expected.format(dir=tls_files) in message


def test_tls_files_for_a_plain_http_upstream_are_refused(tls_files: Path) -> None:
    message = problem(tls_files, "[upstreams.a]\nbase_url = 'http://x/v1'\nmodels = ['m']\nca_bundle = 'ca.pem'\n")
    assert "upstreams.a.ca_bundle: TLS files apply to an https base_url only" in message


def test_ors_serve_refuses_a_ca_bundle_that_is_not_there(tmp_path: Path) -> None:
    path = write(tmp_path, _tls_entry(ca_bundle="nowhere.pem"))
    result = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--data-dir", str(tmp_path)],
                            capture_output=True, text=True, env={**os.environ, "ORS_CONFIG": str(path)})
    assert result.returncode == 2
    assert f"upstreams.a.ca_bundle: the CA bundle {tmp_path / 'nowhere.pem'} cannot be read" in result.stderr
    assert "Traceback" not in result.stderr

