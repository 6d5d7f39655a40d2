"""The GPU's idle time that a part of a feeding thread's time must have held, at a busy GPU, by counting.

Over seconds the GPU was idle a share of (NVML: no kernel running), that idle time fell somewhere in the thread's
time. Not while the thread sat in a synchronising call: the call returns when the GPU has run what was queued, so
the GPU was running it. What the thread's other time (outside the part and outside those calls) cannot hold, the part
held: a lower bound of the part's overlap with the GPU's idle time, where the per-second view cannot place the idle
time between host and GPU (natural_tensor_str_logging: a logging formatter printing GPU tensors each step, the GPU 64%
busy, the main thread 57% of its time running Python, 28% in syncs that found the GPU done or nearly). Seconds in
which the process copied COPY_GUARD_BYTES or more are left out: a sync waiting on a copy leaves the GPU's kernels
idle, and NVML's utilisation counts kernels only; so are those in which another process was on the GPU (NVML's
process list): the idle time was the GPU's, not this process's alone to explain.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis.accounting import SECOND_NS, gpu_util_sql
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.models import Evidence

SYNC_OPS = "contains(op, 'ynchronize')"  # stream, event, context and device synchronisation (runtime and driver)
COPY_GUARD_BYTES = 16 << 20  # a second in which the process copied this much host-device data is not counted
BOUND_PARTS = {"run_outside": "run_outside_ns", "sleep_outside": "sleep_outside_ns - sleep_io_ns",
               "io": "sleep_io_ns"}  # parts outside CUDA calls: none overlaps the time in synchronising calls
BOUNDED = "the thread's other time, outside its waits for the GPU, was too little to hold it"


def idle_bound_sql(pid: int, tid: int, part: str, ks: list[int]) -> str:
    """One row over the seconds `ks` of a thread (those with a GPU utilisation sample, under COPY_GUARD_BYTES
    copied by its process and no other process on the GPU): bound_s (the GPU's idle time less the thread's time
    outside `part` and outside its synchronising calls, at least 0), idle_s (the GPU's idle time, each second's idle
    share of the thread's time in it), synced_s (its time in synchronising calls), part_s, seconds."""
    p, t = int(pid), int(tid)
    k_list = ", ".join(str(int(k)) for k in ks) or "NULL"
    lo, hi = (min(ks), max(ks) + 1) if ks else (0, 0)
    near = f"end_ns > o.t0 + {int(lo) * SECOND_NS} AND start_ns < o.t0 + {int(hi) * SECOND_NS}"
    return " ".join(f"""
        WITH o AS (SELECT min(started_ns) AS t0 FROM sessions),
        sy AS (SELECT start_ns AS a, end_ns AS b FROM call_spans, o WHERE pid = {p} AND tid = {t} AND {SYNC_OPS}
                 AND {near}),
        sk AS (SELECT k, sum(least(b, o.t0 + (k + 1) * {SECOND_NS}) - greatest(a, o.t0 + k * {SECOND_NS})) AS ns
               FROM (SELECT a, b, unnest(range((a - o.t0) // {SECOND_NS}, (b - 1 - o.t0) // {SECOND_NS} + 1)) AS k
                     FROM sy, o WHERE b > a), o
               WHERE k IN ({k_list}) GROUP BY k),
        cp AS (SELECT (start_ns - o.t0) // {SECOND_NS} AS k, sum(bytes) AS bytes FROM call_spans, o
               WHERE pid = {p} AND contains(op, 'emcpy') AND bytes IS NOT NULL AND {near} GROUP BY ALL),
        sh AS (SELECT DISTINCT (ts_ns - o.t0) // {SECOND_NS} AS k FROM gpu_processes, o WHERE pid <> {p}),
        u AS ({gpu_util_sql()}),
        ts AS (SELECT k, wall_ns, {BOUND_PARTS[part]} AS part_ns FROM thread_seconds
               WHERE pid = {p} AND tid = {t} AND k IN ({k_list})),
        x AS (SELECT ts.wall_ns, ts.part_ns, coalesce(sk.ns, 0) AS synced_ns,
                     (100 - least(u.gpu_util_percent, 100)) / 100 * ts.wall_ns AS idle_ns
              FROM ts JOIN u USING (k) LEFT JOIN sk USING (k) LEFT JOIN cp USING (k)
              WHERE coalesce(cp.bytes, 0) < {COPY_GUARD_BYTES} AND k NOT IN (SELECT k FROM sh))
        SELECT round(greatest(0, sum(idle_ns) - sum(wall_ns - part_ns - synced_ns)) / 1e9, 2) AS bound_s,
               round(sum(idle_ns) / 1e9, 2) AS idle_s, round(sum(synced_ns) / 1e9, 2) AS synced_s,
               round(sum(part_ns) / 1e9, 2) AS part_s, count(*) AS seconds FROM x""".split())


def idle_bound(con: duckdb.DuckDBPyConnection, pid: int, tid: int, part: str, ks: list[int]) -> float:
    """idle_bound_sql's bound (s); 0 where no second counts."""
    got = shared_rows(con, idle_bound_sql(pid, tid, part, ks))
    return float(got[0][0] or 0.0) if got else 0.0


def bound_reason(bound_s: float, label: str, share: float) -> str:
    """The explanation's opening for a finding of this bound (the part's label and its share of the thread's time)."""
    return (f"Read from the time accounting, by counting: in those seconds the GPU was idle {bound_s:.2f} s or more "
            f"of what the feeding thread spent {label} ({100 * share:.1f}% of its time): the GPU's idle time (NVML) "
            "less the thread's time outside this part and outside its synchronising calls (which return once the GPU "
            "has run its queue), a lower bound.")


def bound_evidence(pid: int, tid: int, part: str, ks: tuple[int, int], bound_s: float) -> Evidence:
    """The bound as evidence, its SQL over every second of the finding's range (idle_bound_sql)."""
    return Evidence(name="the GPU's idle time this part held at least (s; then the idle time, the time in "
                         "synchronising calls, the part's, the seconds counted)", value=bound_s, unit="s",
                    sql=idle_bound_sql(pid, tid, part, list(range(ks[0], ks[1] + 1))))
