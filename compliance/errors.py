"""The single exception type of the conformance oracle."""

from __future__ import annotations


class ConformanceError(AssertionError):
    """A server output violates the Open Responses specification.

    It subclasses ``AssertionError`` so that a failing check reads as a failed assertion
    in a test suite. ``str(error)`` is a complete, human-readable statement of the
    violation; when the problem sits at a location inside a JSON document, that location
    is part of the message (``$.output[0].content[0].annotations``) and is also kept in
    ``json_path``.
    """

    def __init__(self, message: str, *, json_path: str | None = None) -> None:
        super().__init__(message)
        self.json_path = json_path
