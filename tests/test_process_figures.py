"""Per-process figures that do not mislead (issue 8, items 5, 7, 8), on the committed H200 store and
Ingero's published traces: the collector labelled and ranked last, the worst stall's thread named
with its role, unknown shown as unknown (None), never 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingero_mcp.analysis.processes import per_process_breakdown
from ingero_mcp.store import open_store

H200 = Path(__file__).resolve().parents[1] / "investigations" / "h200-seed-benchmark.duckdb"


@pytest.fixture(scope="module")
def h200() -> dict:
    con = open_store(H200)
    try:
        procs = per_process_breakdown(con)
        facts = {
            "collector": con.sql("SELECT pid FROM processes WHERE cmdline LIKE '%ingero_mcp.cli trace%'").fetchall()[0][0],
            "worst": con.sql("SELECT tid, off_cpu_ns FROM sched_intervals WHERE pid = 1534 "
                             "ORDER BY off_cpu_ns DESC LIMIT 1").fetchall()[0],
            "cuda_tids": {r[0] for r in con.sql("SELECT DISTINCT tid FROM cuda_calls WHERE pid = 1534").fetchall()},
        }
    finally:
        con.close()
    return {"procs": procs, **facts}


def test_the_collector_is_labelled_and_ranked_last(h200: dict) -> None:
    procs = h200["procs"]
    by_pid = {p.pid: p for p in procs}
    collector = by_pid[h200["collector"]]
    assert collector.is_collector
    assert not any(p.is_collector for p in procs if p.pid != collector.pid)
    assert procs[-1].pid == collector.pid  # most context switches (rows), yet not at the top of the ranking
    top_switcher = max((p for p in procs if p.counts_from == "rows"), key=lambda p: p.context_switches)
    assert top_switcher.pid == collector.pid


def test_the_worst_stall_names_its_thread_and_role(h200: dict) -> None:
    main = {p.pid: p for p in h200["procs"]}[1534]
    tid, off = h200["worst"]
    assert main.worst_stall_ns == off and off > 40e9
    assert main.worst_stall_tid == tid == 1555 and tid not in h200["cuda_tids"]
    assert main.worst_stall_role is not None and main.worst_stall_role.startswith("helper thread")


def test_unknown_is_not_zero(h200: dict) -> None:
    rcu = {p.pid: p for p in h200["procs"]}[15]  # known only from the sched_switch aggregates
    assert rcu.counts_from == "aggregates" and rcu.context_switches == 2376
    assert rcu.off_cpu_ns is None  # the collector's aggregates hold on-CPU time (here not recorded): off-CPU unknown
    assert rcu.worst_stall_ns is None
    assert rcu.page_allocs is None and rcu.page_alloc_bytes is None  # no mm_page_alloc aggregate for it
