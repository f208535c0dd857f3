"""A fake ``codex`` executable, named as such: it records how ``ors codex`` started it.

Used only where a test must see the arguments, the environment and the Codex home that
``ors codex`` hands to Codex (the real Codex is run by the tests marked ``codex``). It
answers ``--version`` like Codex 0.171.0 and ``debug models --bundled`` with a catalog
whose model with direct tools has the instructions :data:`INSTRUCTIONS`; any other invocation writes a JSON record
(argv, the environment's ``CODEX_HOME`` and key, the home's files) to the file named by
``FAKE_CODEX_RECORD`` and exits with ``FAKE_CODEX_EXIT`` (0).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

VERSION = "0.171.0"
INSTRUCTIONS = "You are the fake Codex's default agent. These are its whole instructions."


def install(directory: Path) -> Path:
    """An executable ``codex`` in ``directory`` that runs this module; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "codex"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
    script.chmod(0o755)
    return script


def main(argv: list[str]) -> int:
    if argv == ["--version"]:
        print(f"codex-cli {VERSION}")
        return 0
    if argv == ["debug", "models", "--bundled"]:
        print(json.dumps({"models": [
            {"slug": "gpt-fake-lite", "priority": 1, "visibility": "list", "use_responses_lite": True,
             "tool_mode": "code_mode_only", "base_instructions": "Instructions for another tool setup."},
            {"slug": "gpt-fake", "priority": 2, "visibility": "list", "use_responses_lite": False,
             "base_instructions": INSTRUCTIONS},
        ]}))
        return 0
    home = Path(os.environ["CODEX_HOME"])
    record = {
        "argv": argv,
        "codex_home": str(home),
        "key": os.environ.get("ORS_CODEX_API_KEY"),
        "home_mode": home.stat().st_mode & 0o777,
        "files": {path.name: {"text": path.read_text(), "mode": path.stat().st_mode & 0o777}
                  for path in sorted(home.iterdir()) if path.is_file()},
    }
    Path(os.environ["FAKE_CODEX_RECORD"]).write_text(json.dumps(record))
    return int(os.environ.get("FAKE_CODEX_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
