"""What tracing cost the job (schema v4): the collector's estimate of the time its probes added, per traced process and
for the session, the per-hit costs it was made from, and how the launches were recorded (entry-only, the share of the
time the launch probes were attached). Stores written before v4 have none of this (empty tables): None.

Every number is a query over the store: `sql` beside each carries it (tracing_cost, probe_costs, probe_gaps).
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb

from ingero_mcp.analysis._sql import tidy
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.launches import has_launch_gaps, launch_coverage_sql
from ingero_mcp.analysis.models import (
    BpfProgramTime,
    ProbeCost,
    ProcessTracingCost,
    TracingCost,
)
from ingero_mcp.sanitize import clean


SCHED_PROBE = "sched_interval"  # probe_costs.probe: the scheduler tracepoints' added time per traced off-CPU interval
# probe_costs.probe: the page-allocation tracepoint's added time per page a traced thread allocates
PAGE_PROBE = "page_alloc"
SAMPLE_PROBE = "stack_sample"  # probe_costs.probe: the on-CPU stack sampler's kernel time per sample (schema v6)
# what each probe_costs row is per
UNITS = {SCHED_PROBE: "per off-CPU interval", PAGE_PROBE: "per page allocated", SAMPLE_PROBE: "per stack sample"}


def process_cost_sql(pid: int | None = None) -> str:
    """Per traced process: the estimated added time, the span its periods cover, hits, and the launch coverage over
    that span (1 - its overlap with probe_gaps / the span); then its off-CPU intervals x the scheduler tracepoints'
    cost per interval, and its page allocations (host_aggregates) x the page-allocation tracepoint's cost per page
    (each NULL where that cost was not measured)."""
    only = f"WHERE pid = {int(pid)}" if pid is not None else ""
    return tidy(f"""
        WITH t AS (SELECT session_id, pid, sum(added_ns)::BIGINT AS added_ns, min(start_ns) AS start_ns,
                          max(end_ns) AS end_ns, sum(entry_hits)::BIGINT AS entry_hits,
                          sum(entry_return_hits)::BIGINT AS entry_return_hits
                   FROM tracing_cost {only} GROUP BY session_id, pid),
             o AS (SELECT t.session_id, t.pid, (SELECT count(*) FROM sched_intervals s
                                                 WHERE s.session_id = t.session_id AND s.pid = t.pid)
                              AS off_cpu_intervals,
                          (SELECT coalesce(sum(h.count), 0) FROM host_aggregates h
                           WHERE h.session_id = t.session_id AND h.pid = t.pid AND h.op = 'mm_page_alloc')::BIGINT
                              AS page_allocs
                   FROM t)
        SELECT t.session_id, t.pid, t.added_ns, t.end_ns - t.start_ns AS wall_ns,
               round(t.added_ns / nullif(t.end_ns - t.start_ns, 0), 6) AS share, t.entry_hits, t.entry_return_hits,
               o.off_cpu_intervals,
               round(1 - coalesce((SELECT sum(least(g.end_ns, t.end_ns) - greatest(g.start_ns, t.start_ns))
                                   FROM probe_gaps g WHERE g.session_id = t.session_id AND g.probes = 'launch'
                                     AND g.start_ns < t.end_ns AND g.end_ns > t.start_ns), 0)
                       / nullif(t.end_ns - t.start_ns, 0), 4) AS launch_coverage,
               round(o.off_cpu_intervals * (SELECT max(p.cost_ns) FROM probe_costs p
                                            WHERE p.session_id = t.session_id AND p.probe = '{SCHED_PROBE}'))::BIGINT
                   AS sched_added_ns,
               o.page_allocs,
               round(o.page_allocs * (SELECT max(p.cost_ns) FROM probe_costs p
                                      WHERE p.session_id = t.session_id AND p.probe = '{PAGE_PROBE}'))::BIGINT
                   AS page_added_ns
        FROM t JOIN o USING (session_id, pid) ORDER BY t.added_ns DESC, t.pid""")


def session_cost_sql() -> str:
    """For the sessions: the estimated added time of every traced process together, and the sessions' wall time."""
    return tidy("""
        SELECT (SELECT sum(added_ns) FROM tracing_cost)::BIGINT AS added_ns,
               (SELECT sum(stopped_ns - started_ns) FROM sessions WHERE stopped_ns > started_ns)::BIGINT AS wall_ns,
               round((SELECT sum(added_ns) FROM tracing_cost)
                     / nullif((SELECT sum(stopped_ns - started_ns) FROM sessions WHERE stopped_ns > started_ns), 0), 6)
                   AS share""")


