"""Shared fixtures: paths to the repo, the shared registries, and the real models (fetched by `make models`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_REGISTRIES = (REPO.parent / "shared" / "registries").resolve()

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_registries() -> Path:
    if not SHARED_REGISTRIES.is_dir():
        pytest.fail(f"shared registries not found at {SHARED_REGISTRIES}")
    return SHARED_REGISTRIES
