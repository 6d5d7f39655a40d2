"""The zoo's scorecard: staged cause | what the report says | right or not, as a Markdown table.

    .venv/bin/python bench/gpu/zoo/table.py [investigations/zoo]

Right means what tests/zoo/test_zoo.py asserts: the top HIGH/MEDIUM chain names the staged cause, its
culprit and its window (within 1 s); a control gets no HIGH/MEDIUM chain.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ingero_mcp.analysis.report import build_report
from ingero_mcp.store import open_store

CAUSES = {
    "cpu_contention": "cpu-contention", "own_workers_cpu": "own-workers-cpu", "gpu_shared": "gpu-shared",
    "gil_contention": "gil-or-lock", "lock_contention": "gil-or-lock", "pageable_copies": "pageable-copies",
    "allocator_churn": "allocator-churn", "host_bound_prep": "host-bound", "lazy_module_loading": "cold-start",
    "disk_io": "io-wait", "page_faults": "page-faults",
}


def row(db: Path) -> str:
    """One scenario's line of the table."""
    truth = json.loads(db.with_name(db.stem + ".truth.json").read_text())
    con = open_store(db)
    try:
        report = build_report(con)
    finally:
        con.close()
    top = [c for c in report.chains if c.origin == "ingero-mcp" and c.severity in ("HIGH", "MEDIUM")]
    said = f"{top[0].severity} `{top[0].root_cause}`: {top[0].summary}" if top else "nothing HIGH or MEDIUM"
    if truth["cause"] == "none":
        right = "yes" if not top else "no"
    else:
        want = CAUSES.get(truth["cause"])
        ok = bool(top) and top[0].root_cause == want
        if ok and truth.get("window_ns") and top[0].window:
            s, e = truth["window_ns"]
            ok = abs(top[0].window.start_ns - s) <= 1e9 and abs(top[0].window.end_ns - e) <= 1e9
        right = "yes" if ok else "no"
    said = said.replace("|", "/")
    return f"| `{db.stem}` | {truth['description']} (`{truth['cause']}`) | {said} | {right} |"


def main() -> None:
    zoo = Path(sys.argv[1] if len(sys.argv) > 1 else "investigations/zoo")
    print("| scenario | staged cause | what the report says (top HIGH/MEDIUM chain) | right |")
    print("|---|---|---|---|")
    for db in sorted(zoo.glob("*.duckdb")):
        print(row(db))


if __name__ == "__main__":
    main()
