"""Compact text a model reads well, rendered from the bounded tool results.

Summaries come first, then one line per item; traced strings go through `sanitize.quote`. Times
are shown as seconds from the trace start (`+12.345678 s`), which `get_timeline(around=...)`
accepts back; durations in adaptive units (ns, us, ms, s); counts as plain integers so that every
number can be found again in `explain --json` or with SQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from ingero_mcp.analysis import cost_lines
from ingero_mcp.analysis import StackProfile, TimeWindow
from ingero_mcp.mcp.chainview import chains_text
from ingero_mcp.units import fmt_bytes, fmt_ns, fmt_pct, fmt_rel, fmt_wall
from ingero_mcp.mcp.results import (
    AccountingResult,
    BreakdownResult,
    ChainsResult,
    ContextResult,
    EvidenceResult,
    InfoResult,
    SqlRows,
    StacksToolResult,
    StatsResult,
    TimelineResult,
)
from ingero_mcp.sanitize import DATA_NOTE, clean, quote

TEXT_BUDGET = 20_000  # characters of text per tool result (~5-7k tokens)


def window_line(window: TimeWindow, whole: TimeWindow | None) -> str:
    """The window as offsets into the trace, and the trace's own span."""
    origin = whole.start_ns if whole else window.start_ns
    span = f" of a {fmt_ns(whole.duration_ns)} trace starting {fmt_wall(whole.start_ns)}" if whole else ""
    return (
        f"window {fmt_rel(window.start_ns, origin)} .. {fmt_rel(window.end_ns, origin)} "
        f"({fmt_ns(window.duration_ns)}{span})"
    )


def fit_lines(header: list[str], items: Iterable[str], total: int, budget: int = TEXT_BUDGET) -> tuple[str, int]:
    """Header plus as many item lines as fit in `budget` characters; says how many were left out."""
    out = list(header)
    used = sum(len(line) + 1 for line in out)
    shown = 0
    for line in items:
        if used + len(line) + 1 > budget - 200:
            break
        out.append(line)
        used += len(line) + 1
        shown += 1
    if shown < total:
        out.append(f"[{total - shown} more not shown: narrow the window (since), filter by pid, or lower the count]")
    return "\n".join(out), shown


def _notes(notes: list[str]) -> list[str]:
    """Notes, one line each: they may name traced things (ops, tables of an import)."""
    return [f"note: {clean(n, 4000)}" for n in notes]


def render_stats(r: StatsResult) -> str:
    """get_trace_stats as text."""
    head = [
        f"CUDA operation statistics, {window_line(r.window, r.trace_window)}",
        DATA_NOTE,
        f"calls: {r.calls} from {len(r.pids)} pid(s)" + (": " + ", ".join(map(str, r.pids[:50])) if r.pids else "")
        + (" ..." if len(r.pids) > 50 else "")
        + (" | cuda_calls holds a SAMPLE: counts come from exact aggregates, percentiles from the sample"
           if r.sampled else ""),
    ]
    if r.coverage or r.row_counts:
        captured = []
        complete = {c.table_name: c.complete for c in r.coverage}
        for table, n in r.row_counts.items():
            if n:
                tag = "" if table not in complete else (" complete" if complete[table] else " SAMPLE")
                captured.append(f"{table} {n} rows{tag}")
        head.append("captured: " + ("; ".join(captured) or "no rows (the trace is empty)"))
    head += _notes(r.notes)
    head.append(f"ops ({r.shown} of {r.total}, by total time): op | api | count | p50 | p95 | p99 | max | total | "
                "share of span")
    lines = []
    for s in r.ops:
        count = f"{s.count}" + (f" (of {'>= ' if s.lower_bound else ''}{s.total_count} counted)"
                                if s.total_count is not None and s.total_count != s.count else "")
        count += " [lower bound]" if s.lower_bound else ""
        extra = f" | {fmt_bytes(s.bytes_total)}" if s.bytes_total else ""
        if s.total_ns is None and s.entry_only:  # no duration recorded: unknown, not 0
            lines.append(f"{quote(s.op, 80)} | {clean(s.api, 20)} | {count} | entry-only (durations not recorded)"
                         f"{extra}")
            continue
        part = f" [{s.entry_only} entry-only calls not in the durations]" if s.entry_only else ""
        share = "-" if s.share_of_span is None else f"{s.share_of_span * 100:.2f}%"
        lines.append(
            f"{quote(s.op, 80)} | {clean(s.api, 20)} | {count} | {fmt_ns(s.p50_ns)} | {fmt_ns(s.p95_ns)} | "
            f"{fmt_ns(s.p99_ns)} | "
            f"{fmt_ns(s.max_ns)} | {fmt_ns(s.total_ns)} | {share}{extra}{part}"
        )
    if r.host:
        lines.append("host events (exact in-kernel counts): source/op | count | pids | total duration (for "
                     "sched_switch: the on-CPU time of the slices it ended, summed over tasks)")
        for h in r.host:
            lines.append(
                f"{quote(h.source, 40)}/{quote(h.op, 60)} | {h.count} | {h.pids} | {fmt_ns(h.sum_duration_ns)}")
    text, _ = fit_lines(head, lines, len(lines))
    return text


