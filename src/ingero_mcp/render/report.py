"""Renders the analysis models (Report and its parts) as rich text for `explain` and `demo`."""

from __future__ import annotations

import sys

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ingero_mcp.analysis.cost import cost_lines
from ingero_mcp.analysis.imported_accounting import short_why
from ingero_mcp.analysis.models import CausalChain, ImportedAccounting, OpStats, ProcessBreakdown, Report
from ingero_mcp.render import fmt

SEVERITY_STYLE = {"HIGH": "bold red", "MEDIUM": "bold yellow", "LOW": "cyan"}


def make_console(file: object = None) -> Console:
    """A console that keeps tables readable when output is piped (fixed width, no colour codes)."""
    out = file or sys.stdout
    tty = hasattr(out, "isatty") and out.isatty()
    return Console(file=out, width=None if tty else 160, no_color=not tty, highlight=False, soft_wrap=False)


def header(report: Report, db: str) -> Text:
    """Which trace, which host, which window."""
    t = Text()
    t.append(f"ingero-mcp explain: {fmt.clean(db, 200)}\n", style="bold")
    for s in report.info.sessions:
        bits = [fmt.clean(s.source)]
        if s.host:
            bits.append(f"host {fmt.clean(s.host)}")
        if s.cpu_count:
            bits.append(f"{s.cpu_count} CPUs")
        if s.gpu_model:
            bits.append(fmt.clean(s.gpu_model))
        span = f"{fmt.utc(s.started_ns)} .. {fmt.utc(s.stopped_ns) if s.stopped_ns else 'recording'}"
        t.append(f"session {s.session_id}: {', '.join(bits)}; {span}\n")
    w = report.window
    whole = report.info.window
    if whole is None:
        t.append("empty trace: no sessions, CUDA calls, scheduler rows or snapshots yet\n", style="bold")
        return t
    label = "whole trace" if whole == w else f"{fmt.rel(w.start_ns, whole.start_ns)} .. {fmt.rel(w.end_ns, whole.start_ns)} of the trace"
    t.append(f"window: {fmt.utc(w.start_ns)} .. {fmt.utc(w.end_ns)} ({w.duration_ns / 1e9:,.1f} s, {label})\n")
    for line in cost_lines(report.info.tracing, lambda v: fmt.clean(v or "?", 120)):  # v4: tracing cost, launches
        t.append(line + "\n")
    for note in report.notes:
        t.append(f"note: {fmt.clean(note, 4000)}\n", style="italic")
    return t


def chain_panel(chain: CausalChain, start_ns: int) -> Panel:
    """One causal chain: summary, root cause, evidence, timeline, fix (its SQL: sql_lines)."""
    parts: list[object] = []
    t = Text()
    t.append(fmt.clean(chain.summary, 2000) + "\n", style="bold")
    if chain.store_check:
        t.append("Checked against the store: ", style="bold")
        t.append(fmt.clean(chain.store_check, 1200) + "\n")
    t.append("Root cause: ", style="bold")
    t.append(fmt.clean(chain.root_cause, 500) + "\n")
    if chain.explanation:
        t.append(fmt.clean(chain.explanation, 4000) + "\n")
    parts.append(t)
    if chain.evidence:
        ev = Table(title="Evidence", title_justify="left", show_edge=False, pad_edge=False, box=None)
        ev.add_column("fact", style="dim")
        ev.add_column("value", justify="right")
        ev.add_column("unit")
        for e in chain.evidence:
            value = f"{e.value:,}" if isinstance(e.value, int) else str(e.value)
            ev.add_row(fmt.cell(e.name), fmt.cell(value), fmt.cell(e.unit))
        parts.append(ev)
    if chain.timeline:
        tl = Text("Timeline\n", style="bold")
        for e in chain.timeline:
            when = fmt.rel(e.ts_ns, start_ns) if start_ns and e.ts_ns >= start_ns else fmt.utc(e.ts_ns)
            tl.append(f"  {when:>14}  {fmt.utc(e.ts_ns)}  ", style="dim")
            tl.append(fmt.clean(e.description, 400) + "\n")
        parts.append(tl)
    if chain.recommendations:
        fix = Text("Fix\n", style="bold")
        for i, r in enumerate(chain.recommendations, 1):
            fix.append(f"  {i}. {fmt.clean(r, 1000)}\n")
        parts.append(fix)
    origin = "ingero-mcp" if chain.origin == "ingero-mcp" else f"{chain.origin} (imported, as {chain.origin} stored it)"
    title = Text.assemble((f" {fmt.clean(chain.severity, 10)} ", SEVERITY_STYLE.get(chain.severity, "")),
                          f" {fmt.clean(chain.op, 120)}  [{fmt.clean(origin, 80)}] ")
    return Panel(Group(*parts), title=title, title_align="left", expand=True)


