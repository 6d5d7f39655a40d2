"""Shared fixtures: paths to the reference data and the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INGERO_DIR = REPO.parent / "shared" / "ingero-investigations"


@pytest.fixture(scope="session")
def ingero_dir() -> Path:
    """Ingero's published SQLite traces (read in place, never copied into the project)."""
    assert INGERO_DIR.is_dir(), f"reference traces missing: {INGERO_DIR}"
    return INGERO_DIR
