"""`explain` by default: the answer on one screen. What happened (the verdict, the progress), each finding with its
window, culprit and one fix, a short table of the top CUDA ops (each logical call counted once), the tracing cost
in a line, a few short notes, and where the detail is (`--full`, `--sql`, `report`, `mcp`).

Every line starts with this renderer's own words or indent, never with traced text (render/wrap.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text

from ingero_mcp.analysis import recommend
from ingero_mcp.analysis import Accounting, CausalChain, Culprit, OpStats, Phase, Report, ThreadAccount
from ingero_mcp.render import fmt
from ingero_mcp.render.frames import code_sentence
from ingero_mcp.render.table import Column, layout
from ingero_mcp.render.traced import traced_names
from ingero_mcp.render.wrap import protected_spans, wrap

OWN_WORK = frozenset({recommend.HOST_BOUND})  # causes whose culprit is the feeding thread's own work
SEVERITY_STYLE = {"HIGH": "bold red", "MEDIUM": "bold yellow", "LOW": "cyan"}
FINDING_SEVERITIES = ("HIGH", "MEDIUM")
OPS_SHOWN = 3
FINDINGS_DETAILED = 2  # findings told in full (what was seen, who, fix); the later ones without what was seen
CULPRITS_SHOWN = 3
CULPRIT_MIN_SHARE = 0.05  # culprits under this share of the first one's time are left to --full
NOTES_SHOWN = 3
NOTE_HEAD_MIN = 24  # a note's headline ends at its first " (", ": " or "; " from this many characters on


@dataclass
class Page:
    """Lines being laid out at a width, with the traced strings no line may start with."""

    width: int
    names: list[str]
    lines: list[Text] = field(default_factory=list)

    def para(self, text: str, first: str = "", rest: str | None = None, style: str = "", first_style: str = "") -> None:
        """A paragraph of (cleaned) text, wrapped; `first` opens it (the renderer's own words)."""
        for i, line in enumerate(wrap(text, self.width, first, rest, self.names)):
            t = Text()
            if i == 0 and first:
                t.append(first, style=first_style or style)
                t.append(line[len(first):], style=style)
            else:
                t.append(line, style=style)
            self.lines.append(t)

    def line(self, text: str = "", style: str = "") -> None:
        """A line of the renderer's own (no traced text in it, or short enough not to wrap)."""
        self.lines.append(Text(text, style=style))


def origin_ns(report: Report) -> int:
    """Second 0 of the trace, as the analysis counts '+N s' (the earliest session start, else the window's)."""
    starts = [s.started_ns for s in report.info.sessions]
    return min(starts) if starts else report.window.start_ns


def rel_s(ns: int, t0: int) -> str:
    """'+12.0 s': a moment in seconds from the trace's second 0, as the chains say it."""
    return f"+{(ns - t0) / 1e9:,.1f} s"


def thread_name(t: ThreadAccount) -> str:
    """'python3[2111]' or 'pt_data_pin[2111/2159]', as the analysis names threads."""
    comm = fmt.clean(t.comm or t.process_comm or "?", 64)
    return f"{comm}[{t.pid}]" if t.tid == t.pid else f"{comm}[{t.pid}/{t.tid}]"


def culprit_name(c: Culprit) -> str:
    """A culprit as the analysis names tasks: comm[pid], comm[pid/tid] or comm[tids]."""
    comm = fmt.clean(c.comm or "?", 64)
    if c.pid is not None:
        if len(c.tids) == 1 and c.tids[0] != c.pid:
            return f"{comm}[{c.pid}/{c.tids[0]}]"
        return f"{comm}[{c.pid}]"
    return f"{comm}[{fmt.pid_ranges(c.tids, 2)}]" if c.tids else comm


def _named_once(culprits: list[Culprit]) -> list[tuple[str, str, Culprit]]:
    """Each task once (a merged chain may name one twice: its largest share), and processes of one name and relation
    as one (175 nvidia-smi children each ending 25 ms of sleep are one culprit of 4.4 s), with their summed time."""
    ranked: dict[tuple[str, str], tuple[str, str, Culprit]] = {}
    procs: dict[tuple[str, str], list[Culprit]] = {}
    for c in sorted(culprits, key=lambda c: -c.ns):
        key = (culprit_name(c), c.relation)
        if key in ranked:
            continue
        ranked[key] = (key[0], fmt.clean(c.relation, 40) or "related", c)
        if c.pid is not None and c.relation.endswith("process") and c.relation != "same process":
            procs.setdefault((c.comm or "?", c.relation), []).append(c)
    for (comm, relation), group in procs.items():
        pids = sorted({int(c.pid) for c in group if c.pid is not None})
        if len(pids) < 2:
            continue
        for c in group:
            ranked.pop((culprit_name(c), relation))
        name = f"{fmt.clean(comm, 64)}[{fmt.pid_ranges(pids, 2)}]"
        ranked[(name, relation)] = (name, f"{len(pids)} {fmt.clean(relation, 40)}es",
                                    group[0].model_copy(update={"ns": sum(c.ns for c in group)}))
    lead = culprits[0] if culprits else None  # the one the analysis blames comes first, then by time
    return sorted(ranked.values(), key=lambda nc: (not _same(nc[2], lead), -nc[2].ns))


def _same(c: Culprit, lead: Culprit | None) -> bool:
    """Whether an entry stands for the lead culprit (itself, or the group of processes it is one of)."""
    return lead is not None and c.pid is not None and c.relation == lead.relation and (
        c.pid == lead.pid and c.tids[:1] == lead.tids[:1] or c.relation.endswith("process") and c.comm == lead.comm
        and c.relation != "same process")


def culprits_text(chain: CausalChain, room: int = 10_000) -> str:
    """The culprit the finding blames, then the few that account for most of its time (as many as fit in `room`
    characters, at least one; each task once, processes of one name as one), with how many more --full names."""
    ranked = _named_once(chain.culprits)
    most = max((nc[2].ns for nc in ranked), default=0)
    shown = [nc for i, nc in enumerate(ranked) if not i or nc[2].ns >= CULPRIT_MIN_SHARE * most][:CULPRITS_SHOWN]
    text = ""
    for n in range(len(shown), 0, -1):
        parts = [f"{name} ({relation}, {c.ns / 1e9:,.2f} s)" for name, relation, c in shown[:n]]
        more = len(ranked) - n
        text = ", ".join(parts) + (f"; +{more} more" if more else "")
        if len(text) <= room:
            break
    return text


def header(page: Page, report: Report, db: str) -> bool:
    """The trace, its window and host; False when it is empty (nothing more to say)."""
    page.para(fmt.clean(db, 300), "ingero-mcp explain: ", style="bold")
    whole = report.info.window
    if whole is None:
        page.line("empty trace: no sessions, CUDA calls, scheduler rows or snapshots yet", style="bold")
        return False
    w = report.window
    t0 = origin_ns(report)
    span = "whole trace" if whole == w else f"{rel_s(w.start_ns, t0)} to {rel_s(w.end_ns, t0)}"
    window = f"window: {w.duration_ns / 1e9:,.1f} s ({span}) from {fmt.utc(w.start_ns)}"
    if report.info.live:
        window += ", still recording"
    sessions = report.info.sessions
    host = ""
    if len(sessions) == 1:
        s = sessions[0]
        host = ", ".join(b for b in (fmt.clean(s.host, 64), f"{s.cpu_count} CPUs" if s.cpu_count else "",
                                     fmt.clean(s.gpu_model, 64)) if b)
    elif sessions:
        window += f"; {len(sessions)} sessions (--full lists them)"
    if host and len(window) + len(host) + 8 <= page.width:
        page.para(f"{window}; host {host}")
    else:
        page.para(window)
        if host:
            page.para(host, "host: ")
    return True


def rate(value: float) -> str:
    """A rate with the precision the chains give it: 104, 6.1, 0.28."""
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:,.1f}" if abs(value) >= 1 else f"{value:,.2f}"


