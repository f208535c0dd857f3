"""``app.main.settle_heap``: what ``ors serve`` does to the collector once it serves."""

from __future__ import annotations

import gc

from app.main import GC_THRESHOLDS, settle_heap


def test_settle_heap_freezes_start_up_and_makes_collections_rarer() -> None:
    before = gc.get_threshold()
    try:
        settle_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == GC_THRESHOLDS
        assert GC_THRESHOLDS[0] > before[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
