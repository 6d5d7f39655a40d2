"""pytest applies this file to every room of tests/: it brings in the fixtures they share (tests/fixtures/)."""

from __future__ import annotations

import os

import pytest

from ingero_traces import ingero_dataloader, ingero_dir  # noqa: F401  (fixtures: pytest finds them here)


@pytest.fixture(autouse=True, scope="session")
def _finished_copies_apart(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Finished copies of large unfinished stores (analysis/finished.py) go to the session's own folder, never to the
    user's cache (tests/analysis/test_finished.py points each test at its own)."""
    os.environ["INGERO_MCP_CACHE"] = str(tmp_path_factory.mktemp("finished-copies"))
