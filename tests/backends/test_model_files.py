from __future__ import annotations

import hashlib
import json
import os
import pty
import select
import sys
from pathlib import Path

import pytest

from app.backends.model_files import (
    LOCAL_MODELS,
    SMOLLM2,
    ModelFiles,
    ModelSpec,
    PackagedFile,
    SingleFile,
    SplitFile,
    locate,
)
from app.errors import ModelError

QWEN = "qwen2.5-coder-1.5b-instruct"
PART_CONTENTS = [b"first part|", b"second part|", b"third"]


@pytest.fixture
def split_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelSpec:
    """A tiny model split over three fake installed packages, ``ors_fake_part1..3``."""
    site = tmp_path / "site"
    for i, content in enumerate(PART_CONTENTS, start=1):
        package = site / f"ors_fake_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('packages are located, never imported')\n")
        (package / "data" / f"part{i:02d}.bin").write_bytes(content)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(PART_CONTENTS)
    return ModelSpec(
        id="fake-split",
        source=SplitFile(
            parts=tuple(
                PackagedFile(f"ors_fake_part{i}", f"data/part{i:02d}.bin", f"ors-fake-part{i}==1.0")
                for i in range(1, 4)
            ),
            filename="fake.gguf",
            install_hint="pip install ors-fake-part1 ors-fake-part2 ors-fake-part3",
        ),
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
    )


def files_for(spec: ModelSpec, cache_dir: Path) -> ModelFiles:
    return ModelFiles(cache_dir, {spec.id: spec})


def test_registry_lists_both_models() -> None:
    assert set(LOCAL_MODELS) == {QWEN, "smollm2-135m-instruct"}
    assert {spec.id: spec.context_window for spec in LOCAL_MODELS.values()} == {QWEN: 32768, "smollm2-135m-instruct": 8192}


@pytest.mark.model
def test_smollm2_is_found_in_its_package_and_verified(tmp_path: Path) -> None:
    path = ModelFiles(tmp_path).path(SMOLLM2.id)

    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == SMOLLM2.size
    assert not any(tmp_path.iterdir()), "a packaged file is used in place"


@pytest.mark.model
def test_a_packaged_file_with_the_wrong_hash_is_refused(tmp_path: Path) -> None:
    tampered = ModelSpec(id="tampered", source=SMOLLM2.source, sha256="0" * 64, size=SMOLLM2.size)

    with pytest.raises(ModelError, match="does not match"):
        files_for(tampered, tmp_path).path("tampered")


def test_a_missing_package_names_what_to_install(tmp_path: Path) -> None:
    missing = ModelSpec(
        id="missing",
        source=SingleFile(
            PackagedFile("ors_no_such_package", "model.gguf", "ors-no-such-package==1.0"),
            install_hint="pip install ors-no-such-package==1.0",
        ),
        sha256="0" * 64,
        size=1,
    )

    with pytest.raises(ModelError) as raised:
        files_for(missing, tmp_path).path("missing")
    assert "ors-no-such-package==1.0" in raised.value.message
    assert raised.value.code == "model_unavailable"


def test_split_parts_are_assembled_in_order_with_a_marker(split_model: ModelSpec, tmp_path: Path) -> None:
    path = files_for(split_model, tmp_path / "cache").path(split_model.id)

    assert path == tmp_path / "cache" / "models" / "fake.gguf"
    assert path.read_bytes() == b"".join(PART_CONTENTS)
    marker = json.loads(path.with_name("fake.gguf.verified").read_text())
    assert marker == {"sha256": split_model.sha256, "size": split_model.size}
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf", "fake.gguf.verified"]


