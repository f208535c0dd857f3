"""The operator's models: what a models folder and ``[models.ID]`` entries make of the
files they name (headers written by the ``gguf`` package), and each way of getting an
entry wrong. The server serving such models is tests/e2e/test_operator_models.py."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from app.backends.gguf_files import read_facts, shard_paths
from app.backends.model_files import DiskFile, ModelSpec
from app.errors import ModelError
from app.models_config import MAX_DEFAULT_WINDOW, ModelsConfigError, chat_parser, folder_models, operator_models
from tests.gguf_fixtures import write_gguf


def source(spec: ModelSpec) -> DiskFile:
    assert isinstance(spec.source, DiskFile)
    return spec.source


def test_a_folder_is_read_as_llama_cpps_router_reads_it(tmp_path: Path) -> None:
    write_gguf(tmp_path / "Llama-3.2-1B-Q4.gguf", context=131_072)
    write_gguf(tmp_path / "mmproj-Llama-3.2-1B-Q4.gguf", projector=True)
    gemma = tmp_path / "gemma-3-4b-it"
    gemma.mkdir()
    write_gguf(gemma / "gemma-3-4b-it-Q8_0.gguf", "gemma3", context=8192)
    write_gguf(gemma / "mmproj-F16.gguf", projector=True)
    kimi = tmp_path / "kimi"
    kimi.mkdir()
    for no in (1, 2, 3):
        write_gguf(kimi / f"kimi-0000{no}-of-00003.gguf", shards=3 if no == 1 else None)
    for no in (1, 2):
        write_gguf(tmp_path / f"top-0000{no}-of-00002.gguf", shards=2 if no == 1 else None)
    (tmp_path / "notes.txt").write_text("not a model")

    specs = folder_models(tmp_path)
    assert sorted(specs) == ["Llama-3.2-1B-Q4", "gemma-3-4b-it", "kimi", "top"]
    assert all(spec.problem is None for spec in specs.values())
    llama = specs["Llama-3.2-1B-Q4"]
    assert source(llama).projector == tmp_path / "mmproj-Llama-3.2-1B-Q4.gguf"
    assert llama.context_window == MAX_DEFAULT_WINDOW, "a 128k model is served at 32k unless told"
    assert not llama.context_configured
    assert source(specs["gemma-3-4b-it"]) == DiskFile(gemma / "gemma-3-4b-it-Q8_0.gguf", gemma / "mmproj-F16.gguf")
    assert specs["gemma-3-4b-it"].context_window == 8192
    assert source(specs["kimi"]).path == kimi / "kimi-00001-of-00003.gguf"
    assert source(specs["top"]).path == tmp_path / "top-00001-of-00002.gguf"
    assert "in 3 shards" in specs["kimi"].notes


def test_bad_files_are_listed_with_their_error_and_the_others_are_served(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_gguf(tmp_path / "good.gguf")
    (tmp_path / "text.gguf").write_text("hello, not a GGUF\n" * 10)
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[: len(whole) - 40])
    write_gguf(tmp_path / "split-00001-of-00003.gguf", shards=3)
    write_gguf(tmp_path / "split-00002-of-00003.gguf")
    write_gguf(tmp_path / "lonely.gguf", projector=True)
    pair = tmp_path / "pair"
    pair.mkdir()
    write_gguf(pair / "a.gguf")
    write_gguf(pair / "b.gguf")

    with caplog.at_level(logging.ERROR, logger="ors.models"):
        specs = operator_models(tmp_path, None).specs
    assert specs["good"].problem is None
    assert "text.gguf is not a GGUF file" in (specs["text"].problem or "")
    assert "cut.gguf" in (specs["cut"].problem or "")
    assert "split-00003-of-00003.gguf cannot be found" in (specs["split"].problem or "")
    assert "is a multimodal projector, not a model" in (specs["lonely"].problem or ""), \
        "a projector that goes with no model is named, not served as one"
    assert "pair" not in specs, "a model's folder holds one model"
    errors = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 5, errors
    assert any("pair" in line and "a.gguf" in line for line in errors)


def test_built_in_ids_are_not_taken_by_a_file(tmp_path: Path) -> None:
    write_gguf(tmp_path / "qwen2.5-coder-1.5b-instruct.gguf")
    assert folder_models(tmp_path) == {}


def test_a_shard_set_is_found_by_its_names() -> None:
    assert shard_paths(Path("m-00001-of-00002.gguf")) == [Path("m-00001-of-00002.gguf"), Path("m-00002-of-00002.gguf")]
    assert shard_paths(Path("m.gguf")) == [Path("m.gguf")]


def test_read_facts_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="missing.gguf cannot be read"):
        read_facts(tmp_path / "missing.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelError, match="empty.gguf is not a GGUF file"):
        read_facts(tmp_path / "empty.gguf")
    facts = read_facts(write_gguf(tmp_path / "m.gguf", "qwen2", context=4096, template=None))
    assert (facts.architecture, facts.context_length, facts.chat_template) == ("qwen2", 4096, None)


def test_a_file_is_read_again_only_once_it_changed(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", "qwen2", context=4096, template=None)
    first = read_facts(path)
    assert read_facts(path) is first  # unchanged: the facts read before
    write_gguf(path, "llama", context=8192, template=None)
    changed = read_facts(path)
    assert (changed.architecture, changed.context_length) == ("llama", 8192)
    path.write_bytes(path.read_bytes()[:100])  # cut short after it was read
    with pytest.raises(ModelError, match="m.gguf"):
        read_facts(path)


ENTRIES = """
[models.coder]
path = "files/coder.gguf"
context = 2048
parallel = 2
kv_type = "q8_0"
aliases = ["my-coder", "gpt-4o-mini"]
temperature = 0.0
top_k = 1
max_output_tokens = 64
chat_template_file = "files/coder.jinja"

