"""Every setting is discoverable: a documented field of ``Settings``, a flag of
``ors serve`` whose help shows its default and variable, and a row of the README's table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import build_parser, settings_from
from app.config import Settings

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_variables() -> set[str]:
    text = README.read_text()
    table = text[text.index("## Settings"):]
    table = table[: table.index("\n## ", 1)]
    return set(re.findall(r"^\| `(ORS_[A-Z0-9_]+)`", table, flags=re.MULTILINE))


def test_every_setting_has_a_docstring() -> None:
    missing = [name for name, field in Settings.model_fields.items() if not field.description]
    assert missing == []


def test_the_readme_table_lists_exactly_the_settings() -> None:
    fields = {f"ORS_{name.upper()}" for name in Settings.model_fields}
    assert _readme_variables() == fields


def test_serve_help_lists_every_setting_with_its_default() -> None:
    help_text = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    flat = " ".join(help_text.split())
    for name in Settings.model_fields:
        assert f"--{name.replace('_', '-')} VALUE" in flat
        assert f"env ORS_{name.upper()}]" in flat
    assert "[default: 8080; env ORS_PORT]" in flat


@pytest.mark.parametrize(("argv", "name", "expected"), [
    (["--model-parallel", "8"], "model_parallel", 8),
    (["--model-aliases", "a=b,c=d"], "model_aliases", {"a": "b", "c": "d"}),
    (["--max-json-depth", "64"], "max_json_depth", 64),
])
def test_a_flag_parses_as_its_variable(argv: list[str], name: str, expected: object) -> None:
    assert getattr(settings_from(build_parser().parse_args(["serve", *argv])), name) == expected


def test_a_bad_value_is_a_clear_error() -> None:
    result = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--port", "abc"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "--port / ORS_PORT" in result.stderr and "Traceback" not in result.stderr


def test_an_unusable_key_entry_is_a_clear_error() -> None:
    result = subprocess.run([sys.executable, "-m", "app.cli", "serve"], capture_output=True, text=True,
                            env={**os.environ, "ORS_API_KEYS": "key-x:abc"})
    assert result.returncode == 2
    assert "reserved" in result.stderr and "Traceback" not in result.stderr and "abc" not in result.stderr


def test_a_body_budget_smaller_than_one_body_is_a_clear_error() -> None:
    result = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--max-body-bytes", "1000",
                             "--max-body-bytes-in-flight", "999"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "--max-body-bytes-in-flight / ORS_MAX_BODY_BYTES_IN_FLIGHT" in result.stderr
    assert "Traceback" not in result.stderr
    assert settings_from(build_parser().parse_args(["serve", "--max-body-bytes-in-flight", "0"])) \
        .max_body_bytes_in_flight == 0