def chains_head(r: ChainsResult, whole: TimeWindow | None) -> list[str]:
    """The lines above the chains: counts, window, data note, notes."""
    head = [
        f"causal chains: {r.shown} of {r.total}, most severe first (imported chains ranked with the others), "
        f"{window_line(r.window, whole)}",
        DATA_NOTE,
    ] + _notes(r.notes)
    if not r.chains:
        head.append("no causal chain found in this window.")
    return head


def render_chains(r: ChainsResult, whole: TimeWindow | None) -> str:
    """get_causal_chains as text: one block per chain view, the same views as the structured content."""
    text, _ = fit_lines(chains_head(r, whole), [chains_text([v]) for v in r.chains], len(r.chains))
    return text


def render_evidence(r: EvidenceResult, whole: TimeWindow | None) -> str:
    """get_evidence_sql as text: each evidence item with its SQL, whole."""
    head = [f"evidence of chain {quote(r.chain_id, 200)}: {r.shown} of {r.total} items, {window_line(r.window, whole)}",
            DATA_NOTE, *_notes(r.notes)]
    lines = []
    for e in r.evidence:
        value = quote(e.get("value"), 200) if isinstance(e.get("value"), str) else e.get("value")
        lines.append(f"{quote(e.get('name', ''), 200)} = {value}{(' ' + quote(e['unit'], 40)) if e.get('unit') else ''}"
                     + (f"\n  sql: {e['sql']}" if e.get("sql")
                        else "\n  sql: - (no query: read from the imported chain)"))
    text, _ = fit_lines(head, lines, len(lines), budget=10 * TEXT_BUDGET)
    return text


def render_breakdown(r: BreakdownResult, whole: TimeWindow | None) -> str:
    """get_per_process_breakdown as text: one block per pid."""
    origin = whole.start_ns if whole else r.window.start_ns
    head = [
        f"per-process breakdown: {r.shown} of {r.total} pids (CUDA-active first), {window_line(r.window, whole)}",
        DATA_NOTE,
    ] + _notes(r.notes)
    blocks = []
    for p in r.processes:
        lines = [
            f"pid {p.pid} comm {quote(p.comm, 64)} ppid {p.ppid if p.ppid is not None else '-'}"
            + (f" exited {fmt_rel(p.exit_ns, origin)}" if p.exit_ns else "")
            + (f" children {p.children[:30]}{' ...' if len(p.children) > 30 else ''}" if p.children else ""),
        ]
        if p.cmdline:
            lines.append(f"  cmdline {quote(p.cmdline, 200)}")
        sched = (
            ("  [the collector: ingero-mcp trace itself, ranked last]\n" if p.is_collector else "")
            + ("  context switches not recorded" if p.counts_from == "none" else
               f"  context switches {'>= ' if p.switches_lower_bound else ''}{p.context_switches}")
            + (" (a lower bound)" if p.switches_lower_bound else "")
            + f""", off-CPU {'not recorded' if p.off_cpu_ns is None
                             else ('>= ' if p.switches_lower_bound else '') + fmt_ns(p.off_cpu_ns)}"""
            + (f", on-CPU {fmt_ns(p.on_cpu_ns)} (aggregates)" if p.on_cpu_ns is not None else "")
            + f" (preempted {fmt_ns(p.preempted_ns)}, blocked {fmt_ns(p.blocked_ns)})"
            f", worst stall {fmt_ns(p.worst_stall_ns)}"
            + (f" at {fmt_rel(p.worst_stall_ts_ns, origin)}" if p.worst_stall_ts_ns else "")
            + (f" in thread {p.worst_stall_tid} ({quote(p.worst_stall_thread or 'name not recorded', 64)}; "
               f"{p.worst_stall_role})"
               if p.worst_stall_tid is not None else "")
            + f", page allocs {'not recorded' if p.page_allocs is None else p.page_allocs}"
            + (f" ({fmt_bytes(p.page_alloc_bytes)})" if p.page_alloc_bytes is not None else "")
            + (" [from in-kernel aggregates]" if p.counts_from == "aggregates" else "")
        )
        lines.append(sched)
        for k in p.known_from:
            lines.append(f"  known from {quote(k, 300)} (imported, not analysed yet)")
        for o in p.ops[:15]:
            lines.append(
                f"  {quote(o.op, 80)}: {o.count} calls, entry-only (durations not recorded)"
                if o.total_ns is None and o.entry_only
                else f"  {quote(o.op, 80)}: {o.count} calls, total {fmt_ns(o.total_ns)}, p50 {fmt_ns(o.p50_ns)}, "
                f"p99 {fmt_ns(o.p99_ns)}, max {fmt_ns(o.max_ns)}"
            )
        if len(p.ops) > 15:
            lines.append(f"  [{len(p.ops) - 15} more ops in the structured content]")
        blocks.append("\n".join(lines))
    if not blocks:
        head.append("no process has data in this window" + (" for the pids asked" if r.notes else "") + ".")
    text, _ = fit_lines(head, blocks, len(blocks))
    return text


