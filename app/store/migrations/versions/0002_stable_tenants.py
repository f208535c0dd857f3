"""Tenants by identity: rows tenanted ``key-<i>`` move to the tenant of the key at index i.

Earlier versions named a tenant by the position of its key in ``ORS_API_KEYS``
(``key-0``, ``key-1``…). A tenant is now the key's name, or a digest of an unnamed key
(``app.transport.auth``). The server passes the mapping ``key-<i>`` → tenant, built from
its keys in their configured order, as ``config.attributes["positional_tenants"]``; the
order at the time of the upgrade is taken to be the order the rows were written with.

* With no keys configured (an empty mapping) nothing changes: the anonymous tenant's rows
  stay ``anonymous``.
* A ``key-<i>`` beyond the configured list (a key removed before the upgrade) is left as
  it is: no key can reach it, as before.
* Run without a mapping (the ``alembic`` command line, which does not know the keys),
  the upgrade refuses if any positional tenant exists: start the server to upgrade.

No schema change. Downgrading keeps the rows where they are (the positions cannot be
recovered from names); a server of the earlier version would not find them.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import context, op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

POSITIONAL = re.compile(r"key-(0|[1-9][0-9]{0,5})")

responses = sa.table("responses", sa.column("tenant", sa.Text()))


def upgrade() -> None:
    connection = op.get_bind()
    present = [
        tenant
        for tenant in connection.execute(sa.select(responses.c.tenant).distinct()).scalars()
        if POSITIONAL.fullmatch(tenant)
    ]
    if not present:
        return
    mapping: dict[str, str] | None = context.config.attributes.get("positional_tenants")
    if mapping is None:
        raise RuntimeError(
            "Stored responses belong to tenants named by key position (key-0, key-1…); start the "
            "server with its ORS_API_KEYS to upgrade the store, so each is given to its key's tenant."
        )
    for old in present:
        new = mapping.get(old)
        if new is None or new == old:
            continue
        if POSITIONAL.fullmatch(new):
            raise RuntimeError(f"tenant {new!r} looks positional; refusing an ambiguous rename")
        connection.execute(sa.update(responses).where(responses.c.tenant == old).values(tenant=new))


def downgrade() -> None:
    pass
