"""Does a change keep every report the same? `explain --json` on every store the repository holds or makes.

Refactors (issue 22) must not change what any report says. Run once before the change with `--save DIR`, once after
with `--check DIR`: it prints each store whose report differs, with the first differing lines, and exits 1 if any.

The stores: investigations/*.duckdb, every zoo store (investigations/zoo*/*.duckdb.xz, decompressed to a temporary
folder), each of Ingero's traces in tests/data/ingero imported, and each demo scenario generated at scale 0.25.

    .venv/bin/python bench/same_reports.py --save /tmp/reports-before
    .venv/bin/python bench/same_reports.py --check /tmp/reports-before
    .venv/bin/python bench/same_reports.py --check /tmp/reports-before --finished-copies

--finished-copies reads every store that lacks its derived rows through its finished copy (analysis/finished.py,
made in a temporary cache folder whatever the store's size): its report must be the store's own.
"""

from __future__ import annotations

import argparse
import difflib
import json
import lzma
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def stores(scratch: Path) -> Iterator[tuple[str, Path]]:
    """(name, path) of every store, made in `scratch` where it has to be."""
    for path in sorted((REPO / "investigations").glob("*.duckdb")):
        yield path.name, path
    for path in sorted((REPO / "investigations").glob("zoo*/*.duckdb.xz")):
        plain = scratch / path.name.removesuffix(".xz")
        with lzma.open(path) as src, plain.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        yield f"{path.parent.name}/{path.name}", plain
        plain.unlink()
    from ingero_mcp.importers.ingero import import_ingero

    for path in sorted((REPO / "tests" / "data" / "ingero").glob("*.db")):
        db = scratch / f"{path.stem}.duckdb"
        import_ingero(path, db)
        yield f"ingero/{path.name}", db
    from ingero_mcp.demo.scenarios import SCENARIOS, generate

    for name in SCENARIOS:
        db = scratch / f"demo-{name}.duckdb"
        generate(name, db, scale=0.25)
        yield f"demo/{name}", db


def report_json(path: Path, finished: bool = False) -> str:
    """What `explain --json` prints for the store, indented, keys sorted; finished: read through its finished copy."""
    from ingero_mcp.analysis.finished import open_finished
    from ingero_mcp.analysis.report import build_report
    from ingero_mcp.cli.explain import JSON_STRING_CAP
    from ingero_mcp.sanitize import clean_data
    from ingero_mcp.store import open_store

    con = open_finished(path) if finished else open_store(path)
    try:
        report = build_report(con)
    finally:
        con.close()
    data = clean_data(report.model_dump(mode="json"), cap=JSON_STRING_CAP, key_caps={"sql": 1_000_000})
    return json.dumps(_rounded(data), ensure_ascii=False, indent=1, sort_keys=True) + "\n"


def _rounded(value: Any) -> Any:
    """Floats to 12 significant digits: DuckDB's parallel sums add in any order, so the last bits vary run to run."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", type=Path, help="write each report into this folder")
    g.add_argument("--check", type=Path, help="compare each report with the one saved in this folder")
    p.add_argument("--finished-copies", action="store_true",
                   help="read each store lacking its derived rows through its finished copy (any size)")
    args = p.parse_args()
    folder: Path = args.save or args.check
    folder.mkdir(parents=True, exist_ok=True)
    differ = 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        if args.finished_copies:
            import os

            from ingero_mcp.analysis import finished

            finished.FINISH_FROM = 0
            os.environ[finished.CACHE_ENV] = str(Path(scratch) / "finished")
        for n, (name, path) in enumerate(stores(Path(scratch)), 1):
            got = report_json(path, args.finished_copies)
            file = folder / (name.replace("/", "__") + ".json")
            if args.save:
                file.write_text(got)
                continue
            if not file.exists():
                print(f"{name}: no saved report", flush=True)
                differ += 1
                continue
            want = file.read_text()
            if got != want:
                differ += 1
                lines = list(difflib.unified_diff(want.splitlines(), got.splitlines(), "before", "after", n=1))
                print(f"{name}: DIFFERS\n" + "\n".join(lines[:40]), flush=True)
        copies = len(list((Path(scratch) / "finished").glob("*.duckdb"))) if args.finished_copies else 0
    print(f"{n} stores, {differ} differ, {time.perf_counter() - t0:.0f} s"
          + (f"; {copies} read through a finished copy" if args.finished_copies else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
