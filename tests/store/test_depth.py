"""A continuation writes only its new items, and rebuilding its context is a fixed number
of statements, whatever the depth of the chain.

Printed (run with ``-s``): per turn, the time to rebuild the context (``chain`` of the
previous response) and to record the turn (``begin`` + ``finish``), as medians of the
first and last ten turns. Recording is flat; the rebuild grows only with the bytes it
must return (every item of the chain), not with the number of statements. The times are
printed, not held to a bound: on a loaded machine they say more about the load (what a
chain's turn 1,000 costs against its turn 2 is measured by ``make bench``).
"""

from __future__ import annotations

import statistics
import time

import pytest
from sqlalchemy import event

from app.store.sql import SqlResponseStore
from tests.store.helpers import assistant_message, events_of, final, new_response, row_count, user_message

pytestmark = pytest.mark.anyio

DEPTH = 200
WINDOW = 10
"""Turns whose median is taken at each end, to smooth out scheduling noise."""


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


async def test_turn_200_runs_what_turn_2_runs(store: SqlResponseStore, tenant: str) -> None:
    statements: list[str] = []

    def reads(conn: object, cursor: object, statement: str, *rest: object) -> None:
        # Only the reads a chain makes: SQLite's writer thread may still be closing the
        # previous turn's transaction (its COMMIT, a checkpoint) while chain() runs.
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            statements.append(statement)

    event.listen(store.statement_engine, "before_cursor_execute", reads)
    rebuild: list[float] = []
    record: list[float] = []
    chain_statements: list[int] = []
    previous: str | None = None
    for number in range(1, DEPTH + 1):
        begun = new_response(tenant, previous=previous,
                             inputs=[user_message(f"question {number}: " + "words " * 40)])
        output = [assistant_message(f"answer {number}: " + "more words " * 40)]
        started = time.perf_counter()
        if previous is not None:
            statements.clear()
            links = await store.chain(tenant, previous)
            chain_statements.append(len(statements))
            assert links is not None and len(links) == number - 1
        rebuilt = time.perf_counter()
        await store.begin(begun)
        await store.finish(tenant, begun.id, final(begun, output), output, events_of(begun.id, 20))
        rebuild.append(rebuilt - started)
        record.append(time.perf_counter() - rebuilt)
        assert await row_count(store, "items", begun.id) == 2  # only its own items
        previous = begun.id

    def early(series: list[float]) -> float:
        return statistics.median(series[1 : 1 + WINDOW])  # turns 2..11

    def late(series: list[float]) -> float:
        return statistics.median(series[-WINDOW:])  # turns 191..200

    total = [a + b for a, b in zip(rebuild, record, strict=True)]
    print(f"\n[{store.url.get_backend_name()}] median store time per turn, turns 2-11 -> "
          f"{DEPTH - WINDOW + 1}-{DEPTH}: total {ms(early(total))} -> {ms(late(total))}; "
          f"chain() {ms(early(rebuild))} -> {ms(late(rebuild))}; "
          f"begin+finish {ms(early(record))} -> {ms(late(record))}; "
          f"statements per chain(): {chain_statements[0]} at depth 1, {chain_statements[-1]} at depth {DEPTH - 1}")
    assert chain_statements[0] > 0 and len(set(chain_statements)) == 1, chain_statements
    assert await row_count(store, "items") == 2 * DEPTH
