"""Deleted responses keep no content: their JSON and instructions are cleared.

A deleted response's row stays, as a hidden tombstone (``previous_response_id`` always
points at a row), but earlier versions left in it the whole response as it was:
``resource`` (its output text, metadata, everything the client was sent) and
``instructions``. Deleting now clears both (``app.store.deletion.tombstone``); this
migration clears them in the tombstones earlier versions left, with the same JSON text
the server writes, ``{"id":"<id>","object":"response","deleted":true}``. The items and
tools a visible response's chain still needs were kept, and stay.

No schema change. Downgrading restores nothing (the content is gone, as was asked).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

responses = sa.table(
    "responses",
    sa.column("id", sa.Text()),
    sa.column("resource", sa.Text()),
    sa.column("instructions", sa.Text()),
    sa.column("deleted_at", sa.BigInteger()),
)


def upgrade() -> None:
    # ids are the server's own (letters, digits, underscores): nothing to escape in JSON
    tombstone = sa.literal('{"id":"') + responses.c.id + sa.literal('","object":"response","deleted":true}')
    op.get_bind().execute(
        sa.update(responses)
        .where(responses.c.deleted_at.is_not(None))
        .values(resource=tombstone, instructions=None)
    )


def downgrade() -> None:
    pass