def render_timeline(r: TimelineResult, whole: TimeWindow | None) -> str:
    """get_timeline as text: one line per event."""
    t = r.timeline
    origin = whole.start_ns if whole else t.window.start_ns
    head = [
        f"timeline: {r.shown} of {t.total_in_window} events in the {window_line(t.window, whole)}",
        DATA_NOTE,
        *_notes(r.notes),
        "time (from trace start) | pid | tid | kind | description | duration",
    ]
    lines = [
        f"{fmt_rel(e.ts_ns, origin)} | {e.pid if e.pid is not None else '-'} | {e.tid if e.tid is not None else '-'} | "
        f"{clean(e.kind, 40)} | {quote(e.description, 160)} | {fmt_ns(e.duration_ns)}"
        for e in t.entries
    ]
    if not lines:
        head.append("no events in this window for this pid/thread.")
    text, _ = fit_lines(head, lines, len(lines))
    return text


def render_context(r: ContextResult, whole: TimeWindow | None) -> str:
    """get_system_context as text: summary, then one line per (downsampled) snapshot."""
    c = r.context
    origin = whole.start_ns if whole else c.window.start_ns
    head = [
        f"system context: {len(c.points)} snapshots"
        + (f" (downsampled from {c.downsampled_from})" if c.downsampled_from else "")
        + f", {window_line(c.window, whole)}",
        f"CPU max {fmt_pct(c.cpu_percent_max)}, mean {fmt_pct(c.cpu_percent_mean)}; memory used max "
        f"{fmt_pct(c.mem_used_percent_max)}; swap used max {fmt_bytes(c.swap_used_bytes_max)}; "
        f"GPU utilisation mean {fmt_pct(c.gpu_util_percent_mean)}",
        *_notes(r.notes),
        "time | cpu % | procs running | load1 | mem used % | mem available | swap used | gpu util % | gpu mem used",
    ]
    lines = [
        f"{fmt_rel(p.ts_ns, origin)} | {fmt_pct(p.cpu_percent)} | "
        f"{p.procs_running if p.procs_running is not None else '-'} | {'-' if p.load1 is None else f'{p.load1:.2f}'} | "
        f"{fmt_pct(p.mem_used_percent)} | {fmt_bytes(p.mem_available_bytes)} | {fmt_bytes(p.swap_used_bytes)} | "
        f"{fmt_pct(p.gpu_util_percent)} | {fmt_bytes(p.gpu_mem_used_bytes)}"
        for p in c.points
    ]
    if not lines:
        head.append("no snapshots in this window.")
    text, _ = fit_lines(head, lines, len(lines))
    return text


