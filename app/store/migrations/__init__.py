"""Alembic migrations of the store, applied by :func:`app.store.migrate.upgrade` at open.

To change the schema: edit :mod:`app.store.schema`, then add the next revision in
``versions/`` (``revision = "0002"``, ``down_revision = "0001"``), written out with
``op.*`` calls rather than derived from the schema module. No ``alembic.ini`` is needed;
a skeleton comes from::

    python -c "from alembic import command; from app.store.migrate import alembic_config; \\
               command.revision(alembic_config(), 'what changes', rev_id='0002')"

``tests/store/test_migrations.py`` fails until the migrated database matches the schema
module again.
"""
