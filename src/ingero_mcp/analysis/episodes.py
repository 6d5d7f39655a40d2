"""Short slow episodes: the seconds whose progress fell outside the phases, read again in sub-second bins, and the
runs of low bins that cost something; repeated (or one big) they make a 'recurrent' phase, and those in which the
process's launches and copies went on at their healthy rate are its other work ('other-work'), not stalls. Slow phases
that recur alike join that phase as its longer episodes (`repeated`): one stall said once, not once per occurrence.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.models import Phase, Progress, TimeWindow
from ingero_mcp.analysis.progress import SECOND_NS, _has_launch_gaps, per_bin_sql

HEALTHY_FRACTION = 0.8  # a second is healthy at this fraction of the reference rate or more
# Short stalls (under MIN_PHASE_S): the seconds that fell below the healthy rate outside the phases are read again in
# sub-second bins (from cuda_calls, only there); runs of bins at 1/SLOW_FACTOR of the healthy rate or less are episodes.
BINS_NS = (250_000_000, 500_000_000, SECOND_NS)  # the finest bin holding MIN_BIN_CALLS at the healthy rate is used
MIN_BIN_CALLS = 20
SCAN_FRACTION = 0.9  # seconds under this fraction of the reference rate are read in bins (cheap: only those seconds)
MIN_EPISODE_LOSS_S = 0.1  # an episode must cost this much (its length less its work at the healthy rate)
MIN_EPISODES = 2  # episodes that make a recurrent stall ...
BIG_EPISODE_S = 0.5  # ... or one that cost this much
# Slow phases (MIN_PHASE_S or longer) that recur alike are one stall too: MIN_REPEATS or more, their lengths within
# ALIKE of each other and so the time from one's start to the next's (a checkpoint every ~6 s, 2 s each, is one story)
MIN_REPEATS = 3
ALIKE = 2.0
WORK_OPS = "(contains(op, 'aunch') OR contains(op, 'emcpy') OR contains(op, 'emset'))"  # thread_seconds.work_calls



def stall_bins_sql(pid: int, ks: list[int], t0: int, bin_ns: int, base_bin: float,
                   marker: Progress | None = None) -> str:
    """A process's progress per bin over the seconds ks (bins without progress included): iterations where a marker
    counts them (progress.py), else work calls (bins the launch probes were detached in left out: their count is
    unknown); 'low' under SCAN_FRACTION of the healthy rate per bin (base_bin), 'deep' under HEALTHY_FRACTION of it."""
    per = SECOND_NS // bin_ns
    lo, hi = t0 + min(ks) * SECOND_NS, t0 + (max(ks) + 1) * SECOND_NS
    if marker is not None:
        counted = f"SELECT bin, iterations AS n FROM ({per_bin_sql(marker, t0, lo, hi, bin_ns)})"
        gaps = "TRUE"
    else:
        counted = (f"SELECT (ts_ns - {t0}) // {bin_ns} AS bin, count(*) AS n FROM cuda_calls "
                   f"WHERE pid = {int(pid)} AND ts_ns >= {lo} AND ts_ns < {hi} AND {WORK_OPS} GROUP BY ALL")
        gaps = (f"NOT EXISTS (SELECT 1 FROM probe_gaps g WHERE g.probes = 'launch' "
                f"AND g.start_ns < {t0} + (bin + 1) * {bin_ns} AND g.end_ns > {t0} + bin * {bin_ns})")
    return " ".join(f"""
        WITH bins AS (SELECT unnest(range(k * {per}, (k + 1) * {per})) AS bin
                      FROM (SELECT unnest([{', '.join(map(str, ks))}]) AS k)),
        n AS ({counted})
        SELECT bin, coalesce(n.n, 0) AS n, coalesce(n.n, 0) < {SCAN_FRACTION} * {base_bin} AS low,
               coalesce(n.n, 0) < {HEALTHY_FRACTION} * {base_bin} AS deep
        FROM bins LEFT JOIN n USING (bin)
        WHERE {gaps}
        ORDER BY bin""".split())


def episodes_sql(pid: int, ks: list[int], t0: int, bin_ns: int, base_bin: float, marker: Progress | None = None) -> str:
    """The short slow episodes: runs of low bins (stall_bins_sql; one bin between two low ones is bridged) holding a
    deep one, under HEALTHY_FRACTION of the healthy rate over their length and costing at least MIN_EPISODE_LOSS_S
    (jitter is neither), with their start (seconds since the trace start), length and
    loss: the length less the work done in it at the healthy rate."""
    bin_s = bin_ns / SECOND_NS
    return " ".join(f"""
        WITH b AS ({stall_bins_sql(pid, ks, t0, bin_ns, base_bin, marker)}),
        l AS (SELECT bin, deep, bin - lag(bin) OVER (ORDER BY bin) AS step FROM b WHERE low),
        g AS (SELECT bin, deep, sum(CASE WHEN step IS NULL OR step > 2 THEN 1 ELSE 0 END) OVER (ORDER BY bin) AS g
              FROM l),
        e AS (SELECT g, min(bin) AS first, max(bin) AS last FROM g GROUP BY g HAVING bool_or(deep))
        SELECT e.first * {bin_s} AS start_s, (e.last - e.first + 1) * {bin_s} AS length_s,
               (e.last - e.first + 1) * {bin_s} - sum(b.n) / {base_bin} * {bin_s} AS lost_s
        FROM e JOIN b ON b.bin BETWEEN e.first AND e.last GROUP BY e.g, e.first, e.last
        HAVING lost_s >= {MIN_EPISODE_LOSS_S} AND sum(b.n) < {HEALTHY_FRACTION} * {base_bin} * (e.last - e.first + 1)
        ORDER BY start_s""".split())


def other_work_sql(episodes: str, pid: int, t0: int, ks: list[int], bin_ns: int, healthy: list[int]) -> str:
    """The episodes (episodes_sql's rows over the seconds ks, in bins of bin_ns) with the process's launches+copies
    per second in each (work_rate) and in its healthy seconds (base_work_rate, from thread_seconds): iterations that
    stopped while the work went on are another phase of the job."""
    lo, hi = t0 + min(ks) * SECOND_NS, t0 + (max(ks) + 1) * SECOND_NS
    bin_s = bin_ns / SECOND_NS
    return " ".join(f"""
        WITH e AS ({episodes}),
        w AS (SELECT (ts_ns - {t0}) // {bin_ns} AS bin, count(*) AS n FROM cuda_calls
              WHERE pid = {int(pid)} AND ts_ns >= {lo} AND ts_ns < {hi} AND {WORK_OPS} GROUP BY ALL),
        base AS (SELECT sum(work_calls) / {len(set(healthy))} AS r FROM thread_seconds
                 WHERE pid = {int(pid)} AND k IN ({", ".join(str(int(k)) for k in sorted(set(healthy)))}))
        SELECT e.start_s, e.length_s, e.lost_s,
               (SELECT coalesce(sum(n), 0) FROM w WHERE w.bin >= round(e.start_s / {bin_s})
                                                    AND w.bin < round((e.start_s + e.length_s) / {bin_s}))
                   / e.length_s AS work_rate,
               (SELECT r FROM base) AS base_work_rate
        FROM e ORDER BY e.start_s""".split())


def recurrent(con: duckdb.DuckDBPyConnection, pid: int, t0: int, got: list[tuple[int, int, float]], reference: float,
               base_rate: float, phases: list[Phase], healthy: list[int],
               marker: Progress | None = None) -> list[Phase]:
    """Short slow episodes outside the phases: recurrent (MIN_EPISODES or more) or one big (BIG_EPISODE_S lost). Where
    a marker counts iterations, episodes in which the process kept up its healthy rate of launches and copies are
    its other work (an evaluation pass, another loop: kind 'other-work'), not stalls.

    Only the seconds whose rate fell under SCAN_FRACTION of the reference, between the first and the last healthy
    second (a start-up or a wind-down is not a stall) and outside the slow phases, are read in bins; the bin is the
    finest that holds MIN_BIN_CALLS at the healthy rate, so that a bin's count is not mere quantisation of the job's
    steps."""
    if not healthy or base_rate <= 0:
        return []
    # a slow phase's seconds and the one on each side of it (its ramps) are the phase's, not episodes of their own
    taken = [TimeWindow(start_ns=p.window.start_ns - SECOND_NS, end_ns=p.window.end_ns + SECOND_NS)
             for p in phases if p.kind == "slow"]
    first, last = min(healthy), max(healthy)
    ks = [k for k, start, n in got if n < SCAN_FRACTION * reference and first < k < last
          and not any(w.start_ns <= start < w.end_ns for w in taken)]
    if not ks:
        return []
    # iterations are spread evenly over their time: a bin holds its share of one however short it is
    min_per_bin = 1.0 if marker is not None else MIN_BIN_CALLS
    bin_ns = next((b for b in BINS_NS if base_rate * b / SECOND_NS >= min_per_bin), SECOND_NS)
    base_bin = round(base_rate * bin_ns / SECOND_NS, 3)
    sql = episodes_sql(pid, ks, t0, bin_ns, base_bin, marker)
    out: list[Phase] = []
    if marker is not None and not _has_launch_gaps(con, pid):  # every launch counted: the work rate is known
        both = other_work_sql(sql, pid, t0, ks, bin_ns, healthy)
        every = shared_rows(con, both)  # one query; the SQL each part is said with filters the same rows
        other = f"SELECT * FROM ({both}) WHERE work_rate >= {HEALTHY_FRACTION} * base_work_rate"
        got_other = [r for r in every if r[4] is not None and float(r[3]) >= HEALTHY_FRACTION * float(r[4])]
        if got_other:
            wins = [TimeWindow(start_ns=t0 + round(float(r[0]) * SECOND_NS),
                               end_ns=t0 + round((float(r[0]) + float(r[1])) * SECOND_NS)) for r in got_other]
            out.append(Phase(pid=pid, kind="other-work", window=TimeWindow(start_ns=wins[0].start_ns,
                                                                            end_ns=wins[-1].end_ns),
                             work_rate=round(sum(float(r[3]) for r in got_other) / len(got_other), 3),
                             unit="launches+copies/s", episodes=wins,
                             bin_ns=bin_ns, lost_s=round(sum(float(r[2]) for r in got_other), 3), sql=other))
            sql = (f"SELECT start_s, length_s, lost_s FROM ({both}) "
                   f"WHERE work_rate < {HEALTHY_FRACTION} * base_work_rate OR base_work_rate IS NULL ORDER BY start_s")
            every = [r for r in every if r not in got_other]
        eps = [(float(r[0]), float(r[1]), float(r[2])) for r in every]
    else:
        eps = [(float(a), float(d), float(lost)) for a, d, lost in shared_rows(con, sql)]
    if not eps or (len(eps) < MIN_EPISODES and max(e[2] for e in eps) < BIG_EPISODE_S):
        return out
    windows = [TimeWindow(start_ns=t0 + round(a * SECOND_NS), end_ns=t0 + round((a + d) * SECOND_NS))
               for a, d, _ in eps]
    length = sum(d for _, d, _ in eps)
    lost = sum(lost for _, _, lost in eps)
    rate = base_rate * (length - lost) / length if length else 0.0
    return out + [Phase(pid=pid, kind="recurrent",
                        window=TimeWindow(start_ns=windows[0].start_ns, end_ns=windows[-1].end_ns),
                        work_rate=round(rate, 3), unit="iterations/s" if marker is not None else "launches+copies/s",
                        slowdown=round(base_rate / rate, 2) if rate > 0 else None, episodes=windows,
                        bin_ns=bin_ns, lost_s=round(lost, 3), sql=sql,
                        period_s=round((eps[-1][0] - eps[0][0]) / (len(eps) - 1), 2) if len(eps) > 2 else None)]


STOP_SHARE = 0.5  # an episode whose longest pause between two iterations fills this share of it was a stop


def pauses_sql(marker: Progress, windows: list[TimeWindow]) -> str:
    """Per episode (its index, in order), the longest pause between two consecutive iterations that overlaps it: a
    stop's own length, which the episode's bins round up to whole bins (natural_subprocess_eval: evaluations of
    1.07-1.42 s by the job's clock, in windows of 2 s)."""
    spans = ", ".join(f"({i}, {int(w.start_ns)}, {int(w.end_ns)})" for i, w in enumerate(windows))
    return " ".join(f"""
        WITH m AS (SELECT ts_ns AS a, lead(ts_ns) OVER (ORDER BY ts_ns) AS b FROM ({marker.sql})),
        w(i, lo, hi) AS (VALUES {spans})
        SELECT w.i, max(m.b - m.a)::BIGINT AS pause_ns FROM w JOIN m ON m.b > w.lo AND m.a < w.hi
        GROUP BY w.i ORDER BY w.i""".split())


def stretches_sql(pid: int, spans: list[tuple[int, int]], t0: int, base_rate: float,
                  marker: Progress | None = None) -> str:
    """Slow phases as episodes: each (first second, last second) with its start (seconds since the trace start), length
    and loss (its length less its work at the healthy rate base_rate), from its per-second progress (stall_bins_sql in
    whole seconds: iterations where a marker counts them, else work calls)."""
    ks = sorted({k for a, b in spans for k in range(a, b + 1)})
    listed = ", ".join(f"({int(a)}, {int(b)})" for a, b in spans)
    return " ".join(f"""
        WITH b AS ({stall_bins_sql(pid, ks, t0, SECOND_NS, round(base_rate, 3), marker)}),
        e AS (SELECT * FROM (VALUES {listed}) v(first, last))
        SELECT e.first * 1.0 AS start_s, (e.last - e.first + 1) * 1.0 AS length_s,
               (e.last - e.first + 1) - sum(b.n) / {round(base_rate, 3)} AS lost_s
        FROM e JOIN b ON b.bin BETWEEN e.first AND e.last GROUP BY e.first, e.last
        ORDER BY start_s""".split())


def _alike(values: list[float]) -> bool:
    return bool(values) and min(values) > 0 and max(values) <= ALIKE * min(values)


def repeated(con: duckdb.DuckDBPyConnection, pid: int, t0: int, phases: list[Phase], base_rate: float,
             steady_ns: int | None, marker: Progress | None = None) -> list[Phase]:
    """The phases with slow phases that recur alike (MIN_REPEATS or more after the start-up, their lengths and the
    time between their starts each within ALIKE of the others) made one recurrent phase, with the short episodes of
    the process's recurrent phase, if any: the same stall every few seconds is one story, its time summed, not
    MIN_REPEATS findings each too small to count. Other phases are returned as they were."""
    slow = [p for p in phases if p.kind == "slow" and p.pid == pid
            and (steady_ns is None or p.window.start_ns >= steady_ns)]
    lengths = [p.window.duration_ns / SECOND_NS for p in slow]
    gaps = [(b.window.start_ns - a.window.start_ns) / SECOND_NS for a, b in zip(slow, slow[1:])]
    if len(slow) < MIN_REPEATS or base_rate <= 0 or not _alike(lengths) or not _alike(gaps):
        return phases
    spans = [((p.window.start_ns - t0) // SECOND_NS, (p.window.end_ns - t0) // SECOND_NS - 1) for p in slow]
    long_sql = stretches_sql(pid, spans, t0, base_rate, marker)
    short = next((p for p in phases if p.kind == "recurrent" and p.pid == pid), None)
    sql = long_sql if short is None or not short.sql else (
        f"SELECT * FROM (SELECT start_s, length_s, lost_s FROM ({long_sql}) UNION ALL "
        f"SELECT start_s, length_s, lost_s FROM ({short.sql})) ORDER BY start_s")
    eps = [(float(a), float(d), float(lost)) for a, d, lost in shared_rows(con, sql)]
    if len(eps) < MIN_REPEATS:
        return phases
    windows = [TimeWindow(start_ns=t0 + round(a * SECOND_NS), end_ns=t0 + round((a + d) * SECOND_NS))
               for a, d, _ in eps]
    length = sum(d for _, d, _ in eps)
    lost = sum(lost for _, _, lost in eps)
    rate = max(base_rate * (length - lost) / length, 0.0)
    merged = Phase(pid=pid, kind="recurrent", window=TimeWindow(start_ns=windows[0].start_ns,
                                                                end_ns=windows[-1].end_ns),
                   work_rate=round(rate, 3), unit=slow[0].unit,
                   slowdown=round(base_rate / rate, 2) if rate > 0 else None, episodes=windows,
                   bin_ns=short.bin_ns if short is not None else SECOND_NS, lost_s=round(lost, 3), sql=sql,
                   period_s=round((eps[-1][0] - eps[0][0]) / (len(eps) - 1), 2), stretches=[p.window for p in slow])
    kept = [p for p in phases if p not in slow and p is not short]
    return sorted(kept + [merged], key=lambda p: p.window.start_ns)