def progress_line(t: ThreadAccount, acc: Accounting, t0: int, named: bool) -> str | None:
    """How fast the process progressed: its baseline rate and each slow or stalling stretch, in its unit
    (iterations/s where a call marks them), and how busy the GPU was in its seconds."""
    phases = [p for p in acc.phases if p.pid == t.pid]
    slow = [p for p in phases if p.kind in ("slow", "recurrent")]
    unit = next((p.unit for p in phases), None)
    parts: list[str] = []
    base = next((p.work_rate * p.slowdown for p in slow if p.slowdown), None)
    if base is None:
        base = max((p.work_rate for p in phases if p.kind == "baseline"), default=None)
    if base is not None and unit:
        # its own baseline rate, not a judgement: a job host-bound all along is 'steady' at a rate that is no good
        parts.append(f"{rate(base)} {unit} at its baseline" + ("" if slow else ", steady"))
    for p in slow[:2]:
        parts.append(_phase_text(p, t0, short=p.unit == unit and base is not None))
    if len(slow) > 2:
        parts.append(f"{len(slow) - 2} more slow stretches: --full")
    util = [s.gpu_util_percent for s in t.seconds if s.gpu_util_percent is not None]
    if util:
        parts.append(f"GPU {sum(util) / len(util):.0f}% busy")
    if not parts:
        return None
    return "progress" + (f" of {thread_name(t)}" if named else "") + ": " + "; ".join(parts) + "."


