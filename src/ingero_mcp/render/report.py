"""Renders the analysis models (Report and its parts) as rich text: the whole report for `explain --full` (and the
MCP server's `ingero://report`), the default one-screen page in render/summary.py.

On a terminal: colours at its width, tables behind a box-drawing gutter, panels with rounded borders. Piped: plain
text at $COLUMNS or PLAIN_WIDTH columns, no colour, tables behind a "| " gutter, panels with ASCII borders (so a
wrapped line starts with the gutter or border, never with traced text). Table cells wrap; none is cut.
"""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from ingero_mcp.analysis import cost_lines
from ingero_mcp.analysis import short_why
from ingero_mcp.analysis import CausalChain, ImportedAccounting, OpStats, ProcessBreakdown, Report
from ingero_mcp.render import fmt
from ingero_mcp.render.console import MIN_WIDTH, PLAIN_WIDTH, make_console, plain_width  # noqa: F401
from ingero_mcp.render.frames import frames_lines
from ingero_mcp.render.table import Column, layout
from ingero_mcp.render.traced import traced_names
from ingero_mcp.render.wrap import wrap

SEVERITY_STYLE = {"HIGH": "bold red", "MEDIUM": "bold yellow", "LOW": "cyan"}
CELL_CAP = 2_000  # characters of one table cell (cells wrap: a long value takes more lines, it is not cut)


def plain(console: Console) -> bool:
    """Whether the console writes plain text (a file or pipe): ASCII borders, no colour."""
    return not console.is_terminal


def panel_box(console: Console) -> box.Box:
    """Panel borders: box drawing on a terminal, ASCII when piped."""
    return box.ASCII if plain(console) else box.ROUNDED


def print_table(console: Console, title: str, columns: list[Column], names: list[str], caption: str | None = None,
                width: int | None = None) -> None:
    """A titled table (render/table.py) whose every line starts with a gutter, then its caption wrapped."""
    paragraph(console, title, names, style="bold")
    gutter, rule = ("| ", "-") if plain(console) else ("\u2502 ", "\u2500")
    for line in layout(columns, width or console.width, gutter=gutter, rule=rule):
        console.print(line, soft_wrap=True)
    if caption:
        paragraph(console, caption, names, "  ", "  ", style="dim")


def paragraph(console: Console, text: str, names: list[str], first: str = "", rest: str = "  ",
              style: str = "") -> None:
    """Print cleaned text wrapped to the console's width, no line starting with a traced name (render/wrap.py)."""
    for line in wrap(text, console.width, first, rest, names):
        console.print(Text(line, style=style), soft_wrap=True)


def header(console: Console, report: Report, db: str, names: list[str]) -> None:
    """Which trace, which host, which window; the tracing cost in full; the notes."""
    paragraph(console, fmt.clean(db, 300), names, "ingero-mcp explain: ", style="bold")
    for s in report.info.sessions:
        bits = [fmt.clean(s.source)]
        if s.host:
            bits.append(f"host {fmt.clean(s.host)}")
        if s.cpu_count:
            bits.append(f"{s.cpu_count} CPUs")
        if s.gpu_model:
            bits.append(fmt.clean(s.gpu_model))
        span = f"{fmt.utc(s.started_ns)} .. {fmt.utc(s.stopped_ns) if s.stopped_ns else 'recording'}"
        paragraph(console, f"{', '.join(bits)}; {span}", names, f"session {s.session_id}: ")
    w = report.window
    whole = report.info.window
    if whole is None:
        console.print(Text("empty trace: no sessions, CUDA calls, scheduler rows or snapshots yet", style="bold"))
        return
    label = ("whole trace" if whole == w
             else f"{fmt.rel(w.start_ns, whole.start_ns)} .. {fmt.rel(w.end_ns, whole.start_ns)} of the trace")
    paragraph(console, f"{fmt.utc(w.start_ns)} .. {fmt.utc(w.end_ns)} ({w.duration_ns / 1e9:,.1f} s, {label})", names,
              "window: ")
    for line in cost_lines(report.info.tracing, lambda v: fmt.clean(v or "?", 400)):  # v4: tracing cost, launches
        indent = len(line) - len(line.lstrip())
        paragraph(console, line.strip(), names, " " * indent, " " * (indent + 2))
    for note in report.notes:
        paragraph(console, fmt.clean(note, 4000), names, "note: ", style="italic")


