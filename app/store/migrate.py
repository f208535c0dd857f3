"""Bringing a database to the current schema with alembic, from code.

No ``alembic.ini`` is needed: the configuration is built here and points at the
``migrations`` package next to this module. The upgrade runs in one transaction (DDL is
transactional on both engines), so a failed upgrade leaves the database as it was. On
PostgreSQL a transaction-scoped advisory lock serializes replicas that start together:
the first migrates, the others then find the database at head and do nothing.

Some revisions need to know more than the schema: ``positional_tenants`` (revision
0002, tenants by identity) maps the tenants that earlier versions derived from a key's
position, ``key-<i>``, to that key's tenant now. The server passes it from its configured
keys; it reaches the revisions as ``config.attributes["positional_tenants"]``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.engines import writer

MIGRATIONS = Path(__file__).with_name("migrations")


def advisory_key(name: str) -> int:
    """A signed 64-bit PostgreSQL advisory lock key for ``name``."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big", signed=True)


MIGRATION_LOCK = advisory_key("ors:store:migrations")


def alembic_config(
    connection: Connection | None = None, positional_tenants: Mapping[str, str] | None = None
) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    config.attributes["connection"] = connection
    config.attributes["positional_tenants"] = None if positional_tenants is None else dict(positional_tenants)
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def upgrade(engine: AsyncEngine, positional_tenants: Mapping[str, str] | None = None,
                  target: str = "head") -> None:
    """Migrate to ``target`` (head), in one transaction; a no-op when already there."""
    async with writer(engine).begin() as connection:
        if engine.dialect.name == "postgresql":
            await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        await connection.run_sync(_upgrade, positional_tenants, target)


def _upgrade(connection: Connection, positional_tenants: Mapping[str, str] | None, target: str) -> None:
    wanted = head_revision() if target == "head" else target
    if current_revision(connection) == wanted:
        return
    command.upgrade(alembic_config(connection, positional_tenants), target)
