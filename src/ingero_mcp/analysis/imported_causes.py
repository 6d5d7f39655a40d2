"""Ingero's chains checked against the imported rows for their cause, not only their p99.

Ingero builds a chain from what it saw in the last INGERO_WINDOW_NS before it detected the chain (its correlation
engine keeps a 10 s sliding window of host events) and names the cause in `root_cause`:
- "N sched_switch events" and "high CPU utilization" (the host CPU over 90 %; the explanation says "heavy contention
  for CPU resources"), or a noisy neighbour "consuming CPU": the thread that feeds the GPU waited for a CPU. Where that
  thread's scheduler rows are complete (imported_accounting.py), its off-CPU share in each chain's window bounds the
  time it could have waited for a CPU; at CONTRADICT_OFF_SHARE or less the rows contradict the claim. The rows do not
  split off-CPU time into sleeping and waiting for a CPU, so a larger share leaves the claim open, it does not prove it.
- "large host memory allocations": more than 1 GiB of pages allocated in the window. The per-minute page-allocation
  counts of every process (host_aggregates 'mm_page_alloc') over the minutes around the window bound it from above.
Other causes (block I/O, TCP, network, memory pressure) are named as not checked: their rows are a sample kept verbatim.
"""

from __future__ import annotations

import re
from typing import Any

import duckdb

from ingero_mcp.analysis._sql import rows, tidy
from ingero_mcp.analysis.imported_accounting import segments_cte, who
from ingero_mcp.analysis.models import Evidence, ImportedAccounting, ImportedThread

INGERO_WINDOW_NS = 10_000_000_000  # Ingero's correlation window (its DefaultMaxAge)
CONTRADICT_OFF_SHARE = 0.05  # off-CPU this share of the accounted time or less: it did not wait for a CPU to matter
MIN_CHECKED_SHARE = 0.5  # a chain whose window its rows account for less of is not checked
LARGE_ALLOC_BYTES = 1 << 30  # Ingero's threshold for "large host memory allocations"
CPU_CLAIM = r"sched_switch|cpu utilization|consuming cpu"
ALLOC_CLAIM = r"large host memory allocation"
UNCHECKED_CLAIMS = {"block I/O": r"block i/o", "TCP retransmits": r"tcp retransmit", "network I/O": r"network",
                    "memory pressure": r"memory pressure|swap|oom"}


def _claims(group: str, claim: str) -> str:
    """The group's stored chains whose root cause makes the claim."""
    return f"{group} AND regexp_matches(root_cause, '{claim}', 'i')"


def cpu_check_sql(group: str, session_id: int, t: ImportedThread) -> str:
    """Per stored chain of a group (in one session) that claims CPU contention: the feeding thread's accounted time and
    off-CPU time (its counted-but-not-stored off-CPU added to each) in the chain's window, what that says of the claim
    (contradicted, consistent, unchecked), summed over the group, and the switch rows in the checked windows that name
    a preempting task."""
    w, missing = INGERO_WINDOW_NS, int(t.missing_off_cpu_ns or 0)
    in_checked = "EXISTS (SELECT 1 FROM v WHERE v.verdict <> 'unchecked' AND seg.on_ns > v.a AND seg.on_ns <= v.b)"
    share = "off_ns / accounted_ns"
    return tidy(f"""
        WITH {segments_cte(session_id, t.pid, t.tid)},
        c AS (SELECT row_number() OVER (ORDER BY detected_ns) AS n, detected_ns - {w} AS a, detected_ns AS b
              FROM imported_chains WHERE {_claims(group, CPU_CLAIM)} AND session_id = {int(session_id)}),
        w AS (SELECT c.n, any_value(c.a) AS a, any_value(c.b) AS b,
                     coalesce(sum(greatest(0, least(seg.on_ns, c.b) - greatest(seg.from_ns, c.a)))
                              FILTER (WHERE seg.on_ns IS NOT NULL), 0) AS accounted_ns,
                     coalesce(sum(greatest(0, least(seg.on_ns, c.b) - greatest(seg.off_ns, c.a)))
                              FILTER (WHERE seg.on_ns IS NOT NULL), 0) + {missing} AS off_ns
              FROM c LEFT JOIN seg ON seg.on_ns > c.a AND seg.from_ns < c.b GROUP BY c.n),
        v AS (SELECT *, CASE WHEN accounted_ns < {MIN_CHECKED_SHARE} * {w} THEN 'unchecked'
                             WHEN off_ns <= {CONTRADICT_OFF_SHARE} * accounted_ns THEN 'contradicted'
                             ELSE 'consistent' END AS verdict FROM w)
        SELECT count(*) AS chains, count(*) FILTER (WHERE verdict = 'contradicted') AS contradicted,
               count(*) FILTER (WHERE verdict = 'consistent') AS consistent,
               count(*) FILTER (WHERE verdict = 'unchecked') AS unchecked,
               round(100.0 * min({share}) FILTER (WHERE verdict = 'contradicted'), 1) AS contradicted_min_off_pct,
               round(100.0 * max({share}) FILTER (WHERE verdict = 'contradicted'), 1) AS contradicted_max_off_pct,
               round(100.0 * min({share}) FILTER (WHERE verdict = 'consistent'), 1) AS consistent_min_off_pct,
               round(100.0 * max({share}) FILTER (WHERE verdict = 'consistent'), 1) AS consistent_max_off_pct,
               max(b) AS latest_ns, arg_max(verdict, b) AS latest_verdict,
               round(100.0 * arg_max(off_ns / nullif(accounted_ns, 0), b), 1) AS latest_off_pct,
               round(arg_max(accounted_ns, b) / 1e9, 1) AS latest_accounted_s,
               (SELECT count(*) FROM seg WHERE {in_checked}) AS rows_in_windows,
               (SELECT count(*) FROM seg WHERE seg.preemptor_pid IS NOT NULL AND {in_checked}) AS preempted_rows,
               (SELECT arg_max(preemptor_pid, k) FROM (SELECT preemptor_pid, count(*) AS k FROM seg
                WHERE seg.preemptor_pid IS NOT NULL AND {in_checked} GROUP BY preemptor_pid)) AS top_preemptor
        FROM v
    """)


