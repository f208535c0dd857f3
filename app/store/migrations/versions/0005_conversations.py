"""Conversations (OpenAI's Conversations API) and their items.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=False),
        sa.Column("next_position", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("busy_response", sa.Text(), nullable=True),
        sa.Column("busy_since", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_conversations")),
    )
    op.create_table(
        "conversation_items",
        sa.Column("conversation_id", sa.Text(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.Text(), nullable=False),
        sa.Column("item", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "position", name=op.f("pk_conversation_items")),
        sa.ForeignKeyConstraint(
            ["conversation_id"], ["conversations.id"],
            name=op.f("fk_conversation_items_conversation_id_conversations"), ondelete="CASCADE",
        ),
    )
    op.create_index(op.f("ix_conversation_items_conversation_id_item_id"), "conversation_items",
                    ["conversation_id", "item_id"], unique=True)


def downgrade() -> None:
    op.drop_index(op.f("ix_conversation_items_conversation_id_item_id"), table_name="conversation_items")
    op.drop_table("conversation_items")
    op.drop_table("conversations")