def chain_panel(chain: CausalChain, start_ns: int, console: Console | None = None) -> Panel:
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
        inner = (console.width if console else 100) - 4  # the panel's border and padding
        cols = [Column("fact", right=False, wrap=True), Column("value", wrap=True),
                Column("unit", right=False, wrap=True)]
        for e in chain.evidence:
            value = f"{e.value:,}" if isinstance(e.value, int) else str(e.value)
            for c, v in zip(cols, (fmt.clean(e.name, CELL_CAP), fmt.clean(value, CELL_CAP), fmt.clean(e.unit))):
                c.cells.append(v)
        parts.append(Text("Evidence", style="bold"))
        parts.extend(layout(cols, inner, rule=None))
    code = frames_lines(chain.frames, (console.width if console else 100) - 4)
    if code:
        parts.append(Text("Code\n", style="bold").append("\n".join(code) + "\n", style=""))
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
    return Panel(Group(*parts), title=title, title_align="left", expand=True,
                 box=panel_box(console) if console else box.ROUNDED)


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
    console.print(chain_panel(chain, start_ns, console))
    if show_sql:
        for line in sql_lines(chain):
            console.print(line, soft_wrap=True)


def stats_table(console: Console, stats: list[OpStats], names: list[str], limit: int | None = 15) -> None:
    """Top CUDA ops by total time: every row, both API layers (the notes say which calls another call holds)."""
    sampled = any(s.from_sample for s in stats)
    counted = any(s.total_count is not None for s in stats)
    title = "Top CUDA ops" + ((" (percentiles from the stored sample; "
                               + ("counts and totals from aggregates)" if counted else "counts of the stored rows)"))
                              if sampled else "")
    cols = [Column("op (api)", right=False, wrap=True), Column("calls"), Column("total"), Column("share"),
            Column("p50"), Column("p95"), Column("p99"), Column("max"), Column("p99/p50")]
    if sampled:
        cols.append(Column("stored"))
    for s in stats[:limit] if limit else stats:
        calls = s.total_count if s.total_count is not None else s.count
        lb = ">= " if s.lower_bound else ""
        unknown = s.total_ns is None and s.entry_only  # every call entry-only: unknown, not 0
        d = (lambda _v: "-") if unknown else fmt.ns3
        row = [f"{fmt.clean(s.op)} ({fmt.clean(s.api, 20)})", lb + fmt.count(calls), lb + d(s.total_ns),
               "-" if s.share_of_span is None else fmt.pct(s.share_of_span),
               d(s.p50_ns), d(s.p95_ns), d(s.p99_ns), d(s.max_ns),
               f"{s.p99_ns / s.p50_ns:,.1f}x" if s.p50_ns and s.p99_ns is not None else "-"]
        if sampled:
            row.append(fmt.count(s.count))
        for c, v in zip(cols, row):
            c.cells.append(v)
    captions = ["total: the calls' durations summed over threads; share: of the window"]
    if any(s.total_ns is None and s.entry_only for s in stats):
        captions.append("- : probed entry-only (kernel launches): counted, durations unknown")
    if any(s.nested for s in stats):
        captions.append("a call made inside another call of its thread (a runtime call's driver call) has a row in "
                        "both layers: " + ", ".join(f"{fmt.count(s.nested)} {fmt.clean(s.op, 48)}"
                                                    for s in stats if s.nested))
    if any(s.lower_bound for s in stats):
        captions.append(">= : a lower bound (the aggregates did not count every stored row, or the window cuts a "
                        "bucket)")
    print_table(console, title, cols, names, "; ".join(captions))


