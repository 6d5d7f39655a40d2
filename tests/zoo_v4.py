"""Rewrite a zoo store (recorded on the H200 with every probe entry + return, both API layers) the way the v4
collector's defaults would have recorded the same run: one probe layer per logical call (--api auto), kernel launches
entry-only, and optionally an overhead governor detaching the launch probes for part of each second.

Used by tests/test_zoo_v4.py; also runnable: `python tests/zoo_v4.py IN.duckdb OUT.duckdb [duty]`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import duckdb

from ingero_mcp.store.schema import migrate

LAUNCH = "contains(op, 'aunch')"
SPLIT = ("duration_ns", "cpu_wait_ns", "sleep_ns", "off_cpu_ns", "context_switches", "page_allocs", "page_alloc_bytes",
         "return_code")
KEEP_RUNTIME = ("cudaDeviceSynchronize", "cudaEventSynchronize")
ENTRY_NS, ENTRY_RETURN_NS = 900.0, 1400.0  # the collector's defaults when it cannot calibrate (cli/trace.py)
SECOND = 1_000_000_000


def convert(src: Path, dst: Path, duty: float | None = None) -> None:
    """Copy `src` to `dst` and rewrite it as a v4 default recording; `duty`: the launch probes attached for the first
    `duty` of each second of the session (from its start), detached (a probe gap, no launch rows) for the rest."""
    shutil.copyfile(src, dst)
    con = duckdb.connect(str(dst))
    try:
        migrate(con)
        # one layer per logical call: a runtime call whose driver counterpart is nested in it was not probed
        con.execute(f"""
            DELETE FROM cuda_calls r WHERE r.api = 'runtime' AND r.op NOT IN {KEEP_RUNTIME}
              AND EXISTS (SELECT 1 FROM cuda_calls d WHERE d.api = 'driver' AND d.pid = r.pid AND d.tid = r.tid
                          AND d.ts_ns >= r.ts_ns AND d.ts_ns <= r.ts_ns + r.duration_ns)""").fetchall()
        con.execute(f"UPDATE cuda_calls SET {', '.join(f'{c} = NULL' for c in SPLIT)} WHERE {LAUNCH}").fetchall()
        sessions = con.execute("SELECT session_id, started_ns, stopped_ns FROM sessions").fetchall()
        if duty is not None:
            for sid, start, stop in sessions:
                last = con.execute("SELECT max(ts_ns + coalesce(duration_ns, 0)) FROM cuda_calls WHERE session_id = ?",
                                   [sid]).fetchall()[0][0]
                end = max(stop or 0, last or 0)
                gaps = [(start + k * SECOND + int(duty * SECOND), min(start + (k + 1) * SECOND, end))
                        for k in range((end - start) // SECOND + 1)]
                gaps = [(a, b) for a, b in gaps if b > a]
                con.executemany("INSERT INTO probe_gaps VALUES (?, 'launch', ?, ?, ?)", [(sid, a, b, duty) for a, b in gaps])
            con.execute(f"""DELETE FROM cuda_calls c WHERE {LAUNCH} AND EXISTS (
                SELECT 1 FROM probe_gaps g WHERE g.session_id = c.session_id AND c.ts_ns >= g.start_ns AND c.ts_ns < g.end_ns)
            """).fetchall()
        for sid, *_ in sessions:
            con.execute("INSERT INTO probe_costs VALUES (?, 'entry', ?, 'test: the collector''s default', NULL), "
                        "(?, 'entry_return', ?, 'test: the collector''s default', NULL)",
                        [sid, ENTRY_NS, sid, ENTRY_RETURN_NS]).fetchall()
        # per pid and second of the session: the hits and their estimated cost, as the governor writes them
        con.execute(f"""
            INSERT INTO tracing_cost
            SELECT c.session_id, c.pid, s.started_ns + k * {SECOND}, s.started_ns + (k + 1) * {SECOND},
                   count(*) FILTER (WHERE {LAUNCH}) AS e, count(*) FILTER (WHERE NOT {LAUNCH}) AS er,
                   round(count(*) FILTER (WHERE {LAUNCH}) * {ENTRY_NS} + count(*) FILTER (WHERE NOT {LAUNCH}) * {ENTRY_RETURN_NS})::BIGINT,
                   {1.0 if duty is None else duty}
            FROM cuda_calls c JOIN sessions s USING (session_id), LATERAL (SELECT (c.ts_ns - s.started_ns) // {SECOND} AS k)
            GROUP BY c.session_id, c.pid, s.started_ns, k""").fetchall()
        con.execute("CHECKPOINT").fetchall()
    finally:
        con.close()


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else None)
