"""What becomes of llama-server's output (``server_log.forward_output``), fed through a real pipe as
the child writes it: every line in its log file, the file rotated before it passes its
bound, llama.cpp's errors in this server's log and its warnings not."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from app.backends import server_log
from app.backends.server_log import forward_output


def feed(lines: list[bytes], path: Path) -> None:
    read, write = os.pipe()
    pump = threading.Thread(target=forward_output, args=(os.fdopen(read, "rb"), path, "model.gguf"))
    pump.start()
    with os.fdopen(write, "wb") as output:
        for line in lines:
            output.write(line)
    pump.join(timeout=10)
    assert not pump.is_alive()


def test_each_line_goes_to_the_file_and_errors_to_the_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "model.log"
    lines = [b"0.00.000.100 I srv  load_model: loading\n",
             b"0.00.000.200 W srv  init: a routine note\n",
             b"0.00.000.300 E srv  send_error: Unable to restore slot\n",
             b"a line without llama.cpp's prefix\n"]
    with caplog.at_level(logging.INFO, logger="ors.llama_server"):
        feed(lines, path)
    assert path.read_bytes() == b"".join(lines)
    logged = [(record.levelno, record.getMessage()) for record in caplog.records]
    assert logged == [(logging.ERROR, "llama-server model.gguf: srv  send_error: Unable to restore slot")]


def test_the_file_is_rotated_before_it_passes_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_log, "LOG_FILE_BYTES", 1000)
    path = tmp_path / "model.log"
    path.write_bytes(b"x" * 900 + b"\n")  # what an earlier process wrote
    lines = [f"0.00.000.{n:03d} I slot print_timing: request {n}\n".encode() for n in range(100)]
    feed(lines, path)
    current, previous = path.read_bytes(), (tmp_path / "model.log.1").read_bytes()
    assert len(current) <= 1000 and len(previous) <= 1000
    assert current.endswith(lines[-1])  # the newest lines are in the file itself
    assert not (tmp_path / "model.log.2").exists()
    kept = (previous + current).splitlines(keepends=True)
    assert kept == lines[-len(kept):]  # what is kept is the latest, in order, nothing torn
