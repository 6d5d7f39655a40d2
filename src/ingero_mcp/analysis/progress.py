"""Progress: the job's iterations, found from its own recurring pattern, and how many it made per second.

A slow phase is one where the job made less progress per second, not one with fewer CUDA calls: the same
samples split into 64 micro-batches make more launches and fewer steps. A training or inference loop
repeats the same CUDA work every iteration, so some call recurs exactly once per iteration: the optimizer's
kernel, the loss.item() copy and its sync, a batch's host-to-device copy. The marker is that call: among the
calls of a process that recur throughout its life (first seen in its first quarter, last in its last, at
least MIN_MARKS times, their regular gaps covering most of the span), the rarest that other calls keep time
with (a step's kernels all recur once per step: a lone rare call is more likely a periodic side task) and whose
marks lie within a second of each other where another rhythm's do (an evaluation every few hundred steps is an
outer loop: its marks would leave the steps' pace unread), preferring
a sync or a copy (always probed) to a launch (which the collector's governor may have left unprobed for part of a
second). Allocations and frees never mark iterations: the caching allocator calls them when its cache runs dry. Each
gap between two marks is one iteration, spread evenly over its time, so a second's progress is the sum of the
parts of the iterations it holds: a loop of 0.2 iterations per second has a rate too. Where no call recurs
like that, there is no marker, and the caller falls back to launches and copies per second, labelled so.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.models import Progress

SECOND_NS = 1_000_000_000
MIN_MARKS = 8  # fewer marks than this make no marker
SPAN_EDGE = 0.25  # a marker is first seen in the first quarter of the process's CUDA life and last seen in the last
MIN_COVER = 0.4  # ... and its gaps, each capped at GAP_CAP x the median gap, cover this share of its span
GAP_CAP = 20.0
SAME_COUNT = 0.02  # signatures within 2 % of a count are the same rhythm: the preferred op among them wins
MIN_RHYTHM = 3  # the rarest rhythm kept by at least this many signatures marks iterations (else the rarest of all)
# ... unless its marks lie over this far apart (median) and a more frequent rhythm is kept as well: an outer loop (an
# evaluation every few hundred steps, 8 marks in 20 s) would leave the steps' pace unread, second by second.
MAX_MARK_GAP_NS = 1_000_000_000
# A call's signature: launches by the kernel launched, copies by size and direction, everything else by its op.
_SIGNATURE = ("CASE WHEN kernel_handle IS NOT NULL THEN 'k' || kernel_handle::VARCHAR "
              "WHEN bytes IS NOT NULL THEN 'b' || bytes::VARCHAR || '/' || coalesce(memcpy_kind, '') ELSE '' END")
_KIND = ("CASE WHEN contains(op, 'ynchronize') THEN 0 WHEN contains(op, 'emcpy') OR contains(op, 'emset') THEN 1 "
         "WHEN contains(op, 'aunch') THEN 2 ELSE 3 END")


def signatures_sql(pid: int, launches: bool = True) -> str:
    """A process's recurring calls by signature (op, kernel launched, copy size and direction), the ones seen at least
    MIN_MARKS times from its first quarter of CUDA life to its last, rarest first: one hash aggregate over its calls."""
    no_launch = "" if launches else "AND NOT contains(op, 'aunch')"
    no_alloc = "NOT (contains(op, 'lloc') OR contains(op, 'Free') OR contains(op, 'egister'))"
    return " ".join(f"""
        WITH life AS (SELECT min(ts_ns) AS lo, max(ts_ns) AS hi FROM cuda_calls WHERE pid = {int(pid)}),
        s AS (SELECT op, kernel_handle, bytes, memcpy_kind, {_KIND} AS kind, count(*) AS n, min(ts_ns) AS first_ns,
                     max(ts_ns) AS last_ns
              FROM cuda_calls WHERE pid = {int(pid)} AND {no_alloc} {no_launch}
              GROUP BY op, kernel_handle, bytes, memcpy_kind HAVING count(*) >= {MIN_MARKS})
        SELECT s.op, {_SIGNATURE} AS sig, s.kind, s.n, s.first_ns, s.last_ns
        FROM s, life
        WHERE (s.first_ns - life.lo) <= {SPAN_EDGE} * (life.hi - life.lo)
          AND (life.hi - s.last_ns) <= {SPAN_EDGE} * (life.hi - life.lo)
        ORDER BY s.n, s.kind, s.op, sig""".split())


def cover_sql(pid: int, op: str, sig: str) -> str:
    """One signature's median gap, the share of its span its gaps cover (each capped at GAP_CAP x the median), its
    longest gap (where it ended) and its marks and span, read from its own calls only."""
    return " ".join(f"""
        WITH g AS (SELECT ts_ns - lag(ts_ns) OVER (ORDER BY ts_ns) AS gap, ts_ns FROM cuda_calls
                   WHERE pid = {int(pid)} AND {marks_filter(op, sig)}),
        m AS (SELECT median(gap) AS median_gap, min(ts_ns) AS lo, max(ts_ns) AS hi, arg_max(ts_ns, gap) AS long_end,
                     max(gap) AS long_gap, count(*) AS marks FROM g)
        SELECT sum(least(g.gap, {GAP_CAP} * m.median_gap)) / greatest(any_value(m.hi - m.lo), 1) AS cover,
               any_value(m.median_gap), any_value(m.long_gap), any_value(m.long_end), any_value(m.marks),
               any_value(m.lo), any_value(m.hi)
        FROM g, m WHERE g.gap IS NOT NULL""".split())


def gap_work_sql(pid: int, gap_start: int, gap_end: int, lo: int, hi: int, marks: int) -> str:
    """How much the rest of the process did in a marker's longest gap, in iterations' worth: its CUDA calls then
    over its calls per mark across the marker's span (a call that stops while the process goes on working does not
    mark iterations)."""
    return (f"SELECT count(*) FILTER (WHERE ts_ns > {int(gap_start)} AND ts_ns < {int(gap_end)}) "
            f"/ nullif(count(*) / {max(int(marks), 1)}, 0) FROM cuda_calls "
            f"WHERE pid = {int(pid)} AND ts_ns BETWEEN {int(lo)} AND {int(hi)}")


QUIET_GAP_NS = 1_000_000_000  # a marker's gap this long ...
BUSY_IN_GAP = 3.0  # ... in which the process made this many iterations' worth of calls: the call stopped, not the work


MAX_TRIED = 24  # signatures whose gaps are read, rarest first: so many syncs and copies, and so many others


def _has_launch_gaps(con: duckdb.DuckDBPyConnection, pid: int) -> bool:
    return bool(shared_rows(con, f"""SELECT 1 FROM probe_gaps g WHERE g.probes = 'launch' AND g.session_id IN
                                 (SELECT DISTINCT session_id FROM cuda_calls WHERE pid = {int(pid)}) LIMIT 1"""))


def marks_filter(op: str, sig: str) -> str:
    """The WHERE condition that selects a marker's calls (its op and signature) on the raw columns, so that it filters
    as a column scan: 'k<handle>' a kernel launched, 'b<bytes>/<kind>' a copy's size and direction, '' neither."""
    cond = [f"op = '{op.replace(chr(39), chr(39) * 2)}'"]
    if sig.startswith("k"):
        cond.append(f"kernel_handle = {int(sig[1:])}")
    elif sig.startswith("b"):
        size, _, kind = sig[1:].partition("/")
        cond += ["kernel_handle IS NULL", f"bytes = {int(size)}",
                 f"memcpy_kind = '{kind}'" if kind else "memcpy_kind IS NULL"]
    else:
        cond += ["kernel_handle IS NULL", "bytes IS NULL"]
    return " AND ".join(cond)


