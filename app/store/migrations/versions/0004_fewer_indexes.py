"""Two indexes no query needs are dropped: each stored response wrote a page of each.

* ``ix_responses_tenant_id`` (``tenant``, ``id``): every read of a response names its
  id, which the primary key finds; the tenant is then a condition on the one row.
* ``ix_items_item_id``: the one query on an item's id (``after``, the cursor of
  ``GET /v1/responses/{id}/input_items``) also names the response and its role, whose
  rows the primary key (``response_id``, ``role``, ``position``) holds together.

On SQLite every index a write touches is one more page in the write-ahead log at each
commit: a response recorded whole wrote about 10 pages, and writes about 7 without
these two (see ARCHITECTURE.md, "SQLite's writer"). PostgreSQL has one B-tree page
fewer to change per index, too.

Downgrading creates them again.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index(op.f("ix_items_item_id"), table_name="items")
    op.drop_index(op.f("ix_responses_tenant_id"), table_name="responses")


def downgrade() -> None:
    op.create_index(op.f("ix_responses_tenant_id"), "responses", ["tenant", "id"])
    op.create_index(op.f("ix_items_item_id"), "items", ["item_id"])