def sql_lines(chain: CausalChain) -> list[Text]:
    """Each evidence item's SQL, whole and on one line (printed outside the panel, so nothing wraps or cuts it)."""
    out = []
    for e in chain.evidence:
        if e.sql:
            out.append(Text(f"  recompute {fmt.clean(e.name)} with:", style="dim"))
            out.append(Text("    " + fmt.clean(e.sql, fmt.WHOLE)))  # its own line: copied and run as it is
    return out


def print_chain(console: Console, chain: CausalChain, start_ns: int, show_sql: bool) -> None:
    """A chain's panel, then (with show_sql) the SQL of its evidence, whole."""
    console.print(chain_panel(chain, start_ns))
    if show_sql:
        for line in sql_lines(chain):
            console.print(line, soft_wrap=True)


def stats_table(stats: list[OpStats], limit: int | None = 15) -> Table:
    """Top CUDA ops by total time."""
    sampled = any(s.from_sample for s in stats)
    counted = any(s.total_count is not None for s in stats)
    title = "Top CUDA ops" + ((" (percentiles from the stored sample; " + ("counts and totals from aggregates)" if counted
                                                                           else "counts of the stored rows)")) if sampled else "")
    table = Table(title=title, title_justify="left")
    for col, just in (("op", "left"), ("api", "left"), ("calls", "right"), ("total", "right"), ("share", "right"),
                      ("p50", "right"), ("p95", "right"), ("p99", "right"), ("max", "right"), ("p99/p50", "right")):
        table.add_column(col, justify=just)
    if sampled:
        table.add_column("stored", justify="right")
    for s in stats[:limit] if limit else stats:
        calls = s.total_count if s.total_count is not None else s.count
        lb = ">= " if s.lower_bound else ""
        d = fmt.ns if s.total_ns is not None or not s.entry_only else (lambda _v: "entry-only")  # unknown, not 0
        row = [fmt.clean(s.op), fmt.clean(s.api, 20), lb + fmt.count(calls), lb + d(s.total_ns),
               "-" if s.share_of_span is None else fmt.pct(s.share_of_span),
               d(s.p50_ns), d(s.p95_ns), d(s.p99_ns), d(s.max_ns),
               f"{s.p99_ns / s.p50_ns:,.1f}x" if s.p50_ns and s.p99_ns is not None else "-"]
        if sampled:
            row.append(fmt.count(s.count))
        table.add_row(*map(fmt.cell, row))
    if any(s.lower_bound for s in stats):
        table.caption = ">= : a lower bound (the aggregates did not count every stored row, or the window cuts a bucket)"
    return table


def processes_table(procs: list[ProcessBreakdown], limit: int | None = 12) -> Table:
    """One line per process: CUDA calls, scheduler and memory numbers, children."""
    table = Table(title="Processes", title_justify="left")
    for col, just in (("pid", "right"), ("comm", "left"), ("ppid", "right"), ("CUDA calls", "right"),
                      ("ctx switches", "right"), ("off-CPU (all threads)", "right"), ("preempted", "right"), ("blocked", "right"),
                      ("worst stall", "right"), ("page allocs", "right"), ("alloc bytes", "right"),
                      ("children", "left"), ("from", "left")):
        table.add_column(col, justify=just, no_wrap=col in ("children", "comm", "from"))
    shown = procs[:limit] if limit else procs
    for p in shown:
        kids = fmt.pid_ranges(p.children, 2)
        table.add_row(*map(fmt.cell, (
            str(p.pid), fmt.clean(p.comm, 24) + (" [the collector]" if p.is_collector else ""),
            "-" if p.ppid is None else str(p.ppid), fmt.count(sum(o.count for o in p.ops)),
            "-" if p.counts_from == "none" else (">= " if p.switches_lower_bound else "") + fmt.count(p.context_switches),
            (">= " if p.switches_lower_bound and p.off_cpu_ns is not None else "") + fmt.ns(p.off_cpu_ns), fmt.ns(p.preempted_ns), fmt.ns(p.blocked_ns),
            fmt.ns(p.worst_stall_ns), fmt.count(p.page_allocs), fmt.nbytes(p.page_alloc_bytes), kids, p.counts_from + (" + imported I/O" if p.known_from else ""),
        )))
    notes = []
    if limit and len(procs) > limit:
        notes.append(f"{len(procs) - limit} more processes: --per-process shows all")
    if any(p.switches_lower_bound for p in shown):
        notes.append(">= : a lower bound (the aggregates counted fewer than the stored rows, or none were stored)")
    if any(p.off_cpu_ns is None for p in shown):
        notes.append("- : not recorded (unknown, not zero)")
    if any(p.is_collector for p in shown):
        notes.append("the collector (this project's `ingero-mcp trace`) is ranked last")
    if notes:
        table.caption = "; ".join(notes)
    return table


