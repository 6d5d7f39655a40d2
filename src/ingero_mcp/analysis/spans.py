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

_KEYS = "pid, tid, ts_ns, ts_ns + greatest(duration_ns, 0) AS e, kernel_handle"
_HEAD = ("op", "bytes", "memcpy_kind", "host_pinned")  # the rest of a span's columns: its first call's
_CALLS = "SELECT {} FROM cuda_calls WHERE duration_ns IS NOT NULL"  # entry-only calls: no span
_FIRSTS = ("SELECT pid, kernel_handle, arg_min(tid, ts_ns) AS tid, min(ts_ns) AS ts_ns FROM cuda_calls "
           "WHERE kernel_handle IS NOT NULL GROUP BY pid, kernel_handle")


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

    def __call__(self, pid: pa.Array, tid: pa.Array, at: pa.Array) -> pa.Array:
        """pid, tid, t (Arrow arrays) -> in-call ns, NULL where an argument is NULL; any number of rows at once."""
        nulls = pid.null_count or tid.null_count or at.null_count
        valid = np.asarray(pa.compute.and_(pa.compute.and_(pid.is_valid(), tid.is_valid()),
                                           at.is_valid())) if nulls else None
        p, t, x = (np.asarray(v.fill_null(0) if nulls else v).astype(np.int64, copy=False) for v in (pid, tid, at))
        out = np.zeros(len(x), np.int64)
        order = np.lexsort((t, p))  # the rows by thread, each thread's looked up in one search
        ps, ts = p[order], t[order]
        heads = np.flatnonzero(np.r_[True, (ps[1:] != ps[:-1]) | (ts[1:] != ts[:-1])])
        for lo, hi in zip(heads, np.append(heads[1:], len(x)), strict=True) if len(x) else ():
            a, b = self.threads.get((int(ps[lo]), int(ts[lo])), (0, 0))
            if a == b:
                continue
            rows = order[lo:hi]
            j = a + np.searchsorted(self.start[a:b], x[rows], "right") - 1
            hit = j >= a
            j, rows = j[hit], rows[hit]
            out[rows] = self.before[j] + np.minimum(x[rows], self.end[j]) - self.start[j]
        return pa.array(out) if valid is None else pa.array(out, mask=~valid)


def span_rows(con: duckdb.DuckDBPyConnection, kept_only: bool = False) -> tuple[pa.Table, InCall] | None:
    """call_spans' columns up to call_class (first_launch in its place) and the in-call lookup over them, or None
    when the calls cannot be read so (nulls in the keys): the caller then materialises the view itself.

    `kept_only`: the rows only of the spans a v9 store keeps (views.KEPT_WHERE: every span of a thread with a span of
    several calls, and the first launches), the lookup over all; the calls' other columns are then read for those
    spans' first calls alone, by rowid (at 10M calls, reading them for every call held ~0.4 GB through the finish)."""
    kept_only = kept_only and _is_table(con, "cuda_calls")
    calls = con.sql(_CALLS.format(f"rowid AS _row, {_KEYS}" if kept_only else f"{_KEYS}, {', '.join(_HEAD)}")
                    ).to_arrow_table()
    n = calls.num_rows
    key = ("pid", "tid", "ts_ns", "e")
    if any(calls[c].null_count for c in key):
        return None
    p, t, s, e = (calls[c].to_numpy() for c in key)
    if not _sorted(p, t, s, e):
        order = np.lexsort((e, s, t, p))
        calls = calls.take(pa.array(order))
        p, t, s, e = (calls[c].to_numpy() for c in key)
    if n == 0:
        si = np.zeros(0, np.int64)
        end = before = calls_n = np.zeros(0, np.int64)
        first = np.zeros(0, bool)
    else:
        new = np.empty(n, bool)
        new[0] = True
        new[1:] = (p[1:] != p[:-1]) | (t[1:] != t[:-1])
        bounds = np.append(np.flatnonzero(new), n)
        run = np.empty(n, e.dtype)  # running max of the ends, per thread
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            np.maximum.accumulate(e[a:b], out=run[a:b])
        start = new.copy()
        start[1:] |= s[1:] >= run[:-1]
        si = np.flatnonzero(start)
        nxt = np.append(si[1:], n)
        end = run[nxt - 1]
        calls_n = nxt - si
        del run
        dur = end - s[si]
        excl = np.cumsum(dur)
        excl -= dur
        del dur
        thread_first = np.maximum.accumulate(np.where(new[si], np.arange(len(si)), 0))
        before = excl - excl[thread_first]
        del excl, thread_first, nxt
        first = np.zeros(len(si), bool)
        kh = calls["kernel_handle"]
        kh_np = kh.fill_null(0).to_numpy() if kh.null_count else kh.to_numpy()
        kh_valid = kh.is_valid().to_numpy(zero_copy_only=False) if kh.null_count else None
        for fpid, handle, ftid, fts in con.execute(_FIRSTS).fetchall():
            # needles in the arrays' own types: numpy would otherwise copy the whole array to a common type per search
            fpid, ftid, fts = p.dtype.type(fpid), t.dtype.type(ftid), s.dtype.type(fts)
            a = np.searchsorted(p, fpid, "left")
            b = np.searchsorted(p, fpid, "right")
            a, b = a + np.searchsorted(t[a:b], ftid, "left"), a + np.searchsorted(t[a:b], ftid, "right")
            lo, hi = a + np.searchsorted(s[a:b], fts, "left"), a + np.searchsorted(s[a:b], fts, "right")
            for i in range(lo, hi):  # the call itself (calls starting at the same moment: the one with the handle)
                if kh_np[i] == handle and (kh_valid is None or kh_valid[i]):
                    first[np.searchsorted(si, i, "right") - 1] = True
                    break
    every = len(si) == n  # every call its own span: the calls' own columns, no copies
    in_call = InCall(p, t, s, end, before) if every else InCall(p[si], t[si], s[si], end, before)
    if kept_only:
        keep = _kept(p[si], t[si], calls_n, first)
        heads = _with_head_columns(con, calls.take(pa.array(si[keep])))
        end, calls_n, before, first = end[keep], calls_n[keep], before[keep], first[keep]
    else:
        heads = calls if every else calls.take(pa.array(si))
    return pa.table({
        "pid": heads["pid"], "tid": heads["tid"], "start_ns": heads["ts_ns"],
        "end_ns": pa.array(end), "calls": pa.array(calls_n.astype(np.int64)), "before_ns": pa.array(before),
        "op": heads["op"], "bytes": heads["bytes"], "memcpy_kind": heads["memcpy_kind"],
        "host_pinned": heads["host_pinned"], "kernel_handle": heads["kernel_handle"], "first_launch": pa.array(first),
    }), in_call


def _kept(p: np.ndarray, t: np.ndarray, calls_n: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Which spans (in (pid, tid, start) order, of threads p, t) a v9 store keeps: every span of a thread with a span
    of several calls, and the first launches."""
    if not len(p):
        return np.zeros(0, np.int64)
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
