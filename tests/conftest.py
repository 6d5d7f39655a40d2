"""Shared fixtures: paths to the reference data and the repository."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INGERO_DIR = REPO / "tests" / "data" / "ingero"


@pytest.fixture(scope="session")
def ingero_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ingero's published SQLite traces (shipped in tests/data/ingero), copied once per run.

    A copy, because opening a WAL-mode SQLite file creates -shm/-wal files beside it: the
    repository's copies stay as shipped, and no test can change them."""
    assert (INGERO_DIR / "pytorch-dataloader-starvation.db").is_file(), f"reference traces missing: {INGERO_DIR}"
    copy = tmp_path_factory.mktemp("ingero-data") / "ingero"
    shutil.copytree(INGERO_DIR, copy)
    return copy


@pytest.fixture(scope="session")
def ingero_dataloader(ingero_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ingero's published DataLoader trace imported into a store, once per run (tests only read it)."""
    from ingero_mcp.importers.ingero import import_ingero

    out = tmp_path_factory.mktemp("ingero") / "dataloader.duckdb"
    import_ingero(ingero_dir / "pytorch-dataloader-starvation.db", out)
    return out
