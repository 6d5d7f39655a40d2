"""The rows of the call_spans view (sql/call_spans.sql), computed in one linear pass with numpy.

The view is the definition (evidence SQL and `run_sql` read it); this makes the same rows for the once-per-connection
table behind it (derive.materialize), because DuckDB's window functions sort every CUDA call again for each window
(2-4 s per million calls on the 2-core development machine, ~60 ms here). tests/analysis/test_analysis_views.py checks
that the two give the same rows.

The calls are read in (pid, tid, start, end) order (already so in a folded store: only checked, not sorted); a call
starts a span when it starts at or after the running end of the thread's calls before it; a span ends at the
running end just before the next span starts and holds the calls up to it; before_ns is the thread's exclusive
cumulative sum of span lengths; a span is a first launch when it holds the process's earliest call with a kernel
handle (SQL finds those, one row per handle). Calls without a duration (entry-only) have no span, as in the view.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from ingero_mcp.store.schema import current_version

_KEYS = "pid, tid, ts_ns, ts_ns + greatest(duration_ns, 0) AS e"
_HEAD = ("op", "bytes", "memcpy_kind", "host_pinned", "kernel_handle")  # the rest of a span's columns: its first call's
_CALLS = "SELECT {} FROM cuda_calls WHERE duration_ns IS NOT NULL"  # entry-only calls: no span
_FIRSTS = ("SELECT pid, kernel_handle, arg_min(tid, ts_ns) AS tid, min(ts_ns) AS ts_ns FROM cuda_calls "
           "WHERE kernel_handle IS NOT NULL GROUP BY pid, kernel_handle")
# The same rows where cuda_calls stores kernel_key (v10: kernel_handle is computed from it, a cast of every call's text
# to group by; 0.53 s at 10M calls against 0.11 s grouped by the stored text, then by the handle the texts name).
_FIRSTS_BY_KEY = ("SELECT pid, kernel_handle, arg_min(tid, ts_ns) AS tid, min(ts_ns) AS ts_ns FROM ("
                  "SELECT pid, CAST(kernel_key AS UBIGINT) AS kernel_handle, arg_min(tid, ts_ns) AS tid, "
                  "min(ts_ns) AS ts_ns FROM cuda_calls WHERE kernel_key IS NOT NULL GROUP BY pid, kernel_key) "
                  "GROUP BY pid, kernel_handle")
KEYS_STORED_SINCE = 10  # the schema version whose cuda_calls stores kernel_key, kernel_handle computed from it


def _sorted(p: np.ndarray, t: np.ndarray, s: np.ndarray, e: np.ndarray) -> bool:
    """Whether the rows are in (pid, tid, s, e) order."""
    if len(p) < 2:
        return True
    p1, p2, t1, t2, s1, s2, e1, e2 = p[:-1], p[1:], t[:-1], t[1:], s[:-1], s[1:], e[:-1], e[1:]
    return bool(np.all((p1 < p2) | ((p1 == p2) & ((t1 < t2) | ((t1 == t2) & ((s1 < s2) | ((s1 == s2) & (e1 <= e2))))))))


class InCall:
    """The in-call time of a thread up to moments t (what thread_seconds' ASOF join against call_spans gives:
    before_ns + least(t, end_ns) - start_ns of the last span starting at or before t, else 0), by binary search
    over the spans, which are in (pid, tid, start) order."""

    def __init__(self, p: np.ndarray, t: np.ndarray, start: np.ndarray, end: np.ndarray, before: np.ndarray) -> None:
        self.start, self.end, self.before = start, end, before
        self.threads: dict[tuple[int, int], tuple[int, int]] = {}
        if len(p):
            new = np.flatnonzero(np.r_[True, (p[1:] != p[:-1]) | (t[1:] != t[:-1])])
            for a, b in zip(new, np.append(new[1:], len(p)), strict=True):
                self.threads[(int(p[a]), int(t[a]))] = (int(a), int(b))

    def __call__(self, pid: pa.Array, tid: pa.Array, *moments: pa.Array) -> list[pa.Array]:
        """pid, tid and moments t (Arrow arrays of one length) -> per moment column, the in-call ns up to it (NULL
        where pid, tid or t is NULL). The rows are grouped by thread once (one sort), each thread's looked up in one
        binary search per column."""
        nulls = pid.null_count or tid.null_count
        p, t = (np.asarray(v.fill_null(0) if nulls else v) for v in (pid, tid))  # their own integer types
        order = np.lexsort((t, p))
        ps, ts = p[order], t[order]
        heads = np.flatnonzero(np.r_[True, (ps[1:] != ps[:-1]) | (ts[1:] != ts[:-1])]).tolist() if len(p) else []
        threads = [(lo, hi, *self.threads.get((int(ps[lo]), int(ts[lo])), (0, 0)))
                   for lo, hi in zip(heads, heads[1:] + [len(p)] if heads else [], strict=True)]
        del ps, ts
        keys_valid = pa.compute.and_(pid.is_valid(), tid.is_valid()) if nulls else None
        return [self._up_to(order, threads, moment, keys_valid) for moment in moments]

    def _up_to(self, order: np.ndarray, threads: list[tuple[int, int, int, int]], at: pa.Array,
               keys_valid: pa.Array | None) -> pa.Array:
        """One column of __call__: rows grouped by `order`, (lo, hi) of each thread's rows there and (a, b) of its
        spans."""
        x = np.asarray(at.fill_null(0) if at.null_count else at).astype(np.int64, copy=False)
        out = np.zeros(len(x), np.int64)
        for lo, hi, a, b in threads:
            if a == b:
                continue
            rows = order[lo:hi]
            j = a + np.searchsorted(self.start[a:b], x[rows], "right") - 1
            hit = j >= a
            j, rows = j[hit], rows[hit]
            out[rows] = self.before[j] + np.minimum(x[rows], self.end[j]) - self.start[j]
        valid = keys_valid
        if at.null_count:
            valid = at.is_valid() if valid is None else pa.compute.and_(valid, at.is_valid())
        return pa.array(out) if valid is None else pa.array(out, mask=~np.asarray(valid))


def span_rows(con: duckdb.DuckDBPyConnection, kept_only: bool = False) -> tuple[pa.Table, InCall] | None:
    """call_spans' columns up to call_class (first_launch in its place) and the in-call lookup over them, or None
    when the calls cannot be read so (nulls in the keys): the caller then materialises the view itself.

    `kept_only`: the rows only of the spans a v9 store keeps (views.KEPT_WHERE: every span of a thread with a span of
    several calls, and the first launches), the lookup over all; the calls' other columns are then read for those
    spans' first calls alone, by rowid (at 10M calls, reading them for every call held ~0.4 GB through the finish)."""
    kept_only = kept_only and _is_table(con, "cuda_calls")
    # kept_only: no kernel handle of every call (v10 computes it from text: ~0.5 s at 10M calls), only of the first
    # launches' candidates and the kept spans' first calls, by rowid
    calls = con.sql(_CALLS.format(f"rowid AS _row, {_KEYS}" if kept_only else f"{_KEYS}, {', '.join(_HEAD)}")
                    ).to_arrow_table()
    key = ("pid", "tid", "ts_ns", "e")
    if any(calls[c].null_count for c in key):
        return None
    p, t, s, e = (calls[c].to_numpy() for c in key)
    if not _sorted(p, t, s, e):
        calls = calls.take(pa.array(np.lexsort((e, s, t, p))))
        p, t, s, e = (calls[c].to_numpy() for c in key)
    si, end, calls_n, before = _spans(p, t, s, e)
    first = _first_launches(con, calls, p, t, s, si)
    in_call = InCall(*(_at(column, si) for column in (p, t, s)), end, before)
    rows = None  # the spans whose rows are returned: all, or those kept
    if kept_only:
        rows = _kept(_at(p, si), _at(t, si), calls_n, first)
        heads = _with_head_columns(con, calls.take(pa.array(rows if si is None else si[rows])))
    else:
        heads = calls if si is None else calls.take(pa.array(si))
    calls_n = np.ones(len(end), np.int64) if calls_n is None else calls_n
    return pa.table({
        "pid": heads["pid"], "tid": heads["tid"], "start_ns": heads["ts_ns"],
        "end_ns": pa.array(_at(end, rows)), "calls": pa.array(_at(calls_n, rows)),
        "before_ns": pa.array(_at(before, rows)), "op": heads["op"], "bytes": heads["bytes"],
        "memcpy_kind": heads["memcpy_kind"], "host_pinned": heads["host_pinned"],
        "kernel_handle": heads["kernel_handle"], "first_launch": pa.array(_at(first, rows)),
    }), in_call