[models.folded]
path = "folder/Llama.gguf"
"""


def entries(tmp_path: Path, text: str = ENTRIES) -> Path:
    files = tmp_path / "files"
    files.mkdir(exist_ok=True)
    write_gguf(files / "coder.gguf", "qwen2", template="{{ tools }}{% for m in messages %}{{ m.content }}{% endfor %}")
    (files / "coder.jinja").write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    config = tmp_path / "ors.toml"
    config.write_text(text)
    return config


def test_entries_add_models_with_their_settings(tmp_path: Path) -> None:
    config = entries(tmp_path)
    folder = tmp_path / "folder"
    folder.mkdir()
    write_gguf(folder / "Llama.gguf", context=4096)
    write_gguf(folder / "mmproj-Llama.gguf", projector=True)
    found = operator_models(folder, config)
    assert sorted(found.specs) == ["Llama", "coder", "folded"], "an entry may name a folder's file"
    coder = found.specs["coder"]
    assert (coder.context_window, coder.context_configured, coder.parallel, coder.kv_type) == (2048, True, 2, "q8_0")
    assert (coder.sampling.temperature, coder.sampling.top_k, coder.default_max_output_tokens) == (0.0, 1, 64)
    assert coder.chat_template == (tmp_path / "files" / "coder.jinja").read_text()
    assert not coder.template_renders_tools, "the override has no tools section, whatever the file's had"
    assert found.aliases == {"my-coder": "coder", "gpt-4o-mini": "coder"}
    assert source(found.specs["folded"]).projector == folder / "mmproj-Llama.gguf", "the folder's projector goes with it"


@pytest.mark.parametrize(("text", "expected"), [
    ('[models.a]\npath = "files/coder.gguf"\nspeed = 3\n', "models.a.speed: Extra inputs are not permitted"),
    ('[models.a]\npath = "files/nothing.gguf"\n', "models.a.path: "),
    ('[models.a]\npath = "files/coder.gguf"\ncontext = "big"\n', "models.a.context: "),
    ('[models.a]\npath = "files/coder.gguf"\ncontext = 16\n', "models.a.context: "),
    ('[models.a]\npath = "files/coder.gguf"\nkv_type = "q2"\n', "models.a.kv_type: "),
    ('[models.smollm2-135m-instruct]\npath = "files/coder.gguf"\n', "already the id or alias of another model"),
    ('[models.a]\npath = "files/coder.gguf"\n[models.b]\npath = "files/coder.gguf"\naliases = ["a"]\n',
     "models.b: 'a' is already"),
    ('[models."a/b"]\npath = "files/coder.gguf"\n', "a model id is"),
    ('[models.a]\npath = "files/coder.gguf"\nchat_template = "x"\nchat_template_file = "files/coder.jinja"\n',
     "either 'chat_template' or 'chat_template_file'"),
    ("[models.a\n", "not valid TOML"),
])
def test_a_wrong_entry_is_refused_with_where_and_why(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ModelsConfigError, match="ORS_CONFIG") as caught:
        operator_models(None, entries(tmp_path, text))
    assert expected in str(caught.value)


def test_a_models_dir_that_is_no_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelsConfigError, match="ORS_MODELS_DIR .*: not a directory"):
        operator_models(tmp_path / "nowhere", None)


def test_ors_serve_exits_2_on_a_wrong_entry(tmp_path: Path) -> None:
    config = entries(tmp_path, '[models.a]\npath = "files/none.gguf"\n')
    done = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--port", "0"], capture_output=True, text=True,
                          timeout=120, env={"ORS_CONFIG": str(config), "ORS_DATA_DIR": str(tmp_path / "data"),
                                            "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "models.a.path" in done.stderr


def test_who_reads_a_models_calls() -> None:
    hermes = "{{ '<tool_call>' }}{\"name\": ...}{{ '</tool_call>' }}"
    assert chat_parser("auto", hermes) == "ors", "Hermes/Qwen2.5 calls: this server's own parser and grammars"
    assert chat_parser("auto", hermes + "<think>") == "llama.cpp", "reasoning: llama.cpp's parsers"
    assert chat_parser("auto", hermes + "<function=") == "llama.cpp", "Qwen3's XML calls"
    assert chat_parser("auto", "<|start_header_id|>{{ tools }}") == "llama.cpp"
    assert chat_parser("auto", None) == "llama.cpp"
    assert chat_parser("ors", "<|start_header_id|>") == "ors", "an entry's choice stands"