def _phase_text(p: Phase, t0: int, short: bool = False) -> str:
    """A slow or stalling stretch: its rate (in '/s' when `short`: the unit was just said) and window."""
    when = f"from {rel_s(p.window.start_ns, t0)} to {rel_s(p.window.end_ns, t0)}"
    if p.kind == "recurrent":
        every = f" every {p.period_s:,.1f} s" if p.period_s else ""
        lost = f", {p.lost_s:,.1f} s of work lost" if p.lost_s else ""
        n = len(p.episodes)
        kind = "short stall" if not p.stretches else "stall"  # stretches: slow phases that recurred alike
        return f"{n} {kind}{'s' if n != 1 else ''} {when}{every} ({rate(p.work_rate)} {p.unit} in them{lost})"
    slower = f" ({p.slowdown:,.1f}x slower)" if p.slowdown else " (stopped)"
    unit = "/s" if short and p.unit.endswith("/s") else f" {p.unit}"
    return f"{rate(p.work_rate)}{unit} {when}{slower}"


def what_happened(page: Page, report: Report, findings: list[CausalChain]) -> None:
    """The verdict's lines that are not findings (who fed the GPU, or why nothing could be said), then progress."""
    shown = {f"{c.severity}: {c.summary}" for c in findings}
    lines = [v for v in report.verdict if not any(v.startswith(s) for s in shown)]
    page.line("Verdict", style="bold underline")
    for v in lines:
        page.para(fmt.clean(v, 2000), "  ")
    acc = report.accounting
    if acc is not None and acc.complete and acc.threads:
        from ingero_mcp.analysis import pace_threads

        t0 = origin_ns(report)
        seen: set[int] = set()
        paced = pace_threads(acc)
        for t in paced:
            if t.pid in seen:
                continue
            seen.add(t.pid)
            text = progress_line(t, acc, t0, named=len({p.pid for p in paced}) > 1)
            if text:
                page.para(text, "  ")
            if len(seen) >= 2:
                break


def fix_text(chain: CausalChain, names: list[str]) -> str:
    """The chain's first recommendation; where it opens by restating the finding (it starts with the summary's
    first word, the thread's name), the action after that restatement (its first ': ' outside brackets and names)."""
    fix = fmt.clean(chain.recommendations[0], 1000)
    summary = fmt.clean(chain.summary, 2000)
    if not summary or fix.split(" ", 1)[0] != summary.split(" ", 1)[0]:
        return fix
    spans = protected_spans(fix, names)
    depth = 0
    for i, ch in enumerate(fix):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if depth == 0 and fix.startswith(": ", i) and not any(lo <= i < hi for lo, hi in spans):
            action = fix[i + 2:].strip()
            return action[:1].upper() + action[1:] if action else fix
    return fix