def alloc_check_sql(group: str, session_id: int) -> str:
    """Per stored chain of a group (in one session) that claims large host memory allocations: the pages every process
    allocated in the minutes overlapping its window (an upper bound of what Ingero counted), and the top allocator."""
    w, s = INGERO_WINDOW_NS, int(session_id)
    overlap = "h.bucket_start_ns <= c.b AND h.bucket_start_ns + h.bucket_ns > c.a"
    return tidy(f"""
        WITH c AS (SELECT row_number() OVER (ORDER BY detected_ns) AS n, detected_ns - {w} AS a, detected_ns AS b
                   FROM imported_chains WHERE {_claims(group, ALLOC_CLAIM)} AND session_id = {s}),
        v AS (SELECT c.n, (SELECT sum(h.sum_bytes) FROM host_aggregates h
                           WHERE h.session_id = {s} AND h.op = 'mm_page_alloc' AND {overlap}) AS bytes FROM c),
        p AS (SELECT h.pid, sum(h.sum_bytes) AS bytes FROM host_aggregates h
              WHERE h.session_id = {s} AND h.op = 'mm_page_alloc' AND EXISTS (SELECT 1 FROM c WHERE {overlap})
              GROUP BY h.pid)
        SELECT count(*) AS chains, count(*) FILTER (WHERE bytes < {LARGE_ALLOC_BYTES}) AS contradicted,
               count(*) FILTER (WHERE bytes >= {LARGE_ALLOC_BYTES}) AS consistent,
               count(*) FILTER (WHERE bytes IS NULL) AS unchecked, round(max(bytes) / 1e9, 2) AS max_gb,
               (SELECT arg_max(pid, bytes) FROM p) AS top_pid,
               round(100.0 * (SELECT max(bytes) FROM p) / nullif((SELECT sum(bytes) FROM p), 0), 1) AS top_pct
        FROM v
    """)


def _one_row(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, Any]:
    cur = con.execute(sql)
    return dict(zip([d[0] for d in cur.description], cur.fetchall()[0], strict=True))


def _feeder(imp: ImportedAccounting | None, session_id: int) -> ImportedThread | None:
    """The accountable feeding thread of a session, if there is one."""
    return next((t for t in (imp.feeders if imp else []) if t.session_id == session_id and t.accountable), None)


def _why_unchecked(imp: ImportedAccounting | None, session_id: int) -> str:
    feeders = [t for t in (imp.feeders if imp else []) if t.session_id == session_id]
    if not feeders:
        return "no thread that fed the GPU is known in its session"
    return f"the scheduler rows of {who(feeders[0])}, which fed the GPU, are not complete ({feeders[0].why_not})"


