"""Every setting is discoverable: a documented field of ``Settings``, a flag of
``ors serve`` whose help shows its default and variable, and a row of the README's table,
which is generated from ``Settings``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app import settings_doc
from app.cli import build_parser, settings_from
from app.config import Settings


def test_every_setting_has_a_docstring() -> None:
    missing = [name for name, field in Settings.model_fields.items() if not field.description]
    assert missing == []


def test_the_readme_table_is_the_one_generated_from_settings() -> None:
    readme = settings_doc.readme_table(settings_doc.README.read_text(encoding="utf-8"))
    assert readme == settings_doc.render_table(), (
        "README.md's settings table differs from the fields of app.config.Settings; "
        "regenerate it with `python -m app.settings_doc`")


def test_the_table_has_a_row_per_setting_with_its_default() -> None:
    rows = settings_doc.render_table().splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == [f"| `ORS_{name.upper()}`" for name in Settings.model_fields]
    assert "| `ORS_PORT` | `8080` | The port to listen on. |" in rows
    assert any(row.startswith("| `ORS_DATABASE_URL` | unset | ") for row in rows)
    assert any(row.startswith("| `ORS_ALLOW_UNAUTHENTICATED` | `false` | ") for row in rows)
    assert any(row.startswith("| `ORS_DATA_DIR` | `./data` | ") for row in rows)


def test_regenerating_rewrites_only_the_table() -> None:
    text = "# Title\n\nbefore\n\n" + settings_doc.BEGIN + "\n| old |\n" + settings_doc.END + "\n\nafter\n"
    rewritten = settings_doc.with_table(text, settings_doc.render_table())
    assert rewritten.startswith("# Title\n\nbefore\n\n" + settings_doc.BEGIN + "\n| variable |")
    assert rewritten.endswith("\n" + settings_doc.END + "\n\nafter\n")
    assert settings_doc.readme_table(rewritten) == settings_doc.render_table()


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
