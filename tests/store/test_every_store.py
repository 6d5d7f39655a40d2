"""`explain` runs without error on every trace store the repository ships: the investigations (v1 and v5), each zoo
store, and each of Ingero's traces once imported (issue 18: never crash on data). On every recorded store, each number
a chain shows with its SQL is what that SQL gives: the analysis's own tests hold it on made-up scenarios, the recorded
stores reach paths those never do (two kinds of evidence disagreed with their SQL on 10 of them only: a stretch's rate
shown beside per-second rows, a share shown in the fourth column of its query)."""

from __future__ import annotations

import lzma
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from analysis_fixtures import check_evidence_sql
from paths import REPO

from ingero_mcp.analysis.report import build_report
from ingero_mcp.store import open_store
from ingero_mcp.store.views import lay_views

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
    for c in (c for c in report.chains if c.origin == "ingero-mcp"):
        # a finding of one thread's time never explains more than its window holds; first launches summed over
        # several threads (cold-start), their window times as many
        threads = next((int(e.value) for e in c.evidence if e.name == "threads whose first launches these are"), 1)
        if c.window and c.seconds_lost is not None:
            assert c.seconds_lost <= threads * c.window.duration_ns / 1e9 + 0.01, (c.summary, c.seconds_lost)
        for e in (e for e in c.evidence if e.name == "feeding time explained (s)"):  # a story's too: its sum
            assert abs(float(e.value) - (c.seconds_lost or 0)) <= 0.01, (c.summary, e.value, c.seconds_lost)
        for who in c.culprits if c.window else ():  # each of a culprit's threads within the window (a cgroup: one)
            assert who.ns <= max(1, len(who.tids)) * c.window.duration_ns * 1.01 + 1e7, (c.summary, who)
        for text in (c.summary, c.explanation, *c.recommendations):  # a share over 100% is several threads' sum
            for m in re.finditer(r"(\d+(?:\.\d+)?)%( of that time together)?", text):
                assert float(m[1]) <= 100 or m[2], text
            for m in re.finditer(r"grew from (\d+(?:\.\d+)?)% to (\d+(?:\.\d+)?)%", text):  # a share said to grow
                assert float(m[2]) > float(m[1]), text
    fresh = open_store(path)  # read-only, as `ingero-mcp query` and the MCP server's run_sql open it
    try:
        lay_views(fresh)
        own = [c for c in report.chains if c.origin == "ingero-mcp"]
        assert check_evidence_sql(fresh, own) == sum(1 for c in own for e in c.evidence if e.sql)
    finally:
        fresh.close()


@pytest.mark.parametrize("path", INGERO, ids=lambda p: p.name)
def test_every_ingero_trace_explains_once_imported(path: Path, tmp_path: Path) -> None:
    src = tmp_path / path.name
    shutil.copyfile(path, src)
    db = tmp_path / "imported.duckdb"
    cli = [sys.executable, "-m", "ingero_mcp.cli"]
    assert subprocess.run([*cli, "import", str(src), "--db", str(db)], capture_output=True, timeout=300).returncode == 0
    out = subprocess.run([*cli, "explain", "--db", str(db)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "Traceback" not in out.stderr and "Verdict" in out.stdout, out.stderr[-2000:]
