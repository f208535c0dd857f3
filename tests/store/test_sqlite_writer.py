"""SQLite's writer process: its lifetime follows the server's, a writer that dies is
replaced, and what cannot cross between the two processes fails alone, clearly."""

from __future__ import annotations

import asyncio
import functools
import os
import pickle
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from sqlalchemy.engine import Connection

from app.errors import ServerError
from app.store.engines import sqlite_url
from app.store.schema import Serialized
from app.store.sql import SqlResponseStore
from app.store.sqlite_writer import WriterProcess, WriterStopped, from_wire, wire_form
from tests.store.helpers import new_response

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqlResponseStore]:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), secrets.token_hex(8))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def _writer(store: SqlResponseStore) -> WriterProcess:
    assert isinstance(store._group, WriterProcess)
    return store._group


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has ended too: its parent has not taken its exit status yet
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] != "Z"


async def _until_gone(pid: int) -> None:
    started = time.monotonic()
    while _alive(pid):
        assert time.monotonic() - started < 30, f"the writer {pid} is still running"
        await anyio.sleep(0.05)


def _sleep(seconds: float, connection: Connection) -> str:
    time.sleep(seconds)
    return "slept"


def _sleeping(seconds: float) -> functools.partial[str]:
    return functools.partial(_sleep, seconds)


def _unpicklable(connection: Connection) -> object:
    return lambda: None


def _pid(connection: Connection) -> int:
    return os.getpid()


async def test_writes_run_in_a_process_of_their_own(sqlite_store: SqlResponseStore) -> None:
    writer = _writer(sqlite_store)
    assert writer.pid is not None
    assert await writer.run(_pid) == writer.pid != os.getpid()


async def test_interrupts_sent_to_the_process_group_do_not_stop_the_writer(
    sqlite_store: SqlResponseStore, tenant: str
) -> None:
    writer = _writer(sqlite_store)
    assert writer.pid is not None
    for number in (signal.SIGINT, signal.SIGTERM):
        os.kill(writer.pid, number)
    await anyio.sleep(0.2)
    one = new_response(tenant)
    await sqlite_store.begin(one)
    assert await sqlite_store.get(tenant, one.id) is not None
    assert await writer.run(_pid) == writer.pid


async def test_a_writer_that_dies_fails_what_waited_and_the_next_write_starts_another(
    sqlite_store: SqlResponseStore, tenant: str
) -> None:
    writer = _writer(sqlite_store)
    before = new_response(tenant)
    await sqlite_store.begin(before)
    first = writer.pid
    assert first is not None
    waiting = asyncio.ensure_future(writer.run(_sleeping(2.0)))
    await anyio.sleep(0.3)  # taken by the writer
    os.kill(first, signal.SIGKILL)
    with pytest.raises(WriterStopped) as stopped:
        await waiting
    assert isinstance(stopped.value, ServerError)
    after = new_response(tenant)
    await sqlite_store.begin(after)
    assert writer.pid not in (None, first)
    assert not _alive(first)
    for one in (before, after):
        assert await sqlite_store.get(tenant, one.id) is not None


async def test_what_cannot_cross_fails_alone(sqlite_store: SqlResponseStore, tenant: str) -> None:
    writer = _writer(sqlite_store)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        await writer.run(lambda connection: None)  # not sent at all: a local function
    held = asyncio.ensure_future(writer.run(_sleeping(0.3)))
    await anyio.sleep(0.1)
    one = new_response(tenant)
    outcomes = await asyncio.gather(writer.run(_unpicklable), sqlite_store.begin(one), return_exceptions=True)
    assert await held == "slept"
    assert isinstance(outcomes[0], ServerError) and "cannot send back" in outcomes[0].message
    assert outcomes[1] is None
    assert await sqlite_store.get(tenant, one.id) is not None


async def test_closing_lets_every_write_sent_commit_then_stops_the_writer(tmp_path: Path, tenant: str) -> None:
    url = sqlite_url(tmp_path / "ors.db")
    store = SqlResponseStore(url, secrets.token_hex(8))
    await store.open()
    pid = _writer(store).pid
    assert pid is not None
    begun = [new_response(tenant) for _ in range(50)]
    writes = [asyncio.ensure_future(store.begin(one)) for one in begun]
    await anyio.sleep(0)  # every one sent
    await store.close()
    assert [write.result() for write in writes] == [None] * 50
    assert not _alive(pid)
    again = SqlResponseStore(url, secrets.token_hex(8))
    await again.open()
    try:
        for one in begun:
            assert await again.get(tenant, one.id) is not None
    finally:
        await again.close()


async def test_the_writer_ends_when_the_server_is_killed(tmp_path: Path, tenant: str) -> None:
    """``kill -9`` of the server: its writer sees the socket close and ends."""
    child = await anyio.run_process(
        [sys.executable, "-m", "tests.store.crash_child", sqlite_url(tmp_path / "ors.db"), "doomed", tenant,
         "resp_" + secrets.token_hex(8), "resp_" + secrets.token_hex(8)],
        cwd=ROOT, check=False,
    )
    assert child.returncode == -9, child.stderr.decode()
    word, pid = child.stdout.decode().split()
    assert word == "running"
    await _until_gone(int(pid))




def _record(tenant: str, resource: Serialized, rows: list[dict[str, object]], body: object,
            connection: Connection, *, flush: bool = True) -> None:
    raise AssertionError("only sent, never run")


def _shadowed_then_replaced(connection: Connection) -> None:
    raise AssertionError("never sent")


_first_of_the_name = _shadowed_then_replaced


def _shadowed_then_replaced(connection: Connection) -> None:  # type: ignore[no-redef]  # noqa: F811
    raise AssertionError("never sent either")


def _pack(events: list[str]) -> bytes:
    return "\n".join(events).encode()


def test_a_write_crosses_as_its_function_name_and_plain_arguments() -> None:
    resource = Serialized('{"id":"resp_1","status":"completed"}', "completed")
    rows = [{"response_id": "resp_1", "position": 0, "item": {"type": "message", "content": []}}]
    work = functools.partial(_record, "tenant", resource, rows, functools.partial(_pack, ["{}", "{}"]), flush=False)
    sent = pickle.dumps(wire_form(work), pickle.HIGHEST_PROTOCOL)
    # no reducer ran: neither the partials nor the Serialized document were pickled as objects
    assert b"functools" not in sent and b"Serialized" not in sent and b"_pack" in sent
    back = from_wire(pickle.loads(sent))
    assert isinstance(back, functools.partial) and back.func is _record and back.keywords == {"flush": False}
    tenant, document, items, packer = back.args
    assert tenant == "tenant" and items == rows
    assert type(document) is Serialized and document == resource and document.status == "completed"
    assert isinstance(packer, functools.partial) and packer.func is _pack and packer() == b"{}\n{}"


def test_what_is_not_a_partial_of_a_module_function_crosses_as_pickle_sends_it() -> None:
    assert wire_form(_pid) is _pid
    local = functools.partial(lambda connection: None)
    assert wire_form(local) is local  # pickle says it cannot be sent, as before
    bound = functools.partial(Serialized, "{}")
    assert wire_form(bound) is bound
    shadowed = functools.partial(_first_of_the_name)  # its name finds another function now
    assert wire_form(shadowed) is shadowed
    packer_of_a_local = functools.partial(_sleep, functools.partial(lambda: 1))
    form = wire_form(packer_of_a_local)
    assert form[1][0] is packer_of_a_local.args[0]  # an argument that cannot cross as a name stays as it is
