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

# The likelihood reranker's prefix store (rerank.PrefixStore) and the synthesized requests' cache go to directories
# of this test session, not the user's ~/.cache; the commands the tests start inherit them.
for _var, _prefix in (("NEXUS_PREFIX_CACHE", "nexus-test-prefixes-"), ("NEXUS_REQUESTS_CACHE", "nexus-test-requests-"),
                      ("NEXUS_CARD_CACHE", "nexus-test-cards-")):
    if _var not in os.environ:
        import atexit
        import shutil
        import tempfile

        os.environ[_var] = tempfile.mkdtemp(prefix=_prefix)
        atexit.register(shutil.rmtree, os.environ[_var], True)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_registries() -> Path:
    if not SHARED_REGISTRIES.is_dir():
        pytest.fail(f"shared registries not found at {SHARED_REGISTRIES}")
    return SHARED_REGISTRIES

# llama.cpp's OpenMP workers spin while they wait; on a busy 2-core machine that spinning starves the thread doing
# the work (a decode ran 3x slower under load). Passive waiting costs nothing measurable when the machine is quiet.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