def _cpu(con: duckdb.DuckDBPyConnection, group: str, sid: int, n: int, t: ImportedThread, last_ns: int | None,
         names: dict[int, str]) -> tuple[str, list[Evidence]]:
    """What the feeding thread's rows say of the CPU contention a group's chains in one session claim."""
    sql = cpu_check_sql(group, sid, t)
    got = _one_row(con, sql)
    parts, evidence = [], []
    if got["contradicted"]:
        preempt = (f"none of its {got['rows_in_windows']:,} switch rows there names another task in arg1"
                   if not got["preempted_rows"] else
                   f"{got['preempted_rows']} of {got['rows_in_windows']} switch rows name another task, most often "
                   f"{names.get(int(got['top_preemptor']), '?')}[{got['top_preemptor']}]")
        parts.append(f"contradicted by the rows in {got['contradicted']}: {who(t)} was off-CPU only "
                     f"{got['contradicted_min_off_pct']}-{got['contradicted_max_off_pct']}% of the time its rows "
                     f"account for in their 10 s windows, so it waited for a CPU at most that long ({preempt})")
        evidence += [Evidence(name="chains claiming CPU contention that the rows contradict",
                              value=int(got["contradicted"]), unit="chains", sql=f"SELECT contradicted FROM ({sql})"),
                     Evidence(name="the feeding thread's largest off-CPU share in their windows",
                              value=float(got["contradicted_max_off_pct"]), unit="%",
                              sql=f"SELECT contradicted_max_off_pct FROM ({sql})")]
    if got["consistent"]:
        parts.append(f"left open in {got['consistent']} (off-CPU {got['consistent_min_off_pct']}-"
                     f"{got['consistent_max_off_pct']}%: asleep or waiting for a CPU, not recorded which)")
        evidence.append(Evidence(name="chains claiming CPU contention the rows leave open",
                                 value=int(got["consistent"]), unit="chains", sql=f"SELECT consistent FROM ({sql})"))
    if got["unchecked"]:
        parts.append(f"not checked in {got['unchecked']} (its rows account for under half of their window)")
    said = {"contradicted": "contradicted", "consistent": "left open"}.get(str(got["latest_verdict"]))
    if n > 1 and got["latest_ns"] == last_ns:  # the chain shown is the group's latest
        parts.append(f"the one shown: {said} (off-CPU {got['latest_off_pct']}% of {got['latest_accounted_s']} s "
                     "accounted)" if said else
                     f"the one shown: not checked ({got['latest_accounted_s']} s of its window accounted)")
    return f"CPU contention ({n} stored): " + "; ".join(parts), evidence


def _alloc(con: duckdb.DuckDBPyConnection, group: str, sid: int, n: int,
           names: dict[int, str]) -> tuple[list[str], list[Evidence]]:
    """What the per-minute page counts say of the large allocations a group's chains in one session claim."""
    sql = alloc_check_sql(group, sid)
    got = _one_row(con, sql)
    head = f"large host memory allocations ({n} stored)"
    texts, evidence = [], []
    if got["contradicted"]:
        texts.append(f"{head}: contradicted in {got['contradicted']}, every process together allocated under 1 GiB "
                     "in the minutes around their windows")
        evidence.append(Evidence(name="chains claiming large allocations that the page counts contradict",
                                 value=int(got["contradicted"]), unit="chains",
                                 sql=f"SELECT contradicted FROM ({sql})"))
    if got["consistent"]:
        top = (f", {got['top_pct']}% by {names.get(int(got['top_pid']), '?')}[{got['top_pid']}]"
               if got["top_pid"] is not None else "")
        texts.append(f"{head}: consistent in {got['consistent']} (up to {got['max_gb']} GB allocated in the minutes "
                     f"around their windows{top})")
        evidence.append(Evidence(name="pages allocated in the minutes around the windows, at most",
                                 value=float(got["max_gb"]), unit="GB", sql=f"SELECT max_gb FROM ({sql})"))
    if got["unchecked"]:
        texts.append(f"{head}: not checked in {got['unchecked']} (no page counts)")
    return texts, evidence


def cause_check(con: duckdb.DuckDBPyConnection, group: str, imp: ImportedAccounting | None, names: dict[int, str],
                last_ns: int | None = None) -> tuple[str | None, list[Evidence], bool]:
    """What the rows say of the causes a group of Ingero's chains claims: (text, evidence, contradicted anywhere).
    `group` selects the group's stored chains in imported_chains (origin, op, severity, window); `last_ns` is when
    the one shown (its latest) was detected."""
    texts: list[str] = []
    evidence: list[Evidence] = []
    per_session = "SELECT session_id, count(*) FROM imported_chains WHERE {} GROUP BY session_id ORDER BY session_id"
    for sid, n in rows(con, per_session.format(_claims(group, CPU_CLAIM))):
        t = _feeder(imp, int(sid))
        if t is None:
            texts.append(f"CPU contention ({n} stored): not checked, {_why_unchecked(imp, int(sid))}")
            continue
        text, found = _cpu(con, group, int(sid), int(n), t, last_ns, names)
        texts.append(text)
        evidence += found
    for sid, n in rows(con, per_session.format(_claims(group, ALLOC_CLAIM))):
        said, found = _alloc(con, group, int(sid), int(n), names)
        texts += said
        evidence += found
    causes = " ".join(r[0] or "" for r in rows(con, f"SELECT DISTINCT root_cause FROM imported_chains WHERE {group}"))
    unchecked = [kind for kind, pattern in UNCHECKED_CLAIMS.items() if re.search(pattern, causes, re.I)]
    if unchecked:
        texts.append(f"{', '.join(unchecked)}: not checked (those rows are a sample kept verbatim, not analysed)")
    contradicted = any("contradict" in e.name for e in evidence)
    return ("; ".join(texts) if texts else None), evidence, contradicted
