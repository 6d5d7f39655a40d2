"""Progress: the job's iterations, found from its own recurring pattern, and how many it made per second.

A slow phase is one where the job made less progress per second, not one with fewer CUDA calls: the same
samples split into 64 micro-batches make more launches and fewer steps. A training or inference loop
repeats the same CUDA work every iteration, so some call recurs exactly once per iteration: the optimizer's
kernel, the loss.item() copy and its sync, a batch's host-to-device copy. The marker is that call: among the
calls of a process that recur throughout its life (first seen in its first quarter, last in its last, at
least MIN_MARKS times, their regular gaps covering most of the span), the rarest that other calls keep time
with (a step's kernels all recur once per step: a lone rare call is more likely a periodic side task), preferring
a sync or a copy (always probed) to a launch (which the collector's governor may have left unprobed for part of a
second). Allocations and frees never mark iterations: the caching allocator calls them when its cache runs dry. Each
gap between two marks is one iteration, spread evenly over its time, so a second's progress is the sum of the
parts of the iterations it holds: a loop of 0.2 iterations per second has a rate too. Where no call recurs
like that, there is no marker, and the caller falls back to launches and copies per second, labelled so.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis._sql import rows
from ingero_mcp.analysis.models import Progress

SECOND_NS = 1_000_000_000
MIN_MARKS = 8  # fewer marks than this make no marker
SPAN_EDGE = 0.25  # a marker is first seen in the first quarter of the process's CUDA life and last seen in the last
MIN_COVER = 0.4  # ... and its gaps, each capped at GAP_CAP x the median gap, cover this share of its span
GAP_CAP = 20.0
SAME_COUNT = 0.02  # signatures within 2 % of a count are the same rhythm: the preferred op among them wins
MIN_RHYTHM = 3  # the rarest rhythm kept by at least this many signatures marks iterations (else the rarest of all)
# A call's signature: launches by the kernel launched, copies by size and direction, everything else by its op.
_SIGNATURE = ("CASE WHEN kernel_handle IS NOT NULL THEN 'k' || kernel_handle::VARCHAR "
              "WHEN bytes IS NOT NULL THEN 'b' || bytes::VARCHAR || '/' || coalesce(memcpy_kind, '') ELSE '' END")
_KIND = ("CASE WHEN contains(op, 'ynchronize') THEN 0 WHEN contains(op, 'emcpy') OR contains(op, 'emset') THEN 1 "
         "WHEN contains(op, 'aunch') THEN 2 ELSE 3 END")


def candidates_sql(pid: int, launches: bool = True) -> str:
    """A process's recurring calls: per signature, how often, when first and last seen (as shares of the process's
    CUDA life), and the share of that life its gaps cover (each capped at GAP_CAP x its median gap)."""
    no_launch = "" if launches else "AND NOT contains(op, 'aunch')"
    no_alloc = "NOT (contains(op, 'lloc') OR contains(op, 'Free') OR contains(op, 'egister'))"
    return " ".join(f"""
        WITH c AS (SELECT op, {_SIGNATURE} AS sig, {_KIND} AS kind, ts_ns FROM cuda_calls
                   WHERE pid = {int(pid)} AND {no_alloc} {no_launch}),
        life AS (SELECT min(ts_ns) AS lo, max(ts_ns) AS hi FROM cuda_calls WHERE pid = {int(pid)}),
        g AS (SELECT op, sig, kind, ts_ns, ts_ns - lag(ts_ns) OVER (PARTITION BY op, sig ORDER BY ts_ns) AS gap FROM c),
        s AS (SELECT op, sig, any_value(kind) AS kind, count(*) AS n, min(ts_ns) AS first_ns, max(ts_ns) AS last_ns,
                     median(gap) AS median_gap FROM g GROUP BY op, sig HAVING count(*) >= {MIN_MARKS}),
        cov AS (SELECT g.op, g.sig, sum(least(g.gap, {GAP_CAP} * s.median_gap)) AS covered
                FROM g JOIN s USING (op, sig) WHERE g.gap IS NOT NULL GROUP BY ALL)
        SELECT s.op, s.sig, s.kind, s.n, (s.first_ns - life.lo) / greatest(life.hi - life.lo, 1) AS first_share,
               (s.last_ns - life.lo) / greatest(life.hi - life.lo, 1) AS last_share,
               cov.covered / greatest(s.last_ns - s.first_ns, 1) AS cover, s.median_gap
        FROM s JOIN cov USING (op, sig), life
        WHERE (s.first_ns - life.lo) <= {SPAN_EDGE} * (life.hi - life.lo)
          AND (life.hi - s.last_ns) <= {SPAN_EDGE} * (life.hi - life.lo)
          AND cov.covered >= {MIN_COVER} * (s.last_ns - s.first_ns)
        ORDER BY s.n, s.kind""".split())


def _has_launch_gaps(con: duckdb.DuckDBPyConnection, pid: int) -> bool:
    return bool(rows(con, f"""SELECT 1 FROM probe_gaps g WHERE g.probes = 'launch' AND g.session_id IN
                                 (SELECT DISTINCT session_id FROM cuda_calls WHERE pid = {int(pid)}) LIMIT 1"""))


def marks_filter(op: str, sig: str) -> str:
    """The WHERE condition that selects a marker's calls (op and signature), for the evidence's SQL."""
    quoted = op.replace("'", "''")
    return f"op = '{quoted}' AND {_SIGNATURE} = '{sig.replace(chr(39), chr(39) * 2)}'"


def find_marker(con: duckdb.DuckDBPyConnection, pid: int) -> Progress | None:
    """The call that marks one iteration of a process, or None (see the module's docstring)."""
    # launches the governor left unprobed for part of a second are not all rows: no launch marks iterations then
    found = rows(con, candidates_sql(pid, launches=not _has_launch_gaps(con, pid)))
    if not found:
        return None
    rhythms: list[list[tuple]] = []
    for r in found:  # ascending count: a rhythm is a run of counts within SAME_COUNT of its first
        if rhythms and int(r[3]) <= int(rhythms[-1][0][3]) * (1 + SAME_COUNT):
            rhythms[-1].append(r)
        else:
            rhythms.append([r])
    same = next((g for g in rhythms if len(g) >= MIN_RHYTHM), rhythms[0])
    op, sig, _kind, n, _first, _last, cover, gap = min(same, key=lambda r: (int(r[2]), int(r[3])))
    where = f"pid = {int(pid)} AND {marks_filter(str(op), str(sig))}"
    return Progress(pid=int(pid), op=str(op), signature=str(sig), marks=int(n), median_gap_ns=int(gap or 0),
                    cover=round(float(cover), 3), label=marker_label(str(op), str(sig)),
                    sql=f"SELECT ts_ns FROM cuda_calls WHERE {where} ORDER BY ts_ns")


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
    return {int(k): (float(it), int(seen)) for k, it, seen in rows(con, per_second_sql(marker, t0))}