def finding(page: Page, n: int, chain: CausalChain, t0: int, fixes: dict[str, int], detailed: bool = True) -> None:
    """One finding: severity, cause, window and time explained (and the culprit where no other task is named), then
    what was seen (when `detailed`), the culprits and the first fix."""
    named = any(c.ns > 0 for c in chain.culprits)
    facts = []
    if chain.window:
        facts.append(f"{rel_s(chain.window.start_ns, t0)} to {rel_s(chain.window.end_ns, t0)}")
    if chain.seconds_lost is not None:
        facts.append(f"{chain.seconds_lost:,.1f} s of feeding time")
    if not named:
        facts.append("culprit: its own work" if chain.root_cause in OWN_WORK else "no culprit task named")
    head = f"{n}. {chain.severity} {fmt.clean(chain.root_cause, 60)}"
    page.para(", ".join(facts), head + (": " if facts else ""), "   ",
              first_style=SEVERITY_STYLE.get(chain.severity, ""))
    if detailed:
        page.para(fmt.clean(chain.summary, 2000), "   what: ", "   ", first_style="bold")
    if named:
        page.para(culprits_text(chain, page.width - len("   who: ")), "   who: ", "   ", first_style="bold")
    code = code_sentence(chain.frames)
    if code:
        page.para(code, "   code: ", "   ", first_style="bold")
    if chain.recommendations:
        fix = fix_text(chain, page.names)
        if fix in fixes:
            fix = f"as in {fixes[fix]}."
        else:
            fixes[fix] = n
        page.para(fix, "   fix: ", "   ", first_style="bold")


def also_line(report: Report, findings: list[CausalChain]) -> str | None:
    """The rest in one line: LOW findings (cause and time explained), minor causes, imported chains."""
    low = [c for c in report.chains if c.origin == "ingero-mcp" and c not in findings]
    imported = [c for c in report.chains if c.origin != "ingero-mcp"]
    parts = []
    if low:
        each = [fmt.clean(c.root_cause, 60) + (f" {c.seconds_lost:,.1f} s" if c.seconds_lost is not None else "")
                for c in low[:3]]
        parts.append(f"{len(low)} LOW finding{'s' if len(low) > 1 else ''} (" + ", ".join(each)
                     + (", ..." if len(low) > 3 else "") + ")")
    if report.minor:
        parts.append(f"{len(report.minor)} minor cause{'s' if len(report.minor) > 1 else ''}")
    if imported:
        parts.append(f"{len(imported)} chain kind{'s' if len(imported) > 1 else ''} stored by "
                     f"{fmt.clean(imported[0].origin, 20)}, each checked against the rows")
    return ("Also " + ", ".join(parts) + ": --full.") if parts else None


def own_calls(s: OpStats) -> int:
    """Calls of the op not made inside another call of their thread (a runtime call's driver call is counted once,
    in the runtime call's row)."""
    calls = s.total_count if s.total_count is not None else s.count
    return max(0, calls - s.nested)


def ops_table(page: Page, stats: list[OpStats]) -> None:
    """The top CUDA ops by time, each logical call counted once (calls made inside another call of their thread
    are folded out: they are in the outer call's row and time)."""
    rows = [s for s in stats if own_calls(s) > 0][:OPS_SHOWN]
    if not rows:
        return
    folded = [s for s in stats if s.nested]
    sampled = any(s.from_sample for s in stats)
    entry_only = any(s.total_ns is None and s.entry_only for s in rows)

    def d(s: OpStats, v: int | None) -> str:
        return "-" if (s.total_ns is None and s.entry_only) or v is None else fmt.ns(v)

    cols = [Column("calls"), Column("time in calls"), Column("share", drop=2), Column("p50", drop=3),
            Column("p99", drop=1), Column("max", drop=4), Column("op", right=False)]
    for s in rows:
        lb = ">= " if s.lower_bound else ""
        mark = "*" if s.nested else ""
        values = [lb + fmt.count(own_calls(s)) + mark, lb + d(s, s.total_ns),
                  "-" if s.share_of_span is None else fmt.pct(s.share_of_span), d(s, s.p50_ns), d(s, s.p99_ns),
                  d(s, s.max_ns), fmt.clean(s.op, 48) + f" ({fmt.clean(s.api, 12)})"]
        for c, v in zip(cols, values):
            c.cells.append(v)
    shown = len([s for s in stats if own_calls(s) > 0])
    title = "Top CUDA ops by time in calls (summed over threads; share: of the window)"
    page.para(title + (f", {shown - len(rows)} more in --full" if shown > len(rows) else ""), style="bold underline")
    page.lines += layout(cols, page.width, gutter="  ", header_style="", rule=None, short=True)
    notes = []
    if folded:
        n = sum(s.nested for s in folded)
        ops = ", ".join(fmt.clean(s.op, 48) for s in folded[:3]) + (", ..." if len(folded) > 3 else "")
        notes.append(f"counted once: {n:,} calls made inside another call of their thread ({ops}) are folded into "
                     "that call's row" + ("; * the time includes them" if any(s.nested for s in rows) else ""))
    if entry_only:
        notes.append("- : launches probed entry-only, counted without durations")
    if sampled:
        notes.append("an import: counts from its per-minute aggregates, percentiles from the stored sample")
    if notes:
        page.para("; ".join(notes) + ".", "  ")


