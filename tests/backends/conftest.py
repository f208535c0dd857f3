"""Fixtures for the embedded backend's tests (``anyio_backend`` comes from the root conftest)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.backends.local import LocalBackend
from app.backends.model_files import ModelFiles

SMOLLM2 = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-1.5b-instruct"


@pytest.fixture
async def smollm2(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    """A backend serving only SmolLM2, loaded; one per test because it belongs to one loop."""
    backend = LocalBackend(tmp_path, n_threads=2, models=[SMOLLM2], preload=[SMOLLM2])
    await backend.start()
    yield backend
    await backend.aclose()


@pytest.fixture(scope="session")
def qwen_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory holding the Qwen GGUF assembled from its installed parts (once per session)."""
    cache_dir = tmp_path_factory.mktemp("qwen-cache")
    ModelFiles(cache_dir).path(QWEN)
    return cache_dir