def process_detail(p: ProcessBreakdown) -> Panel:
    """A process with its CUDA ops (for --per-process)."""
    t = Text()
    t.append(f"{fmt.clean(p.cmdline or p.comm or '?', 300)}\n")
    t.append(f"parent {p.ppid if p.ppid is not None else '-'}; children {fmt.pid_ranges(p.children, 50) or '-'}; "
             + ("this is the collector (ingero-mcp trace), ranked last; " if p.is_collector else "")
             + ("context switches not recorded; " if p.counts_from == "none" else
                f"context switches {'>= ' if p.switches_lower_bound else ''}{fmt.count(p.context_switches)} ({p.counts_from}"
                + (", a lower bound" if p.switches_lower_bound else "") + "); ")
             + f"off-CPU {'not recorded' if p.off_cpu_ns is None else ('>= ' if p.switches_lower_bound else '') + fmt.ns(p.off_cpu_ns)} "
             + (f"(on-CPU {fmt.ns(p.on_cpu_ns)} from the aggregates) " if p.on_cpu_ns is not None else "")
             + f"(preempted {fmt.ns(p.preempted_ns)}, blocked {fmt.ns(p.blocked_ns)}); worst stall {fmt.ns(p.worst_stall_ns)}"
             + (f" at {fmt.utc(p.worst_stall_ts_ns)}" if p.worst_stall_ts_ns else "")
             + (f" in thread {p.worst_stall_tid} ({fmt.clean(p.worst_stall_thread or 'name not recorded', 32)}; "
                f"{p.worst_stall_role})" if p.worst_stall_tid is not None else "")
             + f"; page allocations {'not recorded' if p.page_allocs is None else fmt.count(p.page_allocs)}"
             + (f" ({fmt.nbytes(p.page_alloc_bytes)})" if p.page_alloc_bytes is not None else "")
             + (f"; exited {fmt.utc(p.exit_ns)}" if p.exit_ns else "")
             + "".join(f"; known from {fmt.clean(k, 300)} (not analysed yet)" for k in p.known_from) + "\n")
    parts: list[object] = [t]
    if p.ops:
        ops = Table(box=None, show_edge=False)
        for col in ("op", "calls", "total", "p50", "p99", "max"):
            ops.add_column(col, justify="left" if col == "op" else "right")
        for o in p.ops:
            d = fmt.ns if o.total_ns is not None or not o.entry_only else (lambda _v: "entry-only")  # unknown, not 0
            ops.add_row(*map(fmt.cell, (o.op, fmt.count(o.count), d(o.total_ns), d(o.p50_ns), d(o.p99_ns), d(o.max_ns))))
        parts.append(ops)
    return Panel(Group(*parts), title=Text(f"pid {p.pid} {fmt.clean(p.comm, 32)}"), title_align="left")


def accounting_table(report: Report) -> Table:
    """Where the time of each feeding thread (and of the threads it waited on) went, as shares of its wall time."""
    acc = report.accounting
    table = Table(title="Time accounting (share of each thread's wall time; thread_seconds)", title_justify="left")
    outside = "run outside CUDA" + (" (incl. launches, entry-only)" if acc and acc.entry_only_launches else "")
    work = "launches+copies" + (" (est.)" if acc and acc.estimated else "")
    for col in ("thread", "role", "wall", outside, "run in CUDA", "GPU wait", "sleep outside", "of it IO",
                "CPU wait", "unknown", work):
        table.add_column(col, justify="left" if col in ("thread", "role") else "right")
    for t in (acc.threads if acc else [])[:12]:
        a = t.total
        pct = (lambda ns: f"{100 * ns / a.wall_ns:.1f}%" if a.wall_ns else "-")
        name = f"{fmt.clean(t.comm or t.process_comm or '?', 32)}[{t.pid}" + ("]" if t.tid == t.pid else f"/{t.tid}]")
        table.add_row(name, t.role, fmt.ns(a.wall_ns), pct(a.run_outside_ns), pct(a.run_inside_ns), pct(a.sleep_inside_ns),
                      pct(a.sleep_outside_ns), pct(a.sleep_io_ns), pct(a.cpu_wait_ns), pct(a.off_cpu_unknown_ns),
                      ("~" if acc.estimated else "") + fmt.count(a.work_calls))
    if acc and acc.estimated:
        table.caption = (f"~ : estimated: the launch probes were attached {100 * (acc.launch_coverage or 0):.0f}% of the time "
                         "(probe_gaps); launches seen are scaled per second by the coverage")
    return table


