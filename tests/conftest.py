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


@pytest.fixture(scope="session")
def ingero_dataloader(ingero_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ingero's published DataLoader trace imported into a store, once per run (tests only read it)."""
    from ingero_mcp.importers.ingero import import_ingero

    out = tmp_path_factory.mktemp("ingero") / "dataloader.duckdb"
    import_ingero(ingero_dir / "pytorch-dataloader-starvation.db", out)
    return out