def _at(column: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    """column[rows], or the column itself where rows is None (all of them)."""
    return column if rows is None else column[rows]


def _spans(p: np.ndarray, t: np.ndarray, s: np.ndarray,
           e: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None, np.ndarray]:
    """The spans of calls in (pid, tid, start, end) order: (the index of each span's first call, None where every
    call is a span of its own; the ends; calls per span, None likewise; the thread's in-call time before each span).
    Arrays of the calls' length are made only where needed (at 10M calls each is 60 MB)."""
    n = len(p)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty
    new = np.empty(n, bool)  # a thread's first call
    new[0] = True
    new[1:] = (p[1:] != p[:-1]) | (t[1:] != t[:-1])
    bounds = np.append(np.flatnonzero(new), n)
    run = np.empty(n, e.dtype)  # running max of the ends, per thread
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        np.maximum.accumulate(e[a:b], out=run[a:b])
    start = new.copy()
    start[1:] |= s[1:] >= run[:-1]
    if start.all():  # every call its own span (the usual case): its end is the running end
        si, end, calls_n, heads = None, run, None, s
    else:
        si = np.flatnonzero(start)
        nxt = np.append(si[1:], n)
        end, calls_n, heads = run[nxt - 1], nxt - si, s[si]
        del run, nxt
    del start
    before = np.subtract(end, heads)  # each span's length; summed, less its own: the exclusive sum
    np.cumsum(before, out=before)
    before -= end
    before += heads
    firsts = np.flatnonzero(_at(new, si))  # each thread's first span: the sum starts again there
    for a, b in zip(firsts, np.append(firsts[1:], len(before)), strict=True):
        before[a:b] -= before[a]
    return si, end, calls_n, before


def _first_launches(con: duckdb.DuckDBPyConnection, calls: pa.Table, p: np.ndarray, t: np.ndarray, s: np.ndarray,
                    si: np.ndarray | None) -> np.ndarray:
    """Per span (spans starting at calls si, None: every call), whether it holds its process's first launch of a
    kernel: the earliest call with each kernel handle (SQL finds those, one row per handle)."""
    first = np.zeros(len(p) if si is None else len(si), bool)
    if not len(p):
        return first
    keyed = "_row" in calls.column_names and current_version(con) >= KEYS_STORED_SINCE
    candidates = []  # (handle, calls from lo to hi): the timed calls at the first call's thread and moment
    for fpid, handle, ftid, fts in con.execute(_FIRSTS_BY_KEY if keyed else _FIRSTS).fetchall():
        # needles in the arrays' own types: numpy would otherwise copy the whole array to a common type per search
        fpid, ftid, fts = p.dtype.type(fpid), t.dtype.type(ftid), s.dtype.type(fts)
        a = np.searchsorted(p, fpid, "left")
        b = np.searchsorted(p, fpid, "right")
        a, b = a + np.searchsorted(t[a:b], ftid, "left"), a + np.searchsorted(t[a:b], ftid, "right")
        lo, hi = a + np.searchsorted(s[a:b], fts, "left"), a + np.searchsorted(s[a:b], fts, "right")
        candidates.append((handle, int(lo), int(hi)))
    handles = _handles_at(con, calls, [i for _, lo, hi in candidates for i in range(lo, hi)])
    for handle, lo, hi in candidates:
        for i in range(lo, hi):  # the call itself (calls starting at the same moment: the one with the handle)
            if handles[i] == handle:
                first[i if si is None else np.searchsorted(si, i, "right") - 1] = True
                break
    return first


def _handles_at(con: duckdb.DuckDBPyConnection, calls: pa.Table, rows: list[int]) -> dict[int, int | None]:
    """The kernel handle of the calls at `rows` (positions in `calls`): from its column, or where it was not read
    (span_rows' kept_only) from cuda_calls by rowid."""
    if "kernel_handle" in calls.column_names:
        column = calls["kernel_handle"]
        return {i: column[i].as_py() for i in rows}
    rowids = calls["_row"].take(pa.array(rows, pa.int64())).to_pylist() if rows else []
    got = dict(con.execute("SELECT rowid, kernel_handle FROM cuda_calls WHERE rowid IN (SELECT unnest(?))",
                           [rowids]).fetchall()) if rowids else {}
    return {i: got.get(rowid) for i, rowid in zip(rows, rowids, strict=True)}


def _kept(p: np.ndarray, t: np.ndarray, calls_n: np.ndarray | None, first: np.ndarray) -> np.ndarray:
    """Which spans (in (pid, tid, start) order, of threads p, t; calls_n None: every span one call) a v9 store keeps:
    every span of a thread with a span of several calls, and the first launches."""
    if calls_n is None or not len(p):
        return np.flatnonzero(first)
    thread = np.cumsum(np.r_[True, (p[1:] != p[:-1]) | (t[1:] != t[:-1])]) - 1
    nested = np.zeros(int(thread[-1]) + 1, bool)
    nested[thread[calls_n > 1]] = True
    return np.flatnonzero(first | nested[thread])


def _with_head_columns(con: duckdb.DuckDBPyConnection, heads: pa.Table) -> pa.Table:
    """`heads` (calls with their rowid, _row) with their _HEAD columns, read from cuda_calls by rowid."""
    name = "_ingero_span_heads"
    con.register(name, heads.select(["_row"]))
    try:
        got = con.sql(f"SELECT h._row, {', '.join(f'c.{column}' for column in _HEAD)} FROM {name} h "
                      "JOIN cuda_calls c ON c.rowid = h._row").to_arrow_table()
    finally:
        con.unregister(name)
    got = got.take(pa.compute.sort_indices(got["_row"]))
    got = got.take(pa.array(np.searchsorted(got["_row"].to_numpy(), heads["_row"].to_numpy())))
    for column in _HEAD:
        heads = heads.append_column(column, got[column])
    return heads


def _is_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether `name` reads a stored table (rowid is a table's), not a reader's compatibility view over one."""
    return not con.execute("SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = ?",
                           [name]).fetchall()[0][0]