def processes_table(console: Console, procs: list[ProcessBreakdown], names: list[str], limit: int | None = 12) -> None:
    """One line per process, in two tables that fit a terminal: its CPU time (summed over its threads: thread-seconds)
    and CUDA calls; its family and memory."""
    shown = procs[:limit] if limit else procs
    cpu = [Column("pid"), Column("comm", right=False, wrap=True), Column("CUDA calls"), Column("ctx switches"),
           Column("off-CPU"), Column("preempted"), Column("blocked"), Column("worst stall")]
    family = [Column("pid"), Column("comm", right=False, wrap=True), Column("ppid"),
              Column("children", right=False, wrap=True), Column("page allocs"), Column("alloc bytes"),
              Column("counted from", right=False, wrap=True)]
    for p in shown:
        comm = fmt.clean(p.comm, 64) + (" [the collector]" if p.is_collector else "")
        lb = ">= " if p.switches_lower_bound else ""
        switches = "-" if p.counts_from == "none" else lb + fmt.count(p.context_switches)
        off = (lb if p.off_cpu_ns is not None else "") + fmt.secs(p.off_cpu_ns)
        for c, v in zip(cpu, (str(p.pid), comm, fmt.count(sum(o.count for o in p.ops)), switches, off,
                              fmt.secs(p.preempted_ns), fmt.secs(p.blocked_ns), fmt.ns3(p.worst_stall_ns))):
            c.cells.append(v)
        ppid = "-" if p.ppid is None else str(p.ppid)
        source = p.counts_from + (" + imported I/O" if p.known_from else "")
        for c, v in zip(family, (str(p.pid), comm, ppid, fmt.pid_ranges(p.children, 2), fmt.count(p.page_allocs),
                                 fmt.nbytes(p.page_alloc_bytes), source)):
            c.cells.append(v)
    notes = []
    if limit and len(procs) > limit:
        notes.append(f"{len(procs) - limit} more processes: --per-process shows all")
    if any(p.switches_lower_bound for p in shown):
        notes.append(">= : a lower bound (the aggregates counted fewer than the stored rows, or none were stored)")
    if any(p.off_cpu_ns is None for p in shown):
        notes.append("- : not recorded (unknown, not zero)")
    if any(p.is_collector for p in shown):
        notes.append("the collector (this project's `ingero-mcp trace`) is ranked last")
    print_table(console, "Processes: CPU (off-CPU, preempted (waiting for a CPU) and blocked (sleeping): summed over "
                "the process's threads, in thread-seconds)", cpu, names, "; ".join(notes) or None)
    print_table(console, "Processes: family and memory", family, names)


def process_detail(p: ProcessBreakdown, console: Console | None = None) -> Panel:
    """A process with its CUDA ops (for --per-process)."""
    t = Text()
    t.append(f"{fmt.clean(p.cmdline or p.comm or '?', 300)}\n")
    t.append(f"parent {p.ppid if p.ppid is not None else '-'}; children {fmt.pid_ranges(p.children, 50) or '-'}; "
             + ("this is the collector (ingero-mcp trace), ranked last; " if p.is_collector else "")
             + ("context switches not recorded; " if p.counts_from == "none" else
                f"context switches {'>= ' if p.switches_lower_bound else ''}{fmt.count(p.context_switches)} "
                f"({p.counts_from}"
                + (", a lower bound" if p.switches_lower_bound else "") + "); ")
             + "off-CPU, summed over its threads, "
             + ("not recorded" if p.off_cpu_ns is None else
                ('>= ' if p.switches_lower_bound else '') + fmt.secs(p.off_cpu_ns) + " thread-seconds") + " "
             + (f"(on-CPU {fmt.secs(p.on_cpu_ns)} thread-seconds from the aggregates) " if p.on_cpu_ns is not None
                else "")
             + f"(preempted {fmt.secs(p.preempted_ns)}, blocked {fmt.secs(p.blocked_ns)} thread-seconds); "
             + f"worst stall {fmt.ns(p.worst_stall_ns)}"
             + (f" at {fmt.utc(p.worst_stall_ts_ns)}" if p.worst_stall_ts_ns else "")
             + (f" in thread {p.worst_stall_tid} ({fmt.clean(p.worst_stall_thread or 'name not recorded', 32)}; "
                f"{p.worst_stall_role})" if p.worst_stall_tid is not None else "")
             + f"; page allocations {'not recorded' if p.page_allocs is None else fmt.count(p.page_allocs)}"
             + (f" ({fmt.nbytes(p.page_alloc_bytes)})" if p.page_alloc_bytes is not None else "")
             + (f"; exited {fmt.utc(p.exit_ns)}" if p.exit_ns else "")
             + "".join(f"; known from {fmt.clean(k, 300)} (not analysed yet)" for k in p.known_from) + "\n")
    parts: list[object] = [t]
    if p.ops:
        cols = [Column(h, right=h != "op", wrap=h == "op") for h in ("op", "calls", "total", "p50", "p99", "max")]
        for o in p.ops:
            d = fmt.ns3 if o.total_ns is not None or not o.entry_only else (lambda _v: "entry-only")  # unknown, not 0
            for c, v in zip(cols, (fmt.clean(o.op), fmt.count(o.count), d(o.total_ns), d(o.p50_ns), d(o.p99_ns),
                                   d(o.max_ns))):
                c.cells.append(v)
        parts.extend(layout(cols, (console.width if console else 100) - 4, rule=None))
    return Panel(Group(*parts), title=Text(f"pid {p.pid} {fmt.clean(p.comm, 32)}"), title_align="left",
                 box=panel_box(console) if console else box.ROUNDED)