def render_info(r: InfoResult) -> str:
    """get_trace_info as text: sessions, sources, coverage, row counts."""
    i = r.info
    head = [
        "trace info" + (" (LIVE: still being recorded, or its collector stopped without closing it)" if i.live else ""),
        DATA_NOTE,
    ]
    if i.window:
        head.append(
            f"span {fmt_wall(i.window.start_ns)} .. {fmt_wall(i.window.end_ns)} ({fmt_ns(i.window.duration_ns)}); "
            f"start_ns {i.window.start_ns}, end_ns {i.window.end_ns}"
        )
    else:
        head.append("the trace is empty")
    head += _notes(r.notes)
    head += cost_lines(i.tracing, lambda v: quote(v, 80))  # v4 stores: tracing cost, launch recording
    lines = []
    for s in i.sessions:
        dur = fmt_ns(s.stopped_ns - s.started_ns) if s.stopped_ns else "still recording"
        lines.append(
            f"session {s.session_id} source {quote(s.source, 60)} host {quote(s.host, 80)} kernel "
            f"{quote(s.kernel, 80)} cpus {s.cpu_count if s.cpu_count is not None else '-'} memory "
            f"{fmt_bytes(s.memory_bytes)}"
        )
        lines.append(
            f"  GPU {quote(s.gpu_model, 80)} driver {quote(s.gpu_driver, 40)} CUDA runtime "
            f"{quote(s.cuda_runtime_version, 40)}; collector {quote(s.collector_version, 120)}; started "
            f"{fmt_wall(s.started_ns)}; duration {dur}"
        )
        if s.collector_flags:
            lines.append(f"  collector flags {quote(s.collector_flags, 300)}")
        if s.attached:
            lines.append(f"  attached {quote(s.attached, 600)}")
        for src in s.sources:
            lines.append(
                f"  source {quote(src.source, 40)}: seen {src.events_seen}, stored {src.events_stored}, "
                f"lost {src.events_lost}, aggregated {src.events_aggregated}"
            )
    if i.coverage:
        lines.append("coverage (complete = every event is a row; SAMPLE = totals live in host_aggregates):")
        for c in i.coverage:
            lines.append(f"  table {clean(c.table_name, 80)}: {'complete' if c.complete else 'SAMPLE'}"
                         + (f" ({quote(c.note, 200)})" if c.note else ""))
    lines.append("rows: " + ", ".join(f"{t} {n}" for t, n in i.row_counts.items()))
    for q in i.data_quality:
        lines.append(f"data quality: {q.count} {q.what} (the accounting mends them; SQL: {q.sql})")
    text, _ = fit_lines(head, lines, len(lines))
    return text


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return quote(value, 200)
    if isinstance(value, list | dict):
        return quote(json.dumps(value, ensure_ascii=False, default=str), 200)
    return str(value)


def render_sql(r: SqlRows, render_cell: Callable[[Any], str] = _cell) -> str:
    """run_sql as text: a header of columns, one line per row (pipe-separated)."""
    head = [
        f"{r.shown} row(s) shown"
        + (f" of {r.total} fetched" if r.total != r.shown else "")
        + (f"; the query had more than limit={r.limit} rows" if r.more_rows else "")
        + f"; {r.elapsed_ms:.0f} ms",
        DATA_NOTE,
        *_notes(r.notes),
    ]
    if r.columns:
        head.append("columns: " + " | ".join(f"{quote(c, 200)} ({t})" for c, t in zip(r.columns, r.types, strict=True)))
    lines = [" | ".join(render_cell(v) for v in row) for row in r.rows]
    text, _ = fit_lines(head, lines, max(r.total, len(lines)))  # rows fetched but not shown are counted as left out
    return text