def tracepoint_cost_sql() -> str:
    """For the sessions: every traced thread's off-CPU intervals and the scheduler tracepoints' estimated added time
    (intervals x the session's cost per interval), the traced processes' page allocations and the page-allocation
    tracepoint's (allocations x cost per page), the traced threads' on-CPU stack samples and the sampler's (samples x
    cost per sample), each NULL if a session with such events has no measured cost (unknown, not zero); and with the
    CUDA probes' estimate, the whole estimate's share of the sessions' wall time (NULL when a part is unknown)."""
    return tidy(f"""
        WITH per AS (SELECT s.session_id,
                            (SELECT count(*) FROM sched_intervals i WHERE i.session_id = s.session_id) AS intervals,
                            (SELECT max(p.cost_ns) FROM probe_costs p
                             WHERE p.session_id = s.session_id AND p.probe = '{SCHED_PROBE}') AS cost_ns,
                            (SELECT coalesce(sum(h.count), 0) FROM host_aggregates h
                             WHERE h.session_id = s.session_id AND h.op = 'mm_page_alloc'
                               AND h.pid IN (SELECT r.pid FROM processes r
                                             WHERE r.session_id = s.session_id AND r.traced))
                                AS pages,
                            (SELECT max(p.cost_ns) FROM probe_costs p
                             WHERE p.session_id = s.session_id AND p.probe = '{PAGE_PROBE}') AS page_cost_ns,
                            (SELECT count(*) FROM stack_samples x WHERE x.session_id = s.session_id) AS samples,
                            (SELECT max(p.cost_ns) FROM probe_costs p
                             WHERE p.session_id = s.session_id AND p.probe = '{SAMPLE_PROBE}') AS sample_cost_ns
                     FROM sessions s),
             est AS (SELECT sum(intervals)::BIGINT AS intervals,
                            CASE WHEN count(*) FILTER (WHERE intervals > 0 AND cost_ns IS NULL) = 0
                                 THEN coalesce(round(sum(intervals * cost_ns)), 0)::BIGINT END AS sched_added_ns,
                            sum(pages)::BIGINT AS page_allocs,
                            CASE WHEN count(*) FILTER (WHERE pages > 0 AND page_cost_ns IS NULL) = 0
                                 THEN coalesce(round(sum(pages * page_cost_ns)), 0)::BIGINT END AS page_added_ns,
                            sum(samples)::BIGINT AS samples,
                            CASE WHEN count(*) FILTER (WHERE samples > 0 AND sample_cost_ns IS NULL) = 0
                                 THEN coalesce(round(sum(samples * sample_cost_ns)), 0)::BIGINT END AS sample_added_ns
                     FROM per)
        SELECT est.intervals, est.sched_added_ns, est.page_allocs, est.page_added_ns, est.samples, est.sample_added_ns,
               round((coalesce((SELECT sum(added_ns) FROM tracing_cost), 0) + est.sched_added_ns + est.page_added_ns
                      + est.sample_added_ns)
                     / nullif((SELECT sum(stopped_ns - started_ns) FROM sessions WHERE stopped_ns > started_ns), 0), 6)
                   AS total_share
        FROM est""")


PROBE_COSTS_SQL = "SELECT probe, cost_ns, method FROM probe_costs ORDER BY probe, session_id"
# notes that are not one JSON document (a tool appended to them) give NULL: unknown, not an error
COLLECTOR_CPU_SQL = ("SELECT sum(TRY_CAST(json_extract_string(j, '$.collector_cpu_s') AS DOUBLE)), "
                     "sum(TRY_CAST(json_extract_string(j, '$.collector_cpu_recording_s') AS DOUBLE)) "
                     "FROM (SELECT CASE WHEN json_valid(notes) THEN notes END AS j FROM sessions)")
# each eBPF program's runs and kernel-measured run time, all sessions (notes.bpf_run_stats: written only while
# kernel.bpf_stats_enabled=1; no rows when never measured)
BPF_PROGRAMS_SQL = tidy("""
    SELECT e.key AS program, sum(TRY_CAST(json_extract_string(e.value, '$.run_cnt') AS BIGINT)) AS runs,
           sum(TRY_CAST(json_extract_string(e.value, '$.run_time_ns') AS BIGINT)) AS run_time_ns
    FROM (SELECT CASE WHEN json_valid(notes) THEN notes END AS j FROM sessions) s, json_each(s.j, '$.bpf_run_stats') e
    WHERE e.key IS NOT NULL GROUP BY e.key ORDER BY run_time_ns DESC, program""")
