"""The zoo rewritten as the v4 collector's defaults would have recorded it (tests/zoo_v4.py): one probe layer per
logical call and kernel launches entry-only ('eo'), and the same with the launch probes detached for the last 70 % of
each second ('gaps', duty 0.3). The report must still name each staged cause, its culprit and window, and stay quiet on
the controls (tests/test_zoo.py's checks), and never turn an unknown duration into 0.
"""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import pytest

from ingero_mcp.analysis.models import Report
from ingero_mcp.analysis.report import build_report
from ingero_mcp.store import open_store
from test_zoo import NAMES, ZOO, _truth, check_verdict
from zoo_v4 import convert

VARIANTS = {"eo": None, "gaps": 0.3}


@pytest.fixture(scope="module")
def v4_stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zoo_v4")
    for name in NAMES:
        raw = out / f"{name}.v2.duckdb"
        with lzma.open(ZOO / f"{name}.duckdb.xz") as src, raw.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        for variant, duty in VARIANTS.items():
            convert(raw, out / f"{name}.{variant}.duckdb", duty)
        raw.unlink()
    return out


def _report(stores: Path, name: str, variant: str) -> Report:
    con = open_store(stores / f"{name}.{variant}.duckdb")
    try:
        return build_report(con)
    finally:
        con.close()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("name", NAMES)
def test_the_v4_report_names_the_staged_cause(v4_stores: Path, name: str, variant: str) -> None:
    check_verdict(_report(v4_stores, name, variant), _truth(name))
