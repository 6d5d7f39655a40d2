"""`explain` runs without error on every trace store the repository ships: the investigations (v1 and v5), each zoo
store, and each of Ingero's traces once imported (issue 18: never crash on data)."""

from __future__ import annotations

import lzma
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

from ingero_mcp.analysis.report import build_report
from ingero_mcp.store import open_store

STORES = sorted((REPO / "investigations").glob("*.duckdb")) + sorted((REPO / "investigations").glob("zoo*/*.duckdb.xz"))
INGERO = sorted((REPO / "tests" / "data" / "ingero").glob("*.db"))


@pytest.mark.parametrize("path", STORES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_store_explains(path: Path, tmp_path: Path) -> None:
    if path.suffix == ".xz":
        plain = tmp_path / path.name.removesuffix(".xz")
        with lzma.open(path) as src, plain.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        path = plain
    con = open_store(path)
    try:
        report = build_report(con)
    finally:
        con.close()
    assert report.verdict and report.accounting is not None and report.accounting.complete
    assert all(q.count > 0 for q in report.info.data_quality)


@pytest.mark.parametrize("path", INGERO, ids=lambda p: p.name)
def test_every_ingero_trace_explains_once_imported(path: Path, tmp_path: Path) -> None:
    src = tmp_path / path.name
    shutil.copyfile(path, src)
    db = tmp_path / "imported.duckdb"
    cli = [sys.executable, "-m", "ingero_mcp.cli"]
    assert subprocess.run([*cli, "import", str(src), "--db", str(db)], capture_output=True, timeout=300).returncode == 0
    out = subprocess.run([*cli, "explain", "--db", str(db)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "Traceback" not in out.stderr and "Verdict" in out.stdout, out.stderr[-2000:]
