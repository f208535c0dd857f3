"""Alembic environment of the store.

The store runs migrations itself (:func:`app.store.migrate.upgrade`) on a connection it
passes in ``config.attributes["connection"]``, inside its own transaction. Run from the
``alembic`` command line instead, the database comes from ``sqlalchemy.url``.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from app.store.engines import create_engine, normalize_url
from app.store.schema import metadata


def run_on(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


async def run_on_url(url: str) -> None:
    engine = create_engine(normalize_url(url), pool_size=1)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(run_on)
    finally:
        await engine.dispose()


def main() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=metadata, literal_binds=True, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
    elif url:
        asyncio.run(run_on_url(url))
    else:
        raise RuntimeError("No connection and no sqlalchemy.url to migrate.")


main()
