"""The initial schema: responses, items, events.

Written out rather than taken from ``app.store.schema``, so that this revision keeps
creating what it created when the schema moves on; a test checks that migrating to head
yields exactly the tables of ``app.store.schema``.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("previous_response_id", sa.Text(), nullable=True),
        sa.Column("instructions", sa.Text(), nullable=True),
        sa.Column("tools", sa.Text(), nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("background", sa.Boolean(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("finished_at", sa.BigInteger(), nullable=True),
        sa.Column("deleted_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_responses")),
        sa.ForeignKeyConstraint(
            ["previous_response_id"],
            ["responses.id"],
            name=op.f("fk_responses_previous_response_id_responses"),
        ),
    )
    op.create_index(op.f("ix_responses_tenant_id"), "responses", ["tenant", "id"])
    op.create_index(op.f("ix_responses_previous_response_id"), "responses", ["previous_response_id"])
    op.create_index(
        op.f("ix_responses_unfinished_owner"),
        "responses",
        ["owner"],
        sqlite_where=sa.text("finished_at IS NULL"),
        postgresql_where=sa.text("finished_at IS NULL"),
    )
    op.create_table(
        "items",
        sa.Column("response_id", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.Text(), nullable=True),
        sa.Column("item", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("response_id", "role", "position", name=op.f("pk_items")),
        sa.CheckConstraint("role IN ('input', 'output')", name=op.f("ck_items_role")),
        sa.ForeignKeyConstraint(
            ["response_id"], ["responses.id"], name=op.f("fk_items_response_id_responses"), ondelete="CASCADE"
        ),
    )
    op.create_index(op.f("ix_items_item_id"), "items", ["item_id"])
    op.create_table(
        "events",
        sa.Column("response_id", sa.Text(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("response_id", name=op.f("pk_events")),
        sa.ForeignKeyConstraint(
            ["response_id"], ["responses.id"], name=op.f("fk_events_response_id_responses"), ondelete="CASCADE"
        ),
    )


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("items")
    op.drop_index(op.f("ix_responses_unfinished_owner"), table_name="responses")
    op.drop_index(op.f("ix_responses_previous_response_id"), table_name="responses")
    op.drop_index(op.f("ix_responses_tenant_id"), table_name="responses")
    op.drop_table("responses")
