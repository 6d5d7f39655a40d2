"""Every number a report shows with its SQL is what that SQL gives, on every store recorded on a real GPU: the zoo's
stores (staged and natural) and investigations/*.duckdb. The analysis's own tests hold it on made-up scenarios; the
recorded stores reach paths those never do (two kinds of evidence disagreed with their SQL on 10 real stores only:
a stretch's rate shown beside per-second rows, a share shown in the fourth column of its query)."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import pytest
from analysis_fixtures import check_evidence_sql
from paths import REPO

from ingero_mcp.analysis.report import build_report
from ingero_mcp.store import open_store
from ingero_mcp.store.views import lay_views

INVESTIGATIONS = REPO / "investigations"
STORES = sorted(p.relative_to(INVESTIGATIONS).as_posix() for p in
                [*INVESTIGATIONS.glob("*.duckdb"), *INVESTIGATIONS.glob("zoo*/*.duckdb.xz")])


def test_the_recorded_stores_are_all_here() -> None:
    assert len(STORES) >= 160 and sum(s.startswith("zoo-natural/") for s in STORES) >= 40, len(STORES)


@pytest.mark.parametrize("name", STORES)
def test_every_evidence_sql_recomputes_its_value(name: str, tmp_path: Path) -> None:
    path = INVESTIGATIONS / name
    if name.endswith(".xz"):
        plain = tmp_path / path.name.removesuffix(".xz")
        with lzma.open(path) as src, plain.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        path = plain
    con = open_store(path)
    try:
        report = build_report(con)
    finally:
        con.close()
    fresh = open_store(path)  # read-only, as `ingero-mcp query` and the MCP server's run_sql open it
    try:
        lay_views(fresh)
        own = [c for c in report.chains if c.origin == "ingero-mcp"]
        assert check_evidence_sql(fresh, own) >= sum(1 for c in own for e in c.evidence if e.sql)
    finally:
        fresh.close()