def accounting_table(console: Console, report: Report, names: list[str]) -> None:
    """Where the time of each feeding thread (and of the threads it waited on) went, as shares of its wall time."""
    acc = report.accounting
    cols = [Column("thread", right=False, wrap=True), Column("wall"), Column("running outside CUDA"),
            Column("on CPU in CUDA"), Column("asleep in CUDA"), Column("sleep outside"), Column("of it IO"),
            Column("CPU wait"), Column("unknown"), Column("launches + copies")]
    for t in (acc.threads if acc else [])[:12]:
        a = t.total
        pct = (lambda ns: f"{100 * ns / a.wall_ns:.1f}%" if a.wall_ns else "-")
        name = f"{fmt.clean(t.comm or t.process_comm or '?', 64)}[{t.pid}" + ("]" if t.tid == t.pid else f"/{t.tid}]")
        role = "" if t.role == "feeder" else f" ({fmt.clean(t.role, 20)})"
        for c, v in zip(cols, (name + role, fmt.ns3(a.wall_ns), pct(a.run_outside_ns), pct(a.run_inside_ns),
                               pct(a.sleep_inside_ns), pct(a.sleep_outside_ns), pct(a.sleep_io_ns), pct(a.cpu_wait_ns),
                               pct(a.off_cpu_unknown_ns), ("~" if acc.estimated else "") + fmt.count(a.work_calls))):
            c.cells.append(v)
    captions = ["on CPU in CUDA: inside CUDA calls on a CPU (a synchronising call spins there while the GPU works, a "
                "wait for the GPU too); asleep in CUDA: asleep inside them, waiting for the GPU; the threads that fed "
                "the GPU first, then those they waited on"]
    if acc and acc.entry_only_launches:
        captions.append("running outside CUDA includes kernel launches (probed entry-only)")
    if acc and acc.estimated:
        coverage = 100 * (acc.launch_coverage or 0)
        captions.append(f"~ : estimated: the launch probes were attached {coverage:.0f}% of the time (probe_gaps); "
                        "launches seen are scaled per second by the coverage")
    print_table(console, "Time accounting (share of each thread's wall time; thread_seconds)", cols, names,
                "; ".join(captions))


