"""Alembic migrations of the store, applied by :func:`app.store.migrate.upgrade`."""