def imported_table(imp: ImportedAccounting) -> Table:
    """An import's threads: their scheduler rows against Ingero's counts, and where the time of the complete ones
    went (imported_accounting.py; off-CPU is not split into sleeping and waiting for a CPU)."""
    table = Table(title="Imported threads, accounted from their own scheduler rows where complete",
                  title_justify="left")
    for col in ("thread", "feeds GPU", "switch rows", "counted", "accounted", "on-CPU", "off-CPU", "unknown", "status"):
        table.add_column(col, justify="left" if col in ("thread", "feeds GPU", "status") else "right")
    for t in imp.threads[:12]:
        name = f"{fmt.clean(t.comm or t.process_comm or '?', 32)}[{t.pid}" + ("]" if t.tid == t.pid else f"/{t.tid}]")
        shown = t.accountable
        table.add_row(name, "yes" if t.feeds_gpu else "", fmt.count(t.switch_rows),
                      "-" if t.switches_counted is None else fmt.count(t.switches_counted),
                      fmt.ns(t.accounted_ns) if shown else "-", f"{100 * t.on_cpu_share:.1f}%" if shown else "-",
                      fmt.ns(t.off_cpu_ns) if shown else "-", fmt.ns(t.unknown_ns) if shown else "-",
                      "accounted" if shown else fmt.cell(short_why(t)))
    if len(imp.threads) > 12:
        table.caption = f"{len(imp.threads) - 12} more in `explain --json` (accounting.imported)"
    return table


def render_report(console: Console, report: Report, db: str, *, per_process: bool = False, show_sql: bool = False) -> None:
    """The whole incident report: header, chains (ours, then imported), top ops, processes."""
    start = report.info.window.start_ns if report.info.window else report.window.start_ns
    # Text that names traced things is printed unwrapped (the terminal folds it): a wrap inserted here could
    # start a line with a traced name. Boxed tables and panels start every line with their border.
    console.print(header(report, db), soft_wrap=True)
    if report.verdict:
        v = Text()
        v.append("Verdict\n", style="bold underline")
        for line in report.verdict:
            style = SEVERITY_STYLE.get(line.split(":", 1)[0], "")
            v.append(fmt.clean(line, 2000) + "\n", style=style)
        console.print(v, soft_wrap=True)
    if report.accounting and report.accounting.complete and report.accounting.threads:
        console.print(accounting_table(report))
    if report.accounting and report.accounting.imported and report.accounting.imported.threads:
        console.print(imported_table(report.accounting.imported))
    own = [c for c in report.chains if c.origin == "ingero-mcp"]
    imported = [c for c in report.chains if c.origin != "ingero-mcp"]
    if own:
        console.print(Text(f"Causal chains found by ingero-mcp: {len(own)}", style="bold underline"))
        for c in own:
            print_chain(console, c, start, show_sql)
    elif report.accounting and report.accounting.imported:  # an import: the verdict says what could be accounted
        console.print(Text("No causal chain of ours: no thread that fed the GPU could be accounted (the verdict says "
                           "why).", style="bold"))
    else:
        console.print(Text("No causal chain: no part of the feeding threads' time grew in a slow phase or filled idle GPU "
                           "time beyond 1% of the feeding time.", style="bold green"))
    if report.minor:
        m = Text()
        m.append("Minor (each explains under 1% of the feeding time)\n", style="bold")
        for line in report.minor[:10]:
            m.append("  " + fmt.clean(line, 400) + "\n")
        console.print(m, soft_wrap=True)
    if imported:
        console.print(Text(f"Chains stored by {imported[0].origin} (imported; not recomputed): {len(imported)} kinds",
                           style="bold underline"))
        for c in imported:
            print_chain(console, c, start, show_sql)
    if report.stats:
        console.print(stats_table(report.stats))
    if report.host:
        host = Table(title="Host events (exact counts from host_aggregates)", title_justify="left")
        for col in ("event", "source", "count", "pids", "total duration", "bytes"):
            host.add_column(col, justify="left" if col in ("event", "source") else "right")
        for h in report.host[:12]:
            host.add_row(*map(fmt.cell, (h.op, h.source, fmt.count(h.count), fmt.count(h.pids),
                                         fmt.ns(h.sum_duration_ns), fmt.nbytes(h.sum_bytes) if h.sum_bytes else "-")))
        console.print(host)
    if report.processes:
        console.print(processes_table(report.processes, None if per_process else 12))
        if per_process:
            for p in report.processes:
                console.print(process_detail(p))
