"""The trace as Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev): the same tracks as the
Perfetto export, written with the standard library's json (the format is JSON; no writer to pick).

pid/tid are the traced ones; each thread's states go on a second thread row (tid + STATE_TID_OFFSET
is not a real tid: its name says whose states they are); chains on pid 0 ("causal chains").
"""

from __future__ import annotations

import json
from typing import IO

import duckdb

from ingero_mcp.export import events as ev

STATE_TID_BASE = 1 << 30  # fake tids for the state rows: far above any pid_max


def write_chrome_json(con: duckdb.DuckDBPyConnection, timeline: ev.Timeline,
                      scope: ev.Scope, out: IO[str]) -> dict[str, int]:
    """Write {"otherData": {...}, "traceEvents": [...]}; returns what it wrote.

    Times are µs since the trace's start (otherData.trace_start_ns): µs since the epoch (~1.8e15) leave a
    double 0.25 µs of precision, too coarse for sub-µs CUDA calls; from the start they keep ns."""
    counts = {"call_slices": 0, "call_instants": 0, "state_slices": 0, "flows": 0, "counter_points": 0,
              "process_events": 0, "chains": 0}
    from ingero_mcp.analysis import window_or_trace

    origin = window_or_trace(con, scope.window).start_ns
    out.write('{"displayTimeUnit":"ns","otherData":{"trace_start_ns":"%d","ts":"microseconds since trace_start_ns"},'
              '"traceEvents":[\n' % origin)
    first = [True]
    dumps = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode

    def emit(obj: dict) -> None:
        out.write(("" if first[0] else ",\n") + dumps(obj))
        first[0] = False

    def us(ns: int) -> float:
        return (ns - origin) / 1000.0

    pids = {t.pid: t.process_name for t in timeline.threads}
    state_tid = {t.tid: STATE_TID_BASE + i for i, t in enumerate(timeline.threads)}
    pid_of = {t.tid: t.pid for t in timeline.threads}
    for pid, name in pids.items():
        emit({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
    for t in timeline.threads:
        emit({"ph": "M", "name": "thread_name", "pid": t.pid, "tid": t.tid, "args": {"name": t.name}})
        emit({"ph": "M", "name": "thread_name", "pid": t.pid, "tid": state_tid[t.tid],
              "args": {"name": f"{t.name} {t.tid}: state"}})
    labels: dict[str | None, str] = {}  # op and memcpy-kind names as stored -> cleaned (few distinct, many rows)

    def label(text: str | None) -> str:
        if text not in labels:
            labels[text] = ev.label(text)
        return labels[text]

    for batch in ev.batches(con, ev.calls_sql(scope)):
        for ts, dur, tid, raw_op, nbytes, raw_kind, kernel, off, sleep, wait, rc in batch:
            op, kind = label(raw_op), (None if raw_kind is None else label(raw_kind))
            args = {k: v for k, v in (("bytes", nbytes), ("direction", kind), ("kernel", kernel), ("off_cpu_ns", off),
                                      ("sleep_ns", sleep), ("cpu_wait_ns", wait),
                                      ("return_code", rc or None)) if v is not None}
            if dur is None:  # entry-only (v4 launches): the duration is unknown, an instant event, not a 0-length slice
                emit({"ph": "i", "s": "t", "name": op, "cat": "cuda", "pid": pid_of[tid], "tid": tid, "ts": us(ts),
                      "args": {**args, "entry_only": True}})
                counts["call_instants"] += 1
                continue
            emit({"ph": "X", "name": op, "cat": "cuda", "pid": pid_of[tid], "tid": tid, "ts": us(ts),
                  "dur": dur / 1000.0, "args": args})
            counts["call_slices"] += 1
    ev.make_wakeups(con, scope)
    for batch in ev.batches(con, ev.states_sql(scope)):
        for tid, state, start, dur, syscall, waker, holder, pid, _flow in batch:
            if tid not in state_tid:
                continue
            args = {k: ev.label(v) for k, v in (("syscall", syscall), ("woken_by", waker), ("cpu_held_by", holder))
                    if v}
            emit({"ph": "X", "name": ev.state_name(state), "cat": "state", "pid": pid, "tid": state_tid[tid],
                  "ts": us(start), "dur": dur / 1000.0, "args": args})
            counts["state_slices"] += 1
    # Wake-ups: an arrow from the waker's state row to the wakee's ("f" binds to the slice enclosing it).
    for batch in ev.batches(con, f"SELECT flow_id, wakeup_ns, waker_tid, tid FROM {ev.WAKEUPS} ORDER BY flow_id"):
        for fid, ts, waker, wakee in batch:
            emit({"ph": "s", "id": fid, "name": "wakes", "cat": "wakeup", "pid": pid_of[waker], "tid": state_tid[waker],
                  "ts": us(ts)})
            emit({"ph": "f", "bp": "e", "id": fid, "name": "wakes", "cat": "wakeup", "pid": pid_of[wakee],
                  "tid": state_tid[wakee], "ts": us(ts)})
            counts["flows"] += 1
    for ts, event, pid, tid, child, comm, filename, code, old in ev.batches_flat(con, ev.process_events_sql(scope)):
        args = {k: v for k, v in (("filename", ev.label(filename) if filename else None), ("child_pid", child),
                                  ("exit_code", code), ("old_name", ev.label(old) if old else None),
                                  ("tid", tid)) if v is not None}
        marker = f"{ev.label(event, 20)} {ev.label(comm, 60)}".strip()
        emit({"ph": "i", "s": "p", "name": marker, "cat": "process", "pid": pid,
              "tid": tid or pid, "ts": us(ts), "args": args})
        counts["process_events"] += 1
    for column, name in ev.COUNTERS:
        for ts, value in ev.batches_flat(con, ev.counters_sql(scope, column)):
            emit({"ph": "C", "name": name, "pid": 0, "tid": 0, "ts": us(ts), "args": {"value": float(value)}})
            counts["counter_points"] += 1
    if timeline.chains:
        emit({"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "host / causal chains"}})
    for i, chain in enumerate(c for c in timeline.chains if c.window is not None):
        emit({"ph": "X", "name": ev.label(chain.summary, 200), "cat": "chain", "pid": 0, "tid": i + 1,
              "ts": us(chain.window.start_ns), "dur": max(1, chain.window.end_ns - chain.window.start_ns) / 1000.0,
              "args": {"root_cause": ev.label(chain.root_cause, 500), "seconds_lost": chain.seconds_lost,
                       "severity": chain.severity, "chain_id": ev.label(chain.id)}})
        counts["chains"] += 1
    out.write("\n]}\n")
    return counts
