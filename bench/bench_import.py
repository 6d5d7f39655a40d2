"""Ingero import throughput: rows/s from an Ingero SQLite file into a trace store.

Ingero's published files are small (the DataLoader trace has 3,807 event rows), so this builds a
large one from the DataLoader trace: its event rows copied onto themselves (timestamps shifted by
1 ns each round) until there are --events, everything else as published. Then it imports it and prints
wall time, rows/s and the machine's load average (the development machine is shared).

    .venv/bin/python bench/bench_import.py                    # ~2M event rows
    .venv/bin/python bench/bench_import.py --events 8000000
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests" / "data" / "ingero" / "pytorch-dataloader-starvation.db"  # Ingero's, shipped for the tests
EVENT_COLS = "timestamp, pid, tid, source, op, duration, gpu_id, arg0, arg1, ret_code, stack_hash, stack_ips, cgroup_id"


def build(dst: Path, events: int) -> int:
    """Copy the DataLoader trace to `dst` and grow its event rows to `events` (the shipped file is only read:
    copied as bytes, since opening a WAL-mode file would leave -shm/-wal beside it in the repository)."""
    dst.write_bytes(SOURCE.read_bytes())
    with sqlite3.connect(dst) as lite:
        rows = lite.execute("SELECT count(*) FROM events").fetchone()[0]
        rest = EVENT_COLS.split(", ", 1)[1]
        while rows < events:
            add = min(rows, events - rows)
            lite.execute(f"INSERT INTO events ({EVENT_COLS}) SELECT timestamp + 1, {rest} FROM events LIMIT {add}")
            rows += add
        lite.commit()
    return rows


def main() -> int:
    """Build, import, report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2_000_000, help="event rows in the built file (default 2M)")
    args = parser.parse_args()
    from ingero_mcp.importers import import_ingero

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "big.db"
        t0 = time.perf_counter()
        rows = build(src, args.events)
        print(f"built {src.name}: {rows:,} event rows, {src.stat().st_size / 1e6:,.0f} MB in "
              f"{time.perf_counter() - t0:.1f} s")
        summary = import_ingero(src, Path(tmp) / "big.duckdb")
        total = summary.total_rows_read
        print(
            f"import: {total:,} rows read in {summary.seconds:.2f} s = {total / summary.seconds:,.0f} rows/s "
            f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs)"
        )
        written = ", ".join(f"{t} {n:,}" for t, n in sorted(summary.rows_written.items()))
        print(f"written: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