def find_marker(con: duckdb.DuckDBPyConnection, pid: int) -> Progress | None:
    """The call that marks one iteration of a process, or None (see the module's docstring)."""
    # launches the governor left unprobed for part of a second are not all rows: no launch marks iterations then
    sigs = shared_rows(con, signatures_sql(pid, launches=not _has_launch_gaps(con, pid)))
    groups: list[list[tuple]] = []  # ascending count: a rhythm is a run of counts within SAME_COUNT of its first
    for r in sigs:
        if groups and int(r[3]) <= int(groups[-1][0][3]) * (1 + SAME_COUNT):
            groups[-1].append(r)
        else:
            groups.append([r])
    found: list[list[tuple]] = []  # per rhythm (rarest first), the signatures it kept
    # each class read up to MAX_TRIED: kernels compiled per shape (a few launches each, scores of them) must not use
    # up the reads before the loop's own sync is reached (natural_variable_length_batches: 300 steps, no marker)
    tried = {True: 0, False: 0}  # a sync or a copy: read / a launch or another call: read
    for group in groups:
        kept: list[tuple] = []
        # syncs and copies first
        for op, sig, kind, n, _first, _last in sorted(group, key=lambda r: (int(r[2]), int(r[3]))):
            if len(kept) >= MIN_RHYTHM:
                break
            if tried[int(kind) <= 1] >= MAX_TRIED:
                continue
            tried[int(kind) <= 1] += 1
            cover, gap, long_gap, long_end, marks, lo, hi = shared_rows(con, cover_sql(pid, str(op), str(sig)))[0]
            if long_gap is not None and long_gap >= QUIET_GAP_NS:
                busy = shared_rows(con, gap_work_sql(pid, long_end - long_gap, long_end, lo, hi, marks))[0][0]
                if busy is not None and float(busy) >= BUSY_IN_GAP:
                    continue  # it stopped while the process kept working: a phase's call (a bulk copy), not the step's
            # bursts (an evaluation pass) cover little of their span
            if cover is not None and float(cover) >= MIN_COVER:
                kept.append((str(op), str(sig), int(kind), int(n), float(cover), gap))
        if kept:
            found.append(kept)
        if len(kept) >= MIN_RHYTHM and not _outer(kept) or min(tried.values()) >= MAX_TRIED:
            break
    fallback = _pick(found)
    if not fallback:
        return None
    op, sig, _kind, n, cover, gap = min(fallback, key=lambda r: (r[2], r[3]))
    where = f"pid = {int(pid)} AND {marks_filter(str(op), str(sig))}"
    driver = shared_rows(con, f"SELECT tid FROM cuda_calls WHERE {where} GROUP BY tid ORDER BY count(*) DESC, tid "
                              "LIMIT 1")
    return Progress(pid=int(pid), op=str(op), signature=str(sig), marks=int(n), median_gap_ns=int(gap or 0),
                    tid=int(driver[0][0]) if driver else None,
                    cover=round(float(cover), 3), label=marker_label(str(op), str(sig)),
                    sql=f"SELECT ts_ns FROM cuda_calls WHERE {where} ORDER BY ts_ns")