def test_an_assembled_file_is_reused_without_the_parts(
    split_model: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    first = files_for(split_model, cache).path(split_model.id)
    modified = first.stat().st_mtime_ns
    monkeypatch.setattr("app.backends.model_files.locate", lambda part: None)

    again = files_for(split_model, cache).path(split_model.id)

    assert again == first and again.stat().st_mtime_ns == modified


def test_a_corrupt_assembled_file_is_rebuilt(split_model: ModelSpec, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = files_for(split_model, cache).path(split_model.id)
    path.with_name("fake.gguf.verified").unlink()
    path.write_bytes(b"x" * split_model.size)

    assert files_for(split_model, cache).path(split_model.id).read_bytes() == b"".join(PART_CONTENTS)


def test_parts_that_do_not_hash_right_leave_nothing_behind(split_model: ModelSpec, tmp_path: Path) -> None:
    wrong = ModelSpec(id=split_model.id, source=split_model.source, sha256="0" * 64, size=split_model.size)
    cache = tmp_path / "cache"

    with pytest.raises(ModelError, match="do not assemble"):
        files_for(wrong, cache).path(wrong.id)
    assert list((cache / "models").iterdir()) == []


def test_a_missing_part_names_its_package(split_model: ModelSpec, tmp_path: Path) -> None:
    (tmp_path / "site" / "ors_fake_part2" / "data" / "part02.bin").unlink()

    with pytest.raises(ModelError, match="ors-fake-part2==1.0") as raised:
        files_for(split_model, tmp_path / "cache").path(split_model.id)
    assert "ors-fake-part1" not in raised.value.message.split("Install")[0]


def test_locate_never_imports_the_package(split_model: ModelSpec) -> None:
    assert isinstance(split_model.source, SplitFile)
    assert locate(split_model.source.parts[0]) is not None


@pytest.mark.slow
def test_qwen_parts_assemble_into_the_known_file(qwen_cache_dir: Path) -> None:
    files = ModelFiles(qwen_cache_dir)
    path = files.path(QWEN)

    assert path == files.assembled_path(QWEN)
    assert path.stat().st_size == LOCAL_MODELS[QWEN].size
    assert path.with_name(path.name + ".verified").is_file()


def test_assembly_logs_its_progress(split_model: ModelSpec, tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import app.backends.model_files as model_files

    monkeypatch.setattr(model_files, "_CHUNK", max(1, split_model.size // 20))  # many chunks for a tiny file
    with caplog.at_level("INFO", logger="ors.models"):
        files_for(split_model, tmp_path / "cache").path(split_model.id)
    lines = [record.getMessage() for record in caplog.records if record.name == "ors.models"]
    assert lines[0].startswith("assembling model 'fake-split'")
    progress = [line for line in lines if "%" in line]
    assert [line.split(": ")[1].split("%")[0] for line in progress] == [str(p) for p in range(10, 100, 10)]
    assert lines[-1].startswith("assembled model 'fake-split' in")
    caplog.clear()
    with caplog.at_level("INFO", logger="ors.models"):
        files_for(split_model, tmp_path / "cache").path(split_model.id)  # already there: silent
    assert not [r for r in caplog.records if r.name == "ors.models"]


def test_assembly_draws_a_live_line_on_a_terminal(split_model: ModelSpec, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Standard error is a real pseudo-terminal here: the progress is one redrawn line
    (percent and megabytes), not ten log lines."""
    import app.backends.model_files as model_files

    leader, follower = pty.openpty()
    terminal = os.fdopen(follower, "w", buffering=1)
    monkeypatch.setattr(model_files, "_CHUNK", max(1, split_model.size // 20))
    monkeypatch.setattr(sys, "stderr", terminal)
    try:
        with caplog.at_level("INFO", logger="ors.models"):
            files_for(split_model, tmp_path / "cache").path(split_model.id)
        terminal.flush()
        drawn = b""
        while select.select([leader], [], [], 0.2)[0]:
            drawn += os.read(leader, 65536)
    finally:
        terminal.close()
        os.close(leader)
    frames = drawn.decode().replace("\r\n", "\n").split("\r")
    shown = [frame for frame in frames if frame.startswith("assembling model 'fake-split':")]
    assert len(shown) >= 10 and shown[-1].rstrip().endswith("MB)") and "100%" in shown[-1]
    assert "MB" in shown[0] and "%" in shown[0]
    assert not [r for r in caplog.records if "%" in r.getMessage()]  # no per-10% log lines on a terminal
