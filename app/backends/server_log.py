"""A model server's log: its output drained into a file of bounded size, its errors into
this server's log, and the last lines of its latest process for an error message.

:func:`forward_output` runs in a thread of its own per process (see
:class:`~app.backends.llama_server.LlamaServer`): the pipe must be read whatever the
event loop is doing, since a child whose pipe is full stops.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import IO

log = logging.getLogger("ors.llama_server")

START_MARK = "--- ors starts llama-server"
"""The line written to a model's log before each process's own output."""
LOG_FILE_BYTES = 16 * 1024 * 1024
"""A model's log file is rotated once it would pass this (one earlier file is kept)."""


_LEVEL = re.compile(rb"[0-9.]+ ([IWED]) ")
"""llama.cpp's line prefix: the time since its start, then its level."""
_LEVELS = {b"E": logging.ERROR}
"""Only llama.cpp's errors are this server's errors. Its warnings are routine notes: a
GGUF's token types at every load, and two or three lines for every request whose prompt
was wholly cached ("need to evaluate at least 1 token", "cancel task"); at info they
would have doubled the log. They stay in the file, and at debug here."""


def mark_start(path: Path, port: int) -> None:
    """Note in the log that a new process starts (:func:`tail` reads from the last one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as output:
        output.write(f"{START_MARK} on port {port}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines the current (or last) process wrote to its log."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    own = text.rsplit(START_MARK, 1)[-1].split("\n", 1)[-1] if START_MARK in text else text
    return "\n".join(own.splitlines()[-lines:])


def forward_output(output: IO[bytes], path: Path, name: str) -> None:
    """In a thread of its own, until the process's output ends: each line it writes is
    appended to its log file (``ORS_DATA_DIR/logs/<model>.log``, kept under
    :data:`LOG_FILE_BYTES`, :class:`LogFile`), and those llama.cpp marks as errors
    (``E``) are logged by this server too, as ``ors.llama_server`` errors. Its other lines
    (its warnings, what each request took, its slots' choices) stay in the file;
    ``ORS_LOG_LEVEL=debug`` shows them here as well.

    The pipe is always drained, whatever becomes of the file: a child whose output is not
    read stops when the pipe is full."""
    file = LogFile(path)
    with output:
        for line in output:
            file.write(line)
            mark = _LEVEL.match(line)
            level = _LEVELS.get(mark.group(1), logging.DEBUG) if mark else logging.DEBUG
            if log.isEnabledFor(level):
                text = line[mark.end():] if mark else line
                log.log(level, "llama-server %s: %s", name, text.decode(errors="replace").rstrip())
    file.close()


class LogFile:
    """A model server's log, appended to by one thread and kept under
    :data:`LOG_FILE_BYTES`: a line that would pass it first turns the file into
    ``<name>.1`` (replacing the one before) and starts a new one, so a model's log takes
    at most twice that (it grew by about a kilobyte per request, for ever). A file that
    cannot be written is given up, said once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: IO[bytes] | None = None
        self.size = 0
        self._open()

    def _open(self) -> None:
        try:
            self.file = self.path.open("ab", buffering=0)
            self.size = self.file.tell()
        except OSError as exc:
            log.warning("cannot write llama-server's log %s: %r", self.path, exc)
            self.file = None

    def write(self, line: bytes) -> None:
        if self.file is None:
            return
        try:
            if self.size and self.size + len(line) > LOG_FILE_BYTES:
                self.file.close()
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self._open()
                if self.file is None:
                    return
            self.file.write(line)
            self.size += len(line)
        except OSError as exc:
            log.warning("cannot write llama-server's log %s any more: %r", self.path, exc)
            self.close()

    def close(self) -> None:
        file, self.file = self.file, None
        if file is not None:
            file.close()
