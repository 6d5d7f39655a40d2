"""Small synthetic trace stores for the analysis tests, written through the real TraceWriter.

`contention_store` is a 10 s run of one training process (pid 100) with four DataLoader workers
(101-104) and an unrelated CPU hog (pid 200, "stress") that takes the CPUs in seconds 5-6:
cudaStreamSynchronize calls made then are slow because the main thread was preempted. The first
cudaLaunchKernel is a 30 ms cold start; everything else is steady.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import duckdb
import pytest

from ingero_mcp.analysis.models import CausalChain
from ingero_mcp.store import TraceWriter

T0 = 1_700_000_000_000_000_000
S = 1_000_000_000
MS = 1_000_000
US = 1_000
SLOW_SYNC_START = T0 + 5 * S  # the 30 slow syncs: one every 20 ms from here
SLOW_SYNCS = 30


def _calls() -> dict[str, list]:
    cols: dict[str, list] = {k: [] for k in (
        "ts_ns", "duration_ns", "pid", "tid", "api", "op", "bytes", "memcpy_kind", "off_cpu_ns", "cpu_wait_ns",
        "sleep_ns", "context_switches", "page_allocs", "page_alloc_bytes", "return_code",
    )}

    def add(ts: int, dur: int, op: str, *, api: str = "runtime", nbytes: int | None = None, kind: str | None = None,
            pre: int = 0, blk: int = 0, cs: int = 0, pages: int = 0) -> None:
        for key, value in (("ts_ns", ts), ("duration_ns", dur), ("pid", 100), ("tid", 100), ("api", api), ("op", op),
                           ("bytes", nbytes), ("memcpy_kind", kind), ("off_cpu_ns", pre + blk), ("cpu_wait_ns", pre),
                           ("sleep_ns", blk), ("context_switches", cs), ("page_allocs", pages),
                           ("page_alloc_bytes", pages * 4096), ("return_code", 0)):
            cols[key].append(value)

    for i in range(1000):  # cudaLaunchKernel: every 5 ms, 10 us; the first one is a 30 ms cold start
        add(T0 + 200 * MS + i * 5 * MS, 30 * MS if i == 0 else 10 * US + (i % 7) * US, "cudaLaunchKernel")
    slow = {SLOW_SYNC_START + k * 20 * MS for k in range(SLOW_SYNCS)}
    for i in range(900):  # cudaStreamSynchronize every 10 ms from t0+0.5 s, 200 us
        ts = T0 + 500 * MS + i * 10 * MS
        add(ts, 200 * US + (i % 5) * US, "cudaStreamSynchronize", blk=150 * US, cs=1)
    for ts in sorted(slow):
        add(ts + 3 * MS, 5 * MS, "cudaStreamSynchronize", pre=4 * MS, blk=200 * US, cs=4)
    for i in range(50):  # 64 MiB H2D copies at ~6.7 GB/s
        add(T0 + 300 * MS + i * 100 * MS, 10 * MS, "cudaMemcpyAsync", nbytes=64 << 20, kind="H2D", pages=2)
    for i in range(20):
        add(T0 + 250 * MS + i * MS, 120 * US + i * US, "cuMemAlloc", api="driver", nbytes=1 << 20)
    return cols


def contention_store(path: Path, *, sampled: bool = False, attribution: bool = True, hog_comm: str = "stress") -> Path:
    """Write the scenario described in the module docstring; `sampled` marks cuda_calls as a sample; `hog_comm`
    names the CPU hog (pid 200) wherever its name is recorded."""
    calls = _calls()
    if not attribution:
        for key in ("off_cpu_ns", "cpu_wait_ns", "sleep_ns", "context_switches", "page_allocs", "page_alloc_bytes"):
            calls[key] = [None] * len(calls[key])
    with TraceWriter(path) as w:
        w.replace("sessions", {"source": ["demo:test"], "host": ["testhost"], "cpu_count": [4],
                               "started_ns": [T0], "stopped_ns": [T0 + 10 * S]})
        w.replace("processes", {
            "pid": [100, 101, 102, 103, 104, 200], "ppid": [1, 100, 100, 100, 100, 1],
            "comm": ["python", "pt_data_worker", "pt_data_worker", "pt_data_worker", "pt_data_worker", hog_comm],
            "traced": [True, True, True, True, True, False], "first_seen_ns": [T0] * 6,
        })
        w.replace("table_coverage", {
            "table_name": ["cuda_calls", "sched_intervals", "host_aggregates"],
            "complete": [not sampled, True, True], "note": ["sample" if sampled else None, None, None],
        })
        w.append("process_events", {"ts_ns": [T0 + 100 * MS + k for k in range(4)], "event": ["fork"] * 4,
                                    "pid": [100] * 4, "child_pid": [101, 102, 103, 104], "comm": ["python"] * 4})
        if sampled:  # keep one call in ten of the steady ones, all the slow ones: counts live in aggregates
            keep = [i for i, d in enumerate(calls["duration_ns"]) if i % 10 == 0 or d >= MS]
            counted: dict[str, list[int]] = {}
            for op, d in zip(calls["op"], calls["duration_ns"]):
                counted.setdefault(op, [0, 0])
                counted[op][0] += 1
                counted[op][1] += d
            calls = {k: [v[i] for i in keep] for k, v in calls.items()}
            w.append("host_aggregates", {
                "bucket_start_ns": [T0] * len(counted), "bucket_ns": [10 * S] * len(counted), "pid": [100] * len(counted),
                "source": ["cuda"] * len(counted), "op": list(counted), "count": [c for c, _ in counted.values()],
                "stored": [0] * len(counted), "sum_duration_ns": [d for _, d in counted.values()],
            })
        w.append("cuda_calls", calls)
        # the main thread's scheduler intervals during the slow syncs: preempted by stress[200]
        w.append("sched_intervals", {
            "pid": [100] * SLOW_SYNCS, "tid": [100] * SLOW_SYNCS,
            "off_ns": [SLOW_SYNC_START + k * 20 * MS + 3 * MS + 500 * US for k in range(SLOW_SYNCS)],
            "on_ns": [SLOW_SYNC_START + k * 20 * MS + 7 * MS + 500 * US for k in range(SLOW_SYNCS)],
            "off_cpu_ns": [4 * MS] * SLOW_SYNCS, "prev_state": ["preempted"] * SLOW_SYNCS,
            "preemptor_pid": [200] * SLOW_SYNCS, "preemptor_comm": [hog_comm] * SLOW_SYNCS, "cpu": [1] * SLOW_SYNCS,
        })
        agg: dict[str, list] = {k: [] for k in ("bucket_start_ns", "bucket_ns", "pid", "comm", "source", "op", "count",
                                                "sum_duration_ns", "max_duration_ns", "sum_bytes")}

        def bucket(sec: int, pid: int, comm: str, source: str, op: str, n: int, dur: int | None, nbytes: int | None) -> None:
            for key, value in (("bucket_start_ns", T0 + sec * S), ("bucket_ns", S), ("pid", pid), ("comm", comm),
                               ("source", source), ("op", op), ("count", n), ("sum_duration_ns", dur),
                               ("max_duration_ns", None if dur is None else dur // max(n, 1) * 2), ("sum_bytes", nbytes)):
                agg[key].append(value)

        for sec in range(10):
            bucket(sec, 100, "python", "sched", "sched_switch", 50, 20 * MS, None)
            for worker in (101, 102, 103, 104):
                bucket(sec, worker, "pt_data_worker", "sched", "sched_switch", 500, 100 * MS, None)
            if sec in (5, 6):
                bucket(sec, 200, hog_comm, "sched", "sched_switch", 2000, 10 * MS, None)
            bucket(sec, 100, "python", "mm", "mm_page_alloc", 1000, None, 1000 * 4096)
        w.append("host_aggregates", agg)
        w.append("snapshots", {
            "ts_ns": [T0 + sec * S for sec in range(11)],
            "cpu_percent": [100.0 if sec in (5, 6) else 40.0 for sec in range(11)],
            "cpu_count": [4] * 11, "load1": [2.0] * 11, "mem_used_percent": [30.0] * 11,
        })
        w.replace("collector_stats", {"source": ["cuda", "sched"], "events_seen": [1970, 25000],
                                      "events_stored": [1970, 30], "events_lost": [0, 0]})
    return path


DROP_START, DROP_END = T0 + 8 * S, T0 + 11 * S  # pid 300's launch rate falls from 100/s to 20/s here


def drop_store(path: Path) -> Path:
    """20 s of steady launches (100/s, 10 us each) by pid 300, except 8-11 s: 20/s while its thread is
    preempted 70 % of the time by pid 400 ("backup"), which switches 30x more than usual then."""
    ts = [T0 + i * 10 * MS for i in range(2000) if not DROP_START <= T0 + i * 10 * MS < DROP_END]
    ts += [DROP_START + i * 50 * MS for i in range(60)]
    ts.sort()
    n = len(ts)
    with TraceWriter(path) as w:
        w.replace("sessions", {"source": ["demo:drop"], "cpu_count": [2], "started_ns": [T0], "stopped_ns": [T0 + 20 * S]})
        w.replace("processes", {"pid": [300, 400], "ppid": [1, 1], "comm": ["python", "backup"], "traced": [True, False]})
        w.append("cuda_calls", {"ts_ns": ts, "duration_ns": [10 * US] * n, "pid": [300] * n, "tid": [300] * n,
                                "api": ["runtime"] * n, "op": ["cudaLaunchKernel"] * n})
        offs = [DROP_START + k * 10 * MS + 20 * US for k in range(300)]
        w.append("sched_intervals", {"pid": [300] * 300, "tid": [300] * 300, "off_ns": offs,
                                     "on_ns": [o + 7 * MS for o in offs], "off_cpu_ns": [7 * MS] * 300,
                                     "prev_state": ["preempted"] * 300, "preemptor_pid": [400] * 300,
                                     "preemptor_comm": ["backup"] * 300})
        secs = list(range(20))
        w.append("host_aggregates", {"bucket_start_ns": [T0 + s * S for s in secs], "bucket_ns": [S] * 20,
                                     "pid": [400] * 20, "comm": ["backup"] * 20, "source": ["sched"] * 20,
                                     "op": ["sched_switch"] * 20,
                                     "count": [3000 if 8 <= s < 11 else 100 for s in secs]})
        w.append("snapshots", {"ts_ns": [T0 + s * S for s in secs],
                               "cpu_percent": [100.0 if 8 <= s < 11 else 50.0 for s in secs]})
    return path


def check_evidence_sql(con: duckdb.DuckDBPyConnection, chains: Iterable[CausalChain]) -> int:
    """Run every Evidence.sql of the chains and assert it recomputes the value shown: numbers exactly (floats to
    0.05, as rounded for display); a list shown as text (holders, wakers, kinds of call) from rows whose top row
    names what the text names first. Returns how many were checked."""
    checked = 0
    for chain in chains:
        for ev in chain.evidence:
            if ev.sql is None:
                continue
            got = con.execute(ev.sql).fetchall()
            assert got, (chain.id, ev.name, ev.sql)
            top = got[0]
            if isinstance(ev.value, str) and (len(top) > 1 or not isinstance(top[0], str)):
                names = [c for c in top if isinstance(c, str)]
                assert not names or any(n in ev.value for n in names), (chain.id, ev.name, ev.value, top)
                assert names or top[0] is None, (chain.id, ev.name, ev.value, top)  # nothing named: unrecorded
            elif isinstance(ev.value, float):
                assert float(top[0]) == pytest.approx(ev.value, abs=0.051), (chain.id, ev.name, ev.sql)
            else:
                assert top[0] == ev.value, (chain.id, ev.name, ev.sql)
            checked += 1
    return checked
