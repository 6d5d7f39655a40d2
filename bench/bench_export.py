"""Time `ingero-mcp export` (Perfetto) as a process: wall time, peak RSS, output size and bytes per event.

    .venv/bin/python bench/bench_export.py                          # demo stores of 1M and 10M events (slow)
    .venv/bin/python bench/bench_export.py --sizes 1000000          # one size
    .venv/bin/python bench/bench_export.py --db /tmp/10m-base.duckdb --base /tmp/base/src --pairs 3

Events are the store's cuda_calls + sched_intervals rows (the demo's dataloader scaled up, as bench_store.py,
unless --db names a store). CPU seconds are printed beside the wall time: on a loaded machine they move less.
`--base SRC`: also run the export from another checkout's sources (e.g. main's),
interleaved with this one's (base, ours, base, ours, ...: the shared machine's load moves between runs), and
print both; the load average is printed with every timing. Targets (issue 20): 10M events <= 6 s and
<= 40 B/event, memory bounded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from ingero_mcp.demo import generate

DATALOADER_EVENTS_PER_SCALE = 127_486  # as bench_store.py
SRC = Path(__file__).resolve().parents[1] / "src"


def events_of(db: Path) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return int(con.sql("SELECT (SELECT count(*) FROM cuda_calls) + (SELECT count(*) FROM sched_intervals)")
                   .fetchall()[0][0])


def run_once(src: Path, db: Path, out: Path) -> tuple[float, float, float]:
    """One export as a child process: (wall seconds, CPU seconds (user + system, all threads), peak RSS in MB)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "ingero_mcp.cli", "export", "--db", str(db), "-o", str(out)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # stderr not a tty: no bar
    _, status, usage = os.wait4(child.pid, 0)
    took = time.perf_counter() - t0
    if status:
        raise SystemExit(f"export from {src} failed: {child.stderr.read().decode()[-2000:]}")
    return took, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure(label: str, src: Path, db: Path, out: Path, events: int) -> None:
    took, cpu, rss = run_once(src, db, out)
    size = out.stat().st_size
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{label:<5} {events:>12,} events  {took:6.1f} s  {cpu:6.1f} s CPU  {rss:7.0f} MB RSS  {size / 1e6:7.1f} MB  "
          f"{size / events:5.1f} B/event   load {load}", flush=True)
    out.unlink()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", type=Path, help="an existing store (read only) instead of demo stores")
    parser.add_argument("--sizes", default="1000000,10000000", help="demo store sizes in events (without --db)")
    parser.add_argument("--base", type=Path, help="another checkout's src/ to compare with, run interleaved")
    parser.add_argument("--pairs", type=int, default=1, help="runs of each")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.db:  # issue 9's other target, kept: the H200 trace's HTML report under 5 MB
            html = Path(tmp) / "h200.html"
            subprocess.run([sys.executable, "-m", "ingero_mcp.cli", "report", "--db",
                            str(SRC.parent / "investigations" / "h200-seed-benchmark.duckdb"), "-o", str(html)],
                           check=True, capture_output=True)
            print(f"H200 report: {html.stat().st_size / 1e6:.2f} MB (target < 5 MB)")
        stores = [args.db] if args.db else []
        for n in ([] if args.db else [int(s) for s in args.sizes.split(",")]):
            db = Path(tmp) / f"d{n}.duckdb"
            generate("dataloader", db, scale=n / DATALOADER_EVENTS_PER_SCALE)
            stores.append(db)
        for db in stores:
            events = events_of(db)
            out = Path(tmp) / "run.pftrace"
            for _ in range(args.pairs):
                if args.base:
                    measure("base", args.base, db, out, events)
                measure("ours", SRC, db, out, events)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
