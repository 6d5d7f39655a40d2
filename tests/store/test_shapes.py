"""schemas/shapes.json (each schema version's columns, precomputed for the checks at open) is today's DDL applied,
and a file made from other DDL or by another DuckDB is not trusted."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from ingero_mcp.store import SCHEMA_VERSION, StoreError, open_store, shapes
from ingero_mcp.store.schema import _schema_dir


def test_the_shipped_shapes_are_the_ddl_applied() -> None:
    """Edit a schemas/vN.sql and this fails until `python -m ingero_mcp.store.shapes` is run again."""
    data = json.loads((_schema_dir() / shapes.SHAPES_FILE).read_text())
    assert data["key"]["ddl_sha256"] == shapes.shape_key()["ddl_sha256"], "schemas/ changed: remake shapes.json"
    assert data["key"]["schema_version"] == str(SCHEMA_VERSION)
    for v in range(1, SCHEMA_VERSION + 1):
        applied = shapes.applied_shape(v)
        assert {t: dict(cols) for t, cols in data["versions"][str(v)].items()} == applied
        assert shapes.expected_columns(v) == applied
    if data["key"]["duckdb"] == duckdb.__version__:
        assert shapes._made() is not None  # the open path reads the file, not the DDL


@pytest.mark.parametrize("field", ["ddl_sha256", "duckdb", "schema_version"])
def test_a_file_with_another_key_is_not_read(tmp_path: Path, field: str) -> None:
    shapes.write(tmp_path)
    assert shapes._made(tmp_path) is not None
    path = tmp_path / shapes.SHAPES_FILE
    data = json.loads(path.read_text())
    data["key"][field] = "other"
    path.write_text(json.dumps(data))
    assert shapes._made(tmp_path) is None
    path.write_text("{not json")
    assert shapes._made(tmp_path) is None


def test_an_empty_schema_version_table_is_not_a_store(tmp_path: Path) -> None:
    db = tmp_path / "empty-version.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE schema_version (version INTEGER, applied_ns BIGINT)").fetchall()
    con.close()
    with pytest.raises(StoreError, match="not an ingero-mcp trace store"):
        open_store(db)