def _outer(kept: list[tuple]) -> bool:
    """Whether a rhythm's marker (its preferred signature) recurs over MAX_MARK_GAP_NS apart (median)."""
    gap = min(kept, key=lambda r: (r[2], r[3]))[5]
    return gap is not None and gap > MAX_MARK_GAP_NS


def _pick(found: list[list[tuple]]) -> list[tuple]:
    """The rhythm that marks iterations, of those found (rarest first): the rarest kept by MIN_RHYTHM signatures,
    else the rarest; in either, one whose marks lie within MAX_MARK_GAP_NS before an outer loop's."""
    for want in (lambda k: len(k) >= MIN_RHYTHM and not _outer(k), lambda k: len(k) >= MIN_RHYTHM,
                 lambda k: not _outer(k), lambda k: True):
        got = next((k for k in found if want(k)), None)
        if got is not None:
            return got
    return []


def marker_label(op: str, sig: str) -> str:
    """How a marker is said to a person: 'cuStreamSynchronize', 'cuMemcpyDtoHAsync_v2 of 4 B', 'kernel 0x5f3a...'."""
    if sig.startswith("k"):
        return f"{op} of kernel 0x{int(sig[1:]):x}"
    if sig.startswith("b"):
        size, _, kind = sig[1:].partition("/")
        return f"{op} of {int(size):,} B" + (f" {kind}" if kind else "")
    return op


def per_second_sql(marker: Progress, t0: int) -> str:
    """Iterations per second of the trace (k: seconds since t0): each gap between two marks is one iteration,
    spread evenly over its time; seconds outside the first and last mark have none listed (unknown)."""
    return " ".join(f"""
        WITH m AS (SELECT ts_ns AS a, lead(ts_ns) OVER (ORDER BY ts_ns) AS b FROM ({marker.sql})),
        i AS (SELECT a, b FROM m WHERE b IS NOT NULL AND b > a),
        p AS (SELECT a, b, unnest(range((a - {t0}) // {SECOND_NS}, (b - 1 - {t0}) // {SECOND_NS} + 1)) AS k FROM i)
        SELECT k, sum((least(b, {t0} + (k + 1) * {SECOND_NS}) - greatest(a, {t0} + k * {SECOND_NS}))::DOUBLE / (b - a))
                   AS iterations,
               sum(least(b, {t0} + (k + 1) * {SECOND_NS}) - greatest(a, {t0} + k * {SECOND_NS})) AS seen_ns
        FROM p GROUP BY k ORDER BY k""".split())


def per_bin_sql(marker: Progress, t0: int, lo: int, hi: int, bin_ns: int) -> str:
    """Iterations per bin of bin_ns over [lo, hi), as per_second_sql does per second (bins: (t - t0) // bin_ns)."""
    return " ".join(f"""
        WITH m AS (SELECT ts_ns AS a, lead(ts_ns) OVER (ORDER BY ts_ns) AS b FROM ({marker.sql})),
        i AS (SELECT a, b FROM m WHERE b IS NOT NULL AND b > a AND b > {lo} AND a < {hi}),
        p AS (SELECT a, b, unnest(range((a - {t0}) // {bin_ns}, (b - 1 - {t0}) // {bin_ns} + 1)) AS bin FROM i)
        SELECT bin, sum((least(b, {t0} + (bin + 1) * {bin_ns}) - greatest(a, {t0} + bin * {bin_ns}))::DOUBLE / (b - a))
                    AS iterations
        FROM p WHERE bin >= ({lo} - {t0}) // {bin_ns} AND bin < ({hi} - {t0} + {bin_ns} - 1) // {bin_ns}
        GROUP BY bin ORDER BY bin""".split())


def iterations_per_second(con: duckdb.DuckDBPyConnection, marker: Progress, t0: int) -> dict[int, tuple[float, int]]:
    """k -> (iterations in second k, ns of it between the first and the last mark)."""
    return {int(k): (float(it), int(seen)) for k, it, seen in shared_rows(con, per_second_sql(marker, t0))}


def progress_of(con: duckdb.DuckDBPyConnection, pids: list[int], t0: int
                ) -> tuple[dict[int, Progress], dict[int, dict[int, tuple[float, int]]]]:
    """Per process: its iteration marker (where one is found) and its iterations in each second."""
    markers = {pid: m for pid in pids if (m := find_marker(con, pid)) is not None}
    return markers, {pid: iterations_per_second(con, m, t0) for pid, m in markers.items()}
