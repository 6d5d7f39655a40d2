"""Each schema version's tables, columns and types, as DuckDB names them: what a store is checked against at open.

Applying the versioned DDL to an in-memory database gives the answer, but costs ~70 ms per process (a DuckDB
instance and six scripts) on every `explain` and `mcp` start. `schemas/shapes.json` holds that answer, made from
the DDL by `python -m ingero_mcp.store.shapes` and keyed by the DDL's hash and the DuckDB version that made it; a
key that does not match (a schema edited, another DuckDB) is not trusted: the DDL is applied as before.
"""

from __future__ import annotations

import hashlib
import json
import sys
from functools import cache
from pathlib import Path

from ingero_mcp.store.schema import SCHEMA_VERSION, _schema_dir, ddl

SHAPES_FILE = "shapes.json"

Shape = dict[str, dict[str, str]]  # table -> column -> type, in table-name then column order


def shape_key() -> dict[str, str]:
    """What the shapes are made from: the DDL of every version up to SCHEMA_VERSION, and this DuckDB."""
    import duckdb

    text = "\n".join(ddl(v) for v in range(1, SCHEMA_VERSION + 1))
    return {"ddl_sha256": hashlib.sha256(text.encode()).hexdigest(), "duckdb": duckdb.__version__,
            "schema_version": str(SCHEMA_VERSION)}


def applied_shape(version: int) -> Shape:
    """The tables of a store at schema `version`, from the versioned DDL applied in order to an in-memory database."""
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        for v in range(1, version + 1):
            con.execute(ddl(v)).fetchall()
        got: Shape = {}
        for table, column, dtype in con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main' AND table_catalog = current_database() "
            "ORDER BY table_name, ordinal_position"
        ).fetchall():
            got.setdefault(str(table), {})[str(column)] = str(dtype)
        return got
    finally:
        con.close()


def _made(folder: Path | None = None) -> dict[int, Shape] | None:
    """The shapes in `folder`/shapes.json (default: beside the DDL) when its key matches; else None."""
    path = (folder or _schema_dir()) / SHAPES_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != shape_key():
        return None
    return {int(v): {t: dict(cols) for t, cols in tables.items()} for v, tables in data["versions"].items()}


@cache
def _shapes() -> dict[int, Shape] | None:
    return _made()


@cache
def expected_columns(version: int) -> Shape:
    """table -> column -> type of a store at schema `version`: from shapes.json when it was made from this DDL
    by this DuckDB, else from the DDL applied (the same answer, ~70 ms later)."""
    made = _shapes()
    if made is not None and version in made:
        return made[version]
    return applied_shape(version)


def write(folder: Path | None = None) -> Path:
    """Make shapes.json from the DDL (every version) with this DuckDB; returns its path."""
    path = (folder or _schema_dir()) / SHAPES_FILE
    lines = ['{"key": ' + json.dumps(shape_key()) + ', "versions": {']
    for v in range(1, SCHEMA_VERSION + 1):  # one line a table: a schema change reads as a diff of a few lines
        tables = applied_shape(v)
        lines.append(f'"{v}": {{')
        lines += [f"{json.dumps(t)}: {json.dumps(list(cols.items()), separators=(',', ':'))}"
                  + ("," if i < len(tables) - 1 else "") for i, (t, cols) in enumerate(tables.items())]
        lines.append("}" + ("," if v < SCHEMA_VERSION else ""))
    path.write_text("\n".join([*lines, "}}"]) + "\n")
    return path


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