def cost_line(report: Report, more: str = ": --full") -> str:
    """What tracing cost, in one line: the estimate's share of the session; `more` says where the detail and caveats
    are (--full)."""
    t = report.info.tracing
    if t is None:
        return "tracing cost: not recorded in this store (a collector before schema v4, or an import)."
    wall = (t.wall_ns or 0) / 1e9
    if t.total_share is not None:
        total = ((t.added_ns or 0) + (t.sched_added_ns or 0) + (t.page_added_ns or 0) + (t.sample_added_ns or 0)) / 1e9
        return (f"tracing cost: ~{100 * t.total_share:.2f}% by its estimate ({total:,.2f} s over {wall:,.1f} s), "
                f"not an upper bound{more}")
    share = "?" if t.share is None else f"{100 * t.share:.2f}%"
    parts = (("the scheduler records'", t.sched_added_ns is not None or not t.off_cpu_intervals),
             ("the page allocations'", t.page_added_ns is not None or not t.page_allocs),
             ("the stack sampler's", t.sample_added_ns is not None or not t.samples))
    unknown = [what for what, known in parts if not known] or ["the tracepoints'"]
    part = " and ".join(unknown) + (" parts" if len(unknown) > 1 else " part")
    return f"tracing cost: ~{share} by the CUDA probes' estimate, {part} not measured{more}"


def note_headline(note: str) -> str:
    """A note's first clause: up to its first ' (', ': ' or '; ' at or after NOTE_HEAD_MIN characters."""
    cut = len(note)
    for sep in (" (", ": ", "; "):
        at = note.find(sep, NOTE_HEAD_MIN)
        if at >= 0:
            cut = min(cut, at)
    return note[:cut].rstrip(" .,;:")


def notes_para(report: Report) -> str | None:
    """At most a few short notes: how launches were recorded, then each note's first clause; the rest in --full."""
    heads: list[str] = []
    acc = report.accounting
    entry_only = (acc is not None and acc.entry_only_launches) or bool(report.info.tracing
                                                                         and report.info.tracing.entry_only_launches)
    if entry_only:
        heads.append("launches probed entry-only (counted; their time is in running outside CUDA calls)")
    for note in report.notes:
        head = note_headline(fmt.clean(note, 400))
        if entry_only and "probed entry-only" in head:
            continue  # said above
        if head and head not in heads:
            heads.append(head)
    if not heads:
        return None
    more = len(heads) - NOTES_SHOWN
    return "; ".join(heads[:NOTES_SHOWN]) + (f"; {more} more" if more > 0 else "") + "."


MORE = "more: --full (evidence, every table), --sql (the SQL of each number), report -o report.html, mcp"


def summary_lines(report: Report, db: str, width: int) -> list[Text]:
    """The default `explain` page as styled lines, each at most `width` columns unless a traced name or a number
    cannot break."""
    page = Page(width=width, names=traced_names(report))
    if not header(page, report, db):
        return page.lines
    findings = [c for c in report.chains if c.origin == "ingero-mcp" and c.severity in FINDING_SEVERITIES]
    t0 = origin_ns(report)
    page.line()
    what_happened(page, report, findings)
    page.line()
    if findings:
        page.line(f"Findings: {len(findings)}, the one that explains most first", style="bold underline")
        fixes: dict[str, int] = {}
        for n, c in enumerate(findings, 1):
            finding(page, n, c, t0, fixes, detailed=n <= FINDINGS_DETAILED)
    else:
        page.line("Findings: none HIGH or MEDIUM", style="bold underline")
    also = also_line(report, findings)
    if also:
        page.para(also)
    if report.stats:
        page.line()
        ops_table(page, report.stats)
    page.para(cost_line(report))
    notes = notes_para(report)
    if notes:
        page.para(notes, "notes: ")
    page.para(MORE)
    return page.lines

