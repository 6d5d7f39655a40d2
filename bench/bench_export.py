"""Time `ingero-mcp export` (Perfetto) at 1M and 10M events, and size the H200 trace's HTML report.

    .venv/bin/python bench/bench_export.py            # 1M and 10M (about 2 minutes: making the traces)
    .venv/bin/python bench/bench_export.py 1000000    # one size

Events are cuda_calls + sched_intervals rows of the dataloader demo scaled up (as bench_store.py).
Targets (issue 9): export of 10M events under 30 s; the H200 report under 5 MB.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ingero_mcp.demo import generate

DATALOADER_EVENTS_PER_SCALE = 127_486  # as bench_store.py
REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "ingero_mcp.cli"]


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [1_000_000, 10_000_000]
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "h200.html"
        subprocess.run([*CLI, "report", "--db", str(REPO / "investigations" / "h200-seed-benchmark.duckdb"),
                        "-o", str(html)], check=True, capture_output=True)
        print(f"H200 report: {html.stat().st_size / 1e6:.2f} MB (target < 5 MB)")
        for n in sizes:
            db, out = Path(tmp) / f"d{n}.duckdb", Path(tmp) / f"d{n}.pftrace"
            generate("dataloader", db, scale=n / DATALOADER_EVENTS_PER_SCALE)
            t0 = time.perf_counter()
            subprocess.run([*CLI, "export", "--db", str(db), "-o", str(out)], check=True, capture_output=True)
            took = time.perf_counter() - t0
            print(f"export {n:,} events: {took:.1f} s, {out.stat().st_size / 1e6:.0f} MB (target 10M < 30 s)")
            db.unlink()
            out.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
