"""Turns what the zoo's device run brought back into small committed trace stores.

For each scenario archive (inside the zoo-<k>.tar files, or a NAME.tar.xz given directly): extract
it, fold the collector's Parquet segments into a DuckDB store with the project's own store code
(`ingero_mcp.store.fold_segments`, the same fold the collector does on a host that has DuckDB),
then TRIM it to [start of the baseline/window - 2 s, their end + 3 s]: rows of every timestamped
table outside that span go; sessions, processes, threads, collector_stats and table_coverage stay
whole. DuckDB files do not shrink on DELETE, so the kept rows are copied into a fresh store at
OUT/NAME.duckdb (schema from the project's migrate), with OUT/NAME.truth.json beside it.

    .venv/bin/python bench/gpu/zoo/fold.py zoo-1.tar zoo-2.tar --out investigations/zoo
    .venv/bin/python bench/gpu/zoo/fold.py cpu_hog.tar.xz --out /tmp/zoo-folded --max-mb 20

A store over --max-mb (default 6) is not written. Run it with the checkout (and its schema) that
the collector that recorded the run belongs to.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "src"))

import duckdb  # noqa: E402

from ingero_mcp.analysis.derive import store_derived  # noqa: E402
from ingero_mcp.store import TABLES, fold_segments  # noqa: E402
from ingero_mcp.store.schema import insert_sql, migrate  # noqa: E402

MARGIN_BEFORE_NS = 2_000_000_000
MARGIN_AFTER_NS = 3_000_000_000
WHOLE = {"sessions", "processes", "threads", "collector_stats", "table_coverage"}


def time_filter(con: duckdb.DuckDBPyConnection, table: str) -> str | None:
    """The WHERE clause that keeps a table's rows that touch [$lo, $hi]; None: keep the table whole."""
    if table in WHOLE:
        return None
    cols = {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_catalog = 'src' AND table_name = ?",
        [table]).fetchall()}
    if "ts_ns" in cols and "duration_ns" in cols:
        return "ts_ns <= $hi AND ts_ns + coalesce(duration_ns, 0) >= $lo"
    if "ts_ns" in cols:
        return "ts_ns BETWEEN $lo AND $hi"
    if "off_ns" in cols:  # an interval: keep it if it overlaps
        return "off_ns <= $hi AND coalesce(on_ns, off_ns) >= $lo"
    if "bucket_start_ns" in cols:
        return "bucket_start_ns <= $hi AND bucket_start_ns + bucket_ns >= $lo"
    if "detected_ns" in cols:
        return "detected_ns IS NULL OR detected_ns BETWEEN $lo AND $hi"
    return None


def span_of(truth: dict) -> tuple[int, int]:
    spans = [s for s in (truth.get("baseline_ns"), truth.get("window_ns")) if s]
    return min(s[0] for s in spans) - MARGIN_BEFORE_NS, max(s[1] for s in spans) + MARGIN_AFTER_NS


def _q(path: Path) -> str:
    return str(path).replace("'", "''")


def trim_copy(folded: Path, target: Path, lo: int, hi: int, block_size: int = 0) -> dict[str, tuple[int, int]]:
    """Copy the rows of `folded` that touch [lo, hi] into a fresh store at `target`. Returns kept/all per table."""
    if block_size:  # a small block size makes a small store much smaller (DuckDB >= 1.2 reads it)
        con = duckdb.connect()
        con.execute(f"ATTACH '{_q(target)}' AS fresh (BLOCK_SIZE {int(block_size)})").fetchall()
        con.execute("USE fresh").fetchall()
    else:
        con = duckdb.connect(str(target))
    migrate(con)
    con.execute(f"ATTACH '{_q(folded)}' AS src (READ_ONLY)").fetchall()
    src_tables = {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = 'src'").fetchall()}
    counts: dict[str, tuple[int, int]] = {}
    for table in TABLES:
        if table not in src_tables:
            continue
        total = con.execute(f"SELECT count(*) FROM src.{table}").fetchall()[0][0]
        where = time_filter(con, table)
        given = [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE "
                                           "table_catalog = 'src' AND table_name = ?", [table]).fetchall()]
        if where:
            con.execute(insert_sql(con, table, f"(SELECT * FROM src.{table} WHERE {where}) AS kept", given),
                        {"lo": lo, "hi": hi}).fetchall()
        else:
            con.execute(insert_sql(con, table, f"src.{table}", given)).fetchall()
        kept = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
        counts[table] = (kept, total)
    note = f"trimmed by bench/gpu/zoo/fold.py to [{lo}, {hi}] ns (the staged run +-margins)"
    con.execute("UPDATE sessions SET notes = CASE WHEN notes IS NULL OR notes = '' THEN ? ELSE notes || '; ' || ? END",
                [note, note]).fetchall()
    con.execute("DETACH src").fetchall()
    con.execute("CHECKPOINT").fetchall()
    con.close()
    return counts