ENTRY_ONLY_SQL = "SELECT count(*) FROM cuda_calls WHERE duration_ns IS NULL AND contains(op, 'aunch')"


def tracing_cost(con: duckdb.DuckDBPyConnection) -> TracingCost | None:
    """The store's tracing cost and launch recording, or None where it has none (stores before v4)."""
    costs = [ProbeCost(probe=p, cost_ns=None if c is None else float(c), method=m)
             for p, c, m in shared_rows(con, PROBE_COSTS_SQL)]
    per = shared_rows(con, process_cost_sql())
    entry_only = int(shared_rows(con, ENTRY_ONLY_SQL)[0][0])
    has_gaps = has_launch_gaps(con)
    if not costs and not per and not entry_only and not has_gaps:
        return None
    names = {int(p): c for p, c in shared_rows(con, "SELECT pid, comm FROM processes WHERE comm IS NOT NULL")}
    added, wall, share = shared_rows(con, session_cost_sql())[0]
    tracepoints = shared_rows(con, tracepoint_cost_sql())[0]
    intervals, sched_added, pages, page_added, samples, sample_added, total_share = tracepoints
    coverage = shared_rows(con, launch_coverage_sql())[0][0] if has_gaps else 1.0
    collector_cpu, collector_cpu_recording = shared_rows(con, COLLECTOR_CPU_SQL)[0]
    programs = [BpfProgramTime(program=str(p), runs=int(n or 0), run_time_ns=int(t or 0))
                for p, n, t in shared_rows(con, BPF_PROGRAMS_SQL)]
    return TracingCost(
        added_ns=None if added is None else int(added), wall_ns=None if wall is None else int(wall),
        share=None if share is None else float(share),
        launch_coverage=None if coverage is None else round(float(coverage), 4),
        entry_only_launches=entry_only, probe_costs=costs,
        processes=[ProcessTracingCost(pid=int(pid), comm=names.get(int(pid)), added_ns=int(a or 0), wall_ns=int(w or 0),
                                      share=None if s is None else float(s), entry_hits=int(e or 0),
                                      entry_return_hits=int(er or 0), off_cpu_intervals=int(oc or 0),
                                      launch_coverage=None if lc is None else float(lc),
                                      sched_added_ns=None if sa is None else int(sa), page_allocs=int(pa or 0),
                                      page_added_ns=None if pga is None else int(pga), sql=process_cost_sql(int(pid)))
                   for _sid, pid, a, w, s, e, er, oc, lc, sa, pa, pga in per],
        off_cpu_intervals=int(intervals or 0), sched_added_ns=None if sched_added is None else int(sched_added),
        page_allocs=int(pages or 0), page_added_ns=None if page_added is None else int(page_added),
        samples=int(samples or 0), sample_added_ns=None if sample_added is None or not samples else int(sample_added),
        total_share=None if total_share is None else float(total_share),
        collector_cpu_s=None if collector_cpu is None else round(float(collector_cpu), 3),
        collector_cpu_recording_s=None if collector_cpu_recording is None else round(float(collector_cpu_recording), 3),
        bpf_programs=programs or None,
        sql={"session": session_cost_sql(), "tracepoints": tracepoint_cost_sql(),
             "launch_coverage": launch_coverage_sql(), "probe_costs": PROBE_COSTS_SQL,
             "entry_only_launches": ENTRY_ONLY_SQL, "collector_cpu_s": COLLECTOR_CPU_SQL,
             "bpf_programs": BPF_PROGRAMS_SQL},
    )


