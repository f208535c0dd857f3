"""The instruction counter of :mod:`bench.instructions`: its driver sends real requests
through ors's app and the floor's, in front of the real stub, and raises on an answer
that did not complete; under callgrind (where valgrind is installed) a child's count is
read from its dump. No figure is asserted beyond its being one."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import instructions
from bench.stub import StubProcess
from tests.live import free_port


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StubProcess]:
    with StubProcess(free_port(), tmp_path_factory.mktemp("stub") / "stub.log") as running:
        yield running


@pytest.mark.parametrize("fmt", instructions.FORMATS)
@pytest.mark.parametrize("target", instructions.TARGETS)
def test_the_driver_completes_requests_between_its_marks(
    stub: StubProcess, target: str, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORS_LOG_LEVEL", "warning")
    marks: list[str] = []
    asyncio.run(instructions.drive(target, fmt, stub.base_url, requests=3, warm=2, between=marks.append))
    assert marks == ["zero", "dump"]


def test_an_answer_that_did_not_complete_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORS_LOG_LEVEL", "warning")
    nowhere = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: ors answers with an error
    with pytest.raises(RuntimeError, match="did not complete"):
        asyncio.run(instructions.drive("unstored", "json", nowhere, requests=1, warm=0))


@pytest.mark.skipif(shutil.which("callgrind_control") is None, reason="valgrind is not installed")
@pytest.mark.slow
def test_a_child_under_callgrind_reports_its_count(stub: StubProcess, tmp_path: Path) -> None:
    per_request = instructions.count("floor", "json", stub.base_url, requests=5, warm=2, work=tmp_path)
    assert per_request > 0
    dump = next(tmp_path.glob("floor-json.*.1"))
    assert instructions.dump_total(dump) == per_request * 5


def test_the_report_sets_ors_over_the_floor_only_where_both_were_counted() -> None:
    counts = {"unstored": {"json": 300.0, "sse": 500.0}, "stored": {"sse": 600.0}, "floor": {"sse": 100.0}}
    result = instructions.report(counts, requests=10, warm=2)
    assert result["over_floor"] == {"unstored": {"sse": 5.0}, "stored": {"sse": 6.0}}
    assert result["above_floor"] == {"unstored": {"sse": 400.0}, "stored": {"sse": 500.0}}
    assert instructions.report({"stored": {"json": 1.0}}, requests=1, warm=0)["over_floor"] == {"stored": {}}