def render_accounting(r: AccountingResult, whole: TimeWindow | None) -> str:
    """get_time_accounting as text: the verdict, a line per thread, the phases, the minor causes."""
    origin = whole.start_ns if whole else r.window.start_ns
    head = [f"time accounting of the threads that feed the GPU, {window_line(r.window, whole)}", DATA_NOTE,
            *_notes(r.notes), "verdict:", *[f"  {quote(v, 2000)}" for v in r.verdict]]
    lines = []
    for t in r.threads:
        shares = ", ".join(f"{k} {v}%" for k, v in t["shares_percent"].items())
        est = "~" if t.get("work_estimated") else ""
        lines.append(f"thread {quote(t['name'], 120)} ({t['role']}), wall {t['wall_s']} s, {est}{t['work_calls']:,} "
                     f"launches/copies{' (estimated)' if est else ''}: {shares}")
    for ph in r.phases:
        slow = f", {ph['slowdown']}x slower than the baseline" if ph.get("slowdown") else ""
        if ph["kind"] == "recurrent":
            every = f", one every {ph['period_s']} s" if ph.get("period_s") else ""
            short = "" if ph.get("stretches") else "short "
            lines.append(f"phase recurrent of pid {ph['pid']}: {ph['episodes']} {short}slow episodes from "
                         f"{fmt_rel(ph['start_ns'], origin)} to {fmt_rel(ph['end_ns'], origin)}{every}, "
                         f"{ph['lost_s']} s of work lost at the healthy rate{slow}")
            continue
        unit, v = ph.get("unit") or "launches+copies/s", ph["work_rate"]
        rate = f"{v:,.0f}" if v >= 10 else f"{v:,.1f}" if v >= 1 else f"{v:,.2f}"  # 0.28/s is not '0'
        lines.append(f"phase {ph['kind']} of pid {ph['pid']}: {fmt_rel(ph['start_ns'], origin)} .. "
                     f"{fmt_rel(ph['end_ns'], origin)}, {'~' if ph.get('estimated') else ''}{rate} "
                     f"{unit}{' (estimated)' if ph.get('estimated') else ''}{slow}")
    lines += [f"minor: {quote(m, 600)}" for m in r.minor]
    text, _ = fit_lines(head, lines, len(lines))
    return text


def _profile_lines(p: StackProfile) -> tuple[list[str], list[str]]:
    """A profile's summary lines (its total, coverage, top frames) and its stack lines (one folded stack each)."""
    kind = "on-CPU" if p.mode == "on_cpu" else "off-CPU"
    if not p.top_frames:
        return [f"{kind}: no stacks: {clean(p.why_none or 'none in this window', 600)}"], []
    est = f", an estimate from samples at {p.sample_hz or '?'} Hz" if p.estimate else ", weighted by sleep time"
    cov = (f"; {fmt_pct(100 * p.coverage)} of its {'on-CPU' if p.mode == 'on_cpu' else 'sleep'} time "
           f"({p.covered_of_s} s in the accounting)" if p.coverage is not None else "")
    what = "samples" if p.mode == "on_cpu" else "sleeps"
    head = [f"{kind}: {p.count} {what}, {p.seconds} s{est}{cov}; {p.stacks_total} distinct stacks",
            "  top frames (self share | inclusive share | frame | called from):"]
    head += [f"  {fmt_pct(100 * f.self_share)} | {fmt_pct(100 * f.inclusive_share)} | {quote(f.frame.label(), 300)}"
             f" | {quote(f.caller.label(), 300) if f.caller else '-'}" for f in p.top_frames]
    if p.kernel_frames:
        head.append("  in the kernel (self share | function):")
        head += [f"  {fmt_pct(100 * f.self_share)} | {quote(f.frame.label(), 300)}" for f in p.kernel_frames]
    stacks = [f"  {kind} stack {fmt_pct(100 * s.share)} ({s.count} {what}, {s.seconds} s): "
              f"{quote(s.folded, 3000)}" for s in p.stacks]
    return head, stacks


def render_stacks(r: StacksToolResult, whole: TimeWindow | None) -> str:
    """get_stacks as text: per profile its top frames, then its heaviest folded stacks (outermost first)."""
    st = r.stacks
    who = f"pid {st.pid}" + (f", thread {st.tid}" if st.tid is not None else " (all its threads)")
    head = [f"stacks of {who}, {window_line(TimeWindow(start_ns=st.start_ns, end_ns=st.end_ns), whole)}", DATA_NOTE,
            *[f"stack source: {clean(s, 600)}" for s in st.sources], *_notes(r.notes)]
    lines: list[str] = []
    for p in (st.on_cpu, st.off_cpu):
        if p is not None:
            h, s = _profile_lines(p)
            head += h
            lines += s
    if lines:
        head.append("heaviest stacks, outermost frame first (share | count | seconds | frames joined by ';'):")
    text, _ = fit_lines(head, lines, len(lines))
    return text
