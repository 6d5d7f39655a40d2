"""How long the report takes on every store recorded on a real GPU (investigations/*.duckdb and the zoo's stores).

The demo stores `issue20.py` times are made up: the recorded ones reach paths those never do (a thread woken 99k
times by another: natural_thread_pool_augment took 37.6 s). Each store is opened and reported in-process, one after
the other (the .xz ones decompressed first, not timed); prints the total and the slowest.

    .venv/bin/python bench/recorded_reports.py             # ~2 min here
    .venv/bin/python bench/recorded_reports.py --top 20
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import tempfile
import time
from pathlib import Path

from ingero_mcp.analysis.report import build_report
from ingero_mcp.store import open_store

INVESTIGATIONS = Path(__file__).resolve().parents[1] / "investigations"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=8, help="how many of the slowest to list (default 8)")
    args = ap.parse_args()
    paths = sorted([*INVESTIGATIONS.glob("*.duckdb"), *INVESTIGATIONS.glob("zoo*/*.duckdb.xz")])
    took: list[tuple[float, str]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for path in paths:
            store = path
            if path.suffix == ".xz":
                store = Path(scratch) / path.name.removesuffix(".xz")
                with lzma.open(path) as src, store.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
            started = time.perf_counter()
            con = open_store(store)
            try:
                build_report(con)
            finally:
                con.close()
            took.append((time.perf_counter() - started, path.relative_to(INVESTIGATIONS).as_posix()))
            if store != path:
                store.unlink()
    took.sort(reverse=True)
    print(f"{len(took)} stores, {sum(t for t, _ in took):.1f} s in all")
    for seconds, name in took[:args.top]:
        print(f"{seconds:7.2f} s  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