def cost_lines(t: TracingCost | None, text: Callable[[str | None], str] = lambda v: v or "?") -> list[str]:
    """The tracing cost as the report prints it (text, MCP text, HTML): nothing for stores before v4. `text` renders
    stored strings (a process's name is traced data: the MCP quotes it)."""
    if t is None:
        return []
    def pct(v: float | None) -> str:
        return "?" if v is None else f"{100 * v:.2f}%"
    per_hit = "; ".join(f"{clean(c.probe, 60)} {'not measured' if c.cost_ns is None else f'{c.cost_ns:,.0f} ns'} "
                        f"{UNITS.get(c.probe, 'per hit')}"
                        + (f" ({text(c.method)})" if c.method else "")
                        for c in t.probe_costs) or "per-hit costs not recorded"
    cpu = "" if t.collector_cpu_s is None else f"; the collector itself used {t.collector_cpu_s:.1f} s of CPU"
    if t.collector_cpu_s is not None and t.collector_cpu_recording_s is not None:
        cpu += (f" ({t.collector_cpu_recording_s:.1f} s of it after start-up"
                + (f", {100 * t.collector_cpu_recording_s / (t.wall_ns / 1e9):.0f}% of one CPU" if t.wall_ns else "")
                + ")")
    if t.bpf_programs:
        top = ", ".join(f"{clean(p.program, 60)} {p.run_time_ns / 1e9:.3f} s" for p in t.bpf_programs[:3])
        cpu += (f"; its eBPF programs ran {sum(p.run_time_ns for p in t.bpf_programs) / 1e9:.3f} s in the kernel, "
                f"{sum(p.runs for p in t.bpf_programs):,} runs on all CPUs (measured by the kernel; most: {top})")
    if t.sched_added_ns is None:
        sched = (f"; the scheduler records' share unknown ({t.off_cpu_intervals:,} off-CPU intervals, their cost "
                 "not measured)")
    else:
        sched = (f" and {t.sched_added_ns / 1e9:.3f} s by the scheduler records ({t.off_cpu_intervals:,} off-CPU "
                 f"intervals of traced threads)")
    if t.page_added_ns is None:
        sched += (f"; the page allocations' share unknown ({t.page_allocs:,} pages allocated by traced "
                  "processes, their cost not measured)")
    else:
        sched += (f" and {t.page_added_ns / 1e9:.3f} s by the page-allocation tracepoint ({t.page_allocs:,} pages "
                  f"allocated by traced processes)")
    if t.samples and t.sample_added_ns is None:
        sched += f"; the stack sampler's share unknown ({t.samples:,} on-CPU samples, its cost not recorded)"
    elif t.samples:
        sched += (f" and {t.sample_added_ns / 1e9:.3f} s by the stack sampler ({t.samples:,} on-CPU samples of "
                  "traced threads)")
    if t.total_share is not None:
        sched += f", {pct(t.total_share)} together"
    head = (f"tracing cost (estimated: the CUDA probes' hits x their per-hit cost, the traced threads' off-CPU "
            f"intervals x what the scheduler tracepoints add to each, and their page allocations x what the "
            f"page-allocation tracepoint adds to each, all measured at start. It leaves out those tracepoints' work "
            "for every other process of the machine and the collector's own CPU use, and it is not an upper bound: on "
            "a shared H200 host a training-like loop ran -1% to +31% slower traced than untraced (median of paired "
            "blocks per set, 16 sets; +4.9% over the latest 79 pairs, 90% interval +0.7% to +6.9%; +3.0%, +2.0% to "
            "+5.0%, where the host ran fast) while the estimate there said 1.3%: on launch-heavy jobs expect more "
            f"than it says): {(t.added_ns or 0) / 1e9:.3f} s added by the CUDA probes ({pct(t.share)}){sched}, over "
            f"{(t.wall_ns or 0) / 1e9:.1f} s of session, all traced processes together; {per_hit}{cpu}")
    out = [head]
    for p in t.processes[:8]:
        sched_p = ("their cost not measured" if p.sched_added_ns is None
                   else f"+{p.sched_added_ns / 1e9:.3f} s by the scheduler records")
        page_p = ("their cost not measured" if p.page_added_ns is None
                  else f"+{p.page_added_ns / 1e9:.3f} s by the page-allocation tracepoint")
        out.append(f"  process {text(p.comm)}[{p.pid}]: {p.added_ns / 1e9:.3f} s added over {p.wall_ns / 1e9:.1f} s "
                   f"({pct(p.share)}), "
                   f"{p.entry_hits:,} entry-only hits, {p.entry_return_hits:,} entry+return hits, "
                   f"{p.off_cpu_intervals:,} off-CPU intervals ({sched_p}), {p.page_allocs:,} pages allocated "
                   f"({page_p})"
                   + (f", launches recorded {pct(p.launch_coverage)} of the time" if p.launch_coverage is not None
                      and p.launch_coverage < 1 else ""))
    how = []
    if t.entry_only_launches:
        how.append(f"kernel launches entry-only ({t.entry_only_launches:,} rows without a duration: their durations "
                   "are unknown and their time counts as running outside CUDA calls)")
    if t.launch_coverage is not None and t.launch_coverage < 1:
        how.append(f"launch probes attached {pct(t.launch_coverage)} of the time (probe_gaps): launch counts and work "
                   "rates are estimates, scaled by the coverage")
    if how:
        out.append("launches: " + "; ".join(how))
    return out