def scenario_archives(paths: list[Path], tmp: Path) -> list[Path]:
    """NAME.tar.xz files: given directly, or inside zoo-<k>.tar files."""
    found: list[Path] = []
    for k, path in enumerate(paths):
        if path.name.endswith(".tar.xz"):
            found.append(path)
            continue
        with tarfile.open(path) as tar:
            dest = tmp / "outer" / f"{k}-{path.stem}"  # both device calls write a zoo-1.tar
            tar.extractall(dest, filter="data")
        found.extend(sorted(dest.glob("*.tar.xz")))
    # A scenario too big for one file came in parts (pack.py), maybe spread over several zoo-<k>.tar.
    parts: dict[str, list[Path]] = {}
    for part in sorted((tmp / "outer").glob("*/*.tar.xz.part*")) if (tmp / "outer").is_dir() else []:
        parts.setdefault(part.name.split(".tar.xz.part")[0], []).append(part)
    for name, pieces in parts.items():
        joined = tmp / "joined" / f"{name}.tar.xz"
        joined.parent.mkdir(parents=True, exist_ok=True)
        with joined.open("wb") as fh:
            for piece in sorted(pieces, key=lambda p: p.name):
                fh.write(piece.read_bytes())
        print(f"{name}: joined {len(pieces)} parts")
        found.append(joined)
    return found


def fold_one(archive: Path, out: Path, tmp: Path, max_mb: float, block_size: int = 0) -> bool:
    name = archive.name.removesuffix(".tar.xz")
    work = tmp / "scen" / name
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    root = work / name
    truth_path = root / f"{name}.truth.json"
    if not truth_path.exists():
        print(f"{name}: no truth file in {archive} (the scenario failed?): skipped")
        return False
    truth = json.loads(truth_path.read_text())
    db = root / f"{name}.duckdb"
    segments = Path(f"{db}.segments")
    if segments.is_dir():
        rows = fold_segments(db, derive=store_derived)
        print(f"{name}: folded {rows:,} rows from the segments")
    if not db.exists():
        print(f"{name}: no store and no segments in {archive}: skipped")
        return False
    lo, hi = span_of(truth)
    fresh = tmp / f"{name}.trimmed.duckdb"
    fresh.unlink(missing_ok=True)
    counts = trim_copy(db, fresh, lo, hi, block_size)
    size_mb = fresh.stat().st_size / 1e6
    table = ", ".join(f"{t} {k:,}/{n:,}" for t, (k, n) in counts.items() if n)
    if size_mb > max_mb:
        print(f"{name}: {size_mb:.1f} MB over --max-mb {max_mb}: NOT written ({table})")
        return False
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{name}.duckdb"
    shutil.move(str(fresh), target)
    truth["trimmed_ns"] = [lo, hi]
    truth["rows_kept"] = {t: k for t, (k, _) in counts.items()}
    for log in ("collector.log", "scenario.log"):
        if (root / log).exists():
            truth.setdefault("logs", {})[log] = (root / log).read_text().splitlines()[-8:]
    (out / f"{name}.truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    print(f"{name}: {target} {size_mb:.2f} MB; rows kept/recorded: {table}")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archives", nargs="+", type=Path, help="zoo-<k>.tar files, or NAME.tar.xz scenario archives")
    parser.add_argument("--out", type=Path, default=REPO / "investigations" / "zoo")
    parser.add_argument("--max-mb", type=float, default=6.0, help="refuse a store larger than this (default 6)")
    parser.add_argument("--block-size", type=int, default=0,
                        help="DuckDB block size of the written stores, e.g. 16384: a much smaller file for a small "
                        "trace, readable by DuckDB >= 1.2 only (default: DuckDB's, 256 KiB)")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="zoo-fold-") as tmp_name:
        tmp = Path(tmp_name)
        for archive in scenario_archives(args.archives, tmp):
            try:
                ok &= fold_one(archive, args.out, tmp, args.max_mb, args.block_size)
            except Exception as exc:  # one bad archive must not stop the others
                print(f"{archive.name}: FAILED: {type(exc).__name__}: {exc}")
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