def imported_table(console: Console, imp: ImportedAccounting, names: list[str]) -> None:
    """An import's threads: their scheduler rows against Ingero's counts, and where the time of the complete ones
    went (imported_accounting.py; off-CPU is not split into sleeping and waiting for a CPU)."""
    cols = [Column("thread", right=False, wrap=True), Column("feeds GPU", right=False), Column("switch rows"),
            Column("counted"), Column("accounted"), Column("on-CPU"), Column("off-CPU"), Column("unknown"),
            Column("status", right=False, wrap=True)]
    for t in imp.threads[:12]:
        name = f"{fmt.clean(t.comm or t.process_comm or '?', 64)}[{t.pid}" + ("]" if t.tid == t.pid else f"/{t.tid}]")
        shown = t.accountable
        figures = ((fmt.ns3(t.accounted_ns), f"{100 * t.on_cpu_share:.1f}%", fmt.ns3(t.off_cpu_ns),
                    fmt.ns3(t.unknown_ns)) if shown else ("-",) * 4)
        for c, v in zip(cols, (name, "yes" if t.feeds_gpu else "", fmt.count(t.switch_rows),
                               "-" if t.switches_counted is None else fmt.count(t.switches_counted), *figures,
                               "accounted" if shown else fmt.clean(short_why(t), 300))):
            c.cells.append(v)
    print_table(console, "Imported threads, accounted from their own scheduler rows where complete", cols, names,
                f"{len(imp.threads) - 12} more in `explain --json` (accounting.imported)" if len(imp.threads) > 12
                else None)


def render_report(console: Console, report: Report, db: str, *, per_process: bool = False,
                  show_sql: bool = False) -> None:
    """The whole incident report (`explain --full`): header, verdict, accounting, chains (ours, then imported), top
    ops, host events, processes."""
    start = report.info.window.start_ns if report.info.window else report.window.start_ns
    names = traced_names(report)
    # Text outside boxes is wrapped so that no line starts with a traced name; inside tables and panels every line
    # starts with the border.
    header(console, report, db, names)
    if report.info.window is None:
        return
    if report.verdict:
        console.print()
        console.print(Text("Verdict", style="bold underline"))
        for line in report.verdict:
            style = SEVERITY_STYLE.get(line.split(":", 1)[0], "")
            paragraph(console, fmt.clean(line, 2000), names, style=style)
    if report.accounting and report.accounting.complete and report.accounting.threads:
        accounting_table(console, report, names)
    if report.accounting and report.accounting.imported and report.accounting.imported.threads:
        imported_table(console, report.accounting.imported, names)
    own = [c for c in report.chains if c.origin == "ingero-mcp"]
    imported = [c for c in report.chains if c.origin != "ingero-mcp"]
    if own:
        console.print(Text(f"Causal chains found by ingero-mcp: {len(own)}", style="bold underline"))
        for c in own:
            print_chain(console, c, start, show_sql)
    elif report.accounting and report.accounting.imported:  # an import: the verdict says what could be accounted
        paragraph(console, "No causal chain of ours: no thread that fed the GPU could be accounted (the verdict says "
                  "why).", names, style="bold")
    else:
        paragraph(console, "No causal chain: no part of the feeding threads' time grew in a slow phase or filled idle "
                  "GPU time beyond 1% of the feeding time.", names, style="bold green")
    if report.minor:
        console.print(Text("Minor (each explains under 1% of the feeding time)", style="bold"))
        for line in report.minor[:10]:
            paragraph(console, fmt.clean(line, 400), names, "  ", "    ")
    if imported:
        console.print(Text(f"Chains stored by {fmt.clean(imported[0].origin, 20)} (imported; not recomputed): "
                           f"{len(imported)} kinds", style="bold underline"))
        for c in imported:
            print_chain(console, c, start, show_sql)
    if report.stats:
        stats_table(console, report.stats, names)
    if report.host:
        cols = [Column("event", right=False, wrap=True), Column("source", right=False, wrap=True), Column("count"),
                Column("pids"), Column("duration"), Column("bytes")]
        for h in report.host[:12]:
            for c, v in zip(cols, (fmt.clean(h.op), fmt.clean(h.source), fmt.count(h.count), fmt.count(h.pids),
                                   fmt.secs(h.sum_duration_ns), fmt.nbytes(h.sum_bytes) if h.sum_bytes else "-")):
                c.cells.append(v)
        print_table(console, "Host events (exact counts from host_aggregates; duration: summed over tasks, in "
                    "thread-seconds; for sched_switch, the on-CPU time of the slices it ended)", cols, names)
    if report.processes:
        processes_table(console, report.processes, names, None if per_process else 12)
        if per_process:
            for p in report.processes:
                console.print(process_detail(p, console))
