"""The MCP tools' work, one function per tool: resolve the arguments (Ingero's names: since, pid, pids, top_n, limit;
`since` counts back from the trace's end), ask the analysis (through its facade) one question, fit the answer to the
result budget, and return both halves. server.py registers them with their descriptions and argument schemas.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Literal

import duckdb
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult

from ingero_mcp.analysis import ThreadAccount, TimeWindow
from ingero_mcp.mcp import render
from ingero_mcp.mcp.budget import (
    STRUCTURED_BUDGET,
    error_result,
    fit,
    guard,
    guarded,
    json_size,
    shrink,
    tool_result,
)
from ingero_mcp.mcp.chainview import fit_chains, rank
from ingero_mcp.mcp.handle import StoreHandle
from ingero_mcp.mcp.results import (
    AccountingResult,
    BreakdownResult,
    ChainsResult,
    ContextResult,
    EvidenceResult,
    InfoResult,
    PictureResult,
    SqlRows,
    StacksToolResult,
    StatsResult,
    TimelineResult,
)
from ingero_mcp.mcp.sql import DEFAULT_LIMIT, SqlError
from ingero_mcp.mcp.sqlworker import SqlWorker
from ingero_mcp.sanitize import DATA_NOTE, clean
from ingero_mcp.store import StoreError
from ingero_mcp.store.segments import describe, skipped_segments


def origin_of(whole: TimeWindow | None, window: TimeWindow | None) -> int | None:
    """The trace's first moment (the origin of every '+S s' offset), else the window's."""
    return whole.start_ns if whole else window.start_ns if window else None


def merged_pids(pid: int | None, pids: list[int] | None) -> list[int] | None:
    merged = sorted({*(pids or []), *([pid] if pid is not None else [])})
    return merged or None


def window_since(con: duckdb.DuckDBPyConnection, since: str | None) -> TimeWindow | None:
    from ingero_mcp.analysis import resolve_window

    return resolve_window(con, since=since) if since else None


def whole_trace(con: duckdb.DuckDBPyConnection) -> TimeWindow | None:
    from ingero_mcp.analysis import trace_window

    return trace_window(con)


@guarded(StatsResult)
def get_trace_stats(
    store: StoreHandle, since: str | None = None, pid: int | None = None, pids: list[int] | None = None, top_n: int = 50
) -> CallToolResult:
    """The get_trace_stats tool (its description is in server.py)."""
    from ingero_mcp.analysis import trace_info, trace_stats

    with store.connection() as con:
        window = window_since(con, since)
        chosen = merged_pids(pid, pids)
        stats = trace_stats(con, window, chosen)
        info = trace_info(con)
    notes = list(stats.notes)
    if chosen and not stats.pids:
        notes.append(f"no CUDA calls from pid(s) {chosen} in this window; get_per_process_breakdown lists the pids")
    result = StatsResult(
        window=stats.window,
        trace_window=info.window,
        calls=stats.calls,
        pids=stats.pids,
        ops=stats.ops[:top_n],
        host=stats.host[:50],
        sampled=stats.sampled,
        coverage=info.coverage,
        row_counts=info.row_counts,
        shown=min(top_n, len(stats.ops)),
        total=len(stats.ops),
        truncated=len(stats.ops) > top_n,
        notes=notes,
        trace_start_ns=origin_of(info.window, stats.window),
    )
    if len(stats.host) > 50:
        result.notes.append(f"{len(stats.host) - 50} of {len(stats.host)} host event totals left out")
    result = shrink(result, "ops")
    return tool_result(render.render_stats(result), result)


@guarded(ChainsResult)
def get_causal_chains(
    store: StoreHandle,
    since: str | None = None,
    pid: int | None = None,
    pids: list[int] | None = None,
    top_n: int = 10,
    include_sql: bool = False,
) -> CallToolResult:
    """The get_causal_chains tool (its description is in server.py)."""
    from ingero_mcp.analysis import causal_chains

    with store.connection() as con:
        window = window_since(con, since)
        whole = whole_trace(con)
        chosen = merged_pids(pid, pids)
        chains = rank(causal_chains(con, window, chosen))
    notes = []
    if chosen and not chains:
        notes.append(f"no chain involves pid(s) {chosen} in this window")
    window = window or whole or TimeWindow(start_ns=0, end_ns=0)
    origin = whole.start_ns if whole else window.start_ns
    result = ChainsResult(
        window=window,
        chains=[],
        shown=min(top_n, len(chains)),
        total=len(chains),
        truncated=len(chains) > top_n,
        notes=notes,
        trace_start_ns=origin,
    )
    if len(chains) > top_n:
        notes.append(f"{len(chains) - top_n} less severe chain(s) beyond top_n={top_n}; raise top_n to see them")
    # what the chains may use: the budgets less the rest of the result (and room for the notes fit adds)
    json_room = STRUCTURED_BUDGET - json_size(result) - 800
    text_room = render.TEXT_BUDGET - len("\n".join(render.chains_head(result, whole))) - 1000
    views, fit_notes = fit_chains(chains[:top_n], origin, json_room, text_room, include_sql)
    result.chains, result.shown = views, len(views)
    result.truncated = result.truncated or len(views) < min(top_n, len(chains))
    result.notes += fit_notes
    return tool_result(render.render_chains(result, whole), result)


# The parts of a thread's time get_time_accounting shows, as shares of its wall time (they sum to 100).
SHARES = ("run_outside_ns", "run_inside_ns", "sleep_inside_ns", "sleep_outside_ns", "sleep_io_ns", "cpu_wait_ns",
          "off_cpu_unknown_ns")


def thread_name(t: ThreadAccount) -> str:
    """comm[pid] for a process's main thread, comm[pid/tid] for another."""
    return f"{t.comm or t.process_comm or '?'}[{t.pid}" + ("]" if t.tid == t.pid else f"/{t.tid}]")


@guarded(AccountingResult)
def get_time_accounting(
    store: StoreHandle, since: str | None = None, pid: int | None = None, pids: list[int] | None = None
) -> CallToolResult:
    """The get_time_accounting tool (its description is in server.py)."""
    from ingero_mcp.analysis import account, recording_notes

    with store.connection() as con:
        window = window_since(con, since)
        whole = whole_trace(con)
        found = account(con, window, merged_pids(pid, pids))
    acc = found.accounting
    window = window or whole or TimeWindow(start_ns=0, end_ns=0)
    threads = [{"pid": t.pid, "tid": t.tid, "name": clean(thread_name(t), 120), "role": t.role,
                "wall_s": round(t.total.wall_ns / 1e9, 3), "work_calls": t.total.work_calls,
                "work_estimated": acc.estimated,
                "shares_percent": {p.removesuffix("_ns"): round(100 * t.total.share(p), 1) for p in SHARES}}
               for t in acc.threads]
    phases = [{"pid": ph.pid, "kind": ph.kind, "start_ns": ph.window.start_ns, "end_ns": ph.window.end_ns,
               "work_rate": ph.work_rate, "unit": ph.unit, "slowdown": ph.slowdown,
               "estimated": acc.estimated and ph.unit != "iterations/s",
               **({"episodes": len(ph.episodes), "period_s": ph.period_s, "lost_s": ph.lost_s,
                   "stretches": len(ph.stretches)}
                  if ph.kind == "recurrent" else {})}
              for ph in acc.phases]
    lines = [clean(v, 2000) for v in found.verdict]
    minor = found.minor
    result = AccountingResult(
        window=window,
        complete=acc.complete,
        verdict=lines,
        threads=threads[:12],
        phases=phases[:24],
        minor=[clean(m, 600) for m in minor[:10]],
        shown=min(len(threads), 12),
        total=len(threads),
        truncated=len(threads) > 12,
        notes=([acc.note] if acc.note else []) + recording_notes(acc),
        trace_start_ns=whole.start_ns if whole else window.start_ns,
    )
    return tool_result(render.render_accounting(result, whole), result)


@guarded(EvidenceResult)
def get_evidence_sql(
    store: StoreHandle,
    chain_id: str | None = None,
    since: str | None = None,
    pid: int | None = None,
    pids: list[int] | None = None,
) -> CallToolResult:
    """The get_evidence_sql tool (its description is in server.py)."""
    from ingero_mcp.analysis import causal_chains

    with store.connection() as con:
        window = window_since(con, since)
        whole = whole_trace(con)
        chains = causal_chains(con, window, merged_pids(pid, pids))
    wanted = (chain_id or "").strip().strip('"')
    chain = next((c for c in chains if not wanted or c.id == wanted or clean(c.id, 200) == wanted), None)
    if chain is None:
        ids = ", ".join(json.dumps(clean(c.id, 200), ensure_ascii=False) for c in chains[:20]) or (
            "none" if whole else "none (the trace is empty)"
        )
        asked = (f"no chain {json.dumps(clean(chain_id or '', 200), ensure_ascii=False)}" if wanted
                 else "no causal chain")
        raise ToolError(f"{asked} in this window; chains here: {ids}")
    window = window or whole or TimeWindow(start_ns=0, end_ns=0)
    evidence = [e.model_dump(mode="json") for e in chain.evidence]
    result = EvidenceResult(
        window=window,
        chain_id=chain.id,
        evidence=[],
        total=len(evidence),
        trace_start_ns=whole.start_ns if whole else window.start_ns,
    )
    keep = fit(result, evidence, lambda v: setattr(result, "evidence", v), STRUCTURED_BUDGET - 600)
    # the text half must hold the same items: drop from the end until it does
    while keep and len(render.render_evidence(result, whole)) > render.TEXT_BUDGET - 600:
        keep -= 1
        result.evidence = evidence[:keep]
    result.shown = keep
    if keep < len(evidence):
        result.truncated = True
        result.notes.append(
            f"only {keep} of the {len(evidence)} evidence items (with their SQL) fit in one "
            "result; the rest are in explain --sql"
        )
    return tool_result(render.render_evidence(result, whole), result)


@guarded(BreakdownResult)
def get_per_process_breakdown(
    store: StoreHandle, since: str | None = None, pid: int | None = None, pids: list[int] | None = None, top_n: int = 20
) -> CallToolResult:
    """The get_per_process_breakdown tool (its description is in server.py)."""
    from ingero_mcp.analysis import per_process_breakdown

    with store.connection() as con:
        window = window_since(con, since)
        whole = whole_trace(con)
        chosen = merged_pids(pid, pids)
        procs = per_process_breakdown(con, window, chosen)
    notes = []
    if chosen:
        missing = sorted(set(chosen) - {p.pid for p in procs})
        if missing:
            notes.append(f"no data for pid(s) {missing} in this window; call without pid to list the pids")
    for p in procs:
        if len(p.ops) > 30:
            p.ops = p.ops[:30]
        if len(p.children) > 100:
            notes.append(f"pid {p.pid}: {len(p.children) - 100} of {len(p.children)} children left out")
            p.children = p.children[:100]
    result = BreakdownResult(
        window=window or whole or TimeWindow(start_ns=0, end_ns=0),
        processes=procs[:top_n],
        shown=min(top_n, len(procs)),
        total=len(procs),
        truncated=len(procs) > top_n,
        notes=notes,
        trace_start_ns=origin_of(whole, window),
    )
    result = shrink(result, "processes")
    return tool_result(render.render_breakdown(result, whole), result)


@guarded(TimelineResult)
def get_timeline(
    store: StoreHandle,
    pid: int | None = None,
    tid: int | None = None,
    since: str | None = None,
    around: str | None = None,
    from_: str | None = None,
    to: str | None = None,
    limit: int = 100,
) -> CallToolResult:
    """The get_timeline tool (its description is in server.py)."""
    from ingero_mcp.analysis import resolve_window, thread_timeline

    with store.connection() as con:
        window = resolve_window(con, since=since, start=from_, end=to) if since or from_ or to else None
        whole = whole_trace(con)
        around_ns = None
        if around:  # every form the tools print ('+12.500000 s', a UTC time) reads as it is
            around_ns = resolve_window(con, start=around, end=around).start_ns
        tl = thread_timeline(con, pid=pid, tid=tid, window=window, around_ns=around_ns, limit=limit)
    notes = []
    if (pid is not None and not any(e.pid == pid for e in tl.entries)) or (
        tid is not None and not any(e.tid == tid for e in tl.entries)
    ):
        notes.append(
            "no events of this pid/tid in the window (only host snapshots, if any); "
            "get_per_process_breakdown lists the pids"
        )
    result = TimelineResult(
        timeline=tl,
        shown=len(tl.entries),
        total=tl.total_in_window,
        truncated=tl.truncated,
        notes=notes,
        trace_start_ns=origin_of(whole, tl.window),
    )
    entries = list(tl.entries)
    keep = fit(result, entries, lambda v: setattr(result.timeline, "entries", v))
    if keep < len(entries):
        result.shown, result.truncated = keep, True
        result.notes.append(
            f"only {keep} of the {len(entries)} events asked for fit in one result; lower limit or "
            "narrow the window"
        )
    return tool_result(render.render_timeline(result, whole), result)


@guarded(ContextResult)
def get_system_context(store: StoreHandle, since: str | None = None, max_points: int = 120) -> CallToolResult:
    """The get_system_context tool (its description is in server.py)."""
    from ingero_mcp.analysis import system_context

    with store.connection() as con:
        window = window_since(con, since)
        whole = whole_trace(con)
        ctx = system_context(con, window, max_points=max_points)
    result = ContextResult(
        context=ctx,
        shown=len(ctx.points),
        total=ctx.downsampled_from or len(ctx.points),
        trace_start_ns=origin_of(whole, ctx.window),
    )
    if json_size(result) > STRUCTURED_BUDGET:
        points = ctx.points
        step = 2
        while json_size(result) > STRUCTURED_BUDGET - 400 and step < len(points):
            result.context.points = points[::step]
            step *= 2
        result.shown, result.truncated = len(result.context.points), True
        result.notes.append(f"every {step // 2}th snapshot shown to keep the result small")
    return tool_result(render.render_context(result, whole), result)


def save_picture(
    store: StoreHandle,
    pictures: Path,
    kind: Literal["report", "perfetto"] = "report",
    chain_id: str | None = None,
    since: str | None = None,
    pid: int | None = None,
    pids: list[int] | None = None,
) -> CallToolResult:
    """The save_picture tool (its description is in server.py)."""

    def run() -> CallToolResult:
        from ingero_mcp.analysis import causal_chains

        chosen = merged_pids(pid, pids)
        with store.connection() as con:
            window = window_since(con, since)
            whole = whole_trace(con)
            if whole is None:
                raise ToolError("the trace is empty: there is nothing to draw")
            chain = None
            if chain_id:
                wanted = chain_id.strip().strip('"')
                found = causal_chains(con, window, chosen)
                chain = next((c for c in found if c.id == wanted or clean(c.id, 200) == wanted), None)
                if chain is None:
                    ids = ", ".join(json.dumps(clean(c.id, 200), ensure_ascii=False) for c in found[:20]) or "none"
                    raise ToolError(
                        f"no chain {json.dumps(clean(chain_id, 200), ensure_ascii=False)} in this "
                        f"window; chains here: {ids}"
                    )
                window = chain.window or window
        try:
            pictures.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ToolError(f"cannot write the picture in {pictures} (mcp --out-dir): {exc.strerror or exc}") from exc
        if not pictures.is_dir() or not os.access(pictures, os.W_OK | os.X_OK):
            raise ToolError(
                f"cannot write the picture in {pictures} (mcp --out-dir): "
                + ("not a folder" if not pictures.is_dir() else "no permission")
            )
        key = json.dumps([kind, window.model_dump() if window else None, chosen, chain.id if chain else None])
        name = (f"{re.sub(r'[^A-Za-z0-9_.-]', '_', store.path.stem)[:60]}-{kind}-"
                f"{hashlib.sha1(key.encode()).hexdigest()[:10]}")
        counts: dict[str, int] = {}
        if kind == "report":
            from ingero_mcp.export.html import write_report

            out = pictures / f"{name}.html"
            size = write_report(store.path, out, pids=chosen, window=window)
        else:
            from ingero_mcp.export.run import export_timeline

            out = pictures / f"{name}.pftrace"
            counts = export_timeline(store.path, out, "perfetto", window=window, pids=chosen)
            size = out.stat().st_size
        result = PictureResult(
            path=str(out),
            uri=out.resolve().as_uri(),
            kind=kind,
            window=window or whole,
            chain_id=chain.id if chain else None,
            bytes=size,
            counts=counts,
            shown=1,
            total=1,
            trace_start_ns=whole.start_ns if whole else None,
        )
        how = (
            "open it in a browser (it needs no network)"
            if kind == "report"
            else "open it at https://ui.perfetto.dev (Open trace file)"
        )
        text = (
            f"Wrote {kind} {out} ({size / 1e6:.1f} MB): {how}."
            + (f" It covers chain {json.dumps(clean(chain.id, 200))}'s window." if chain else "")
            + (
                ""
                if not counts
                else " Holds " + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in counts.items()) + "."
            )
        )
        return tool_result(f"{text}\n{DATA_NOTE}", result)

    def run_or_say_why() -> CallToolResult:
        try:
            return run()
        except (StoreError, SqlError, ToolError, duckdb.Error):
            raise  # _guard words these
        except Exception as exc:  # noqa: BLE001 - a picture not drawn says why, not "Error executing tool"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return error_result(
                f"could not write the {kind}: {type(exc).__name__}"
                + (f": {first}" if first else "")
                + " (a damaged or hand-edited store? run_sql can look inside)",
                PictureResult,
            )

    return guard(run_or_say_why, PictureResult)


@guarded(InfoResult)
def get_trace_info(store: StoreHandle) -> CallToolResult:
    """The get_trace_info tool (its description is in server.py)."""
    from ingero_mcp.analysis import events_lost, trace_info

    with store.connection() as con:
        info = trace_info(con)
    notes = []
    skipped = skipped_segments(store.path)
    if skipped:
        notes.append(describe(skipped) + "; every answer is of the rest")
    lost = events_lost(info)
    if lost:
        notes.append(f"{lost} events were lost by the collector (collector_stats.events_lost)")
    result = InfoResult(
        info=info,
        shown=len(info.sessions),
        total=len(info.sessions),
        notes=notes,
        trace_start_ns=origin_of(info.window, None),
    )
    keep = min(20, len(info.sessions))
    result.info.sessions = info.sessions[:keep]
    while keep > 1 and json_size(result) > STRUCTURED_BUDGET - 400:
        keep //= 2
        result.info.sessions = info.sessions[:keep]
    if keep < len(info.sessions):
        result.shown, result.truncated = keep, True
        result.notes.append(
            f"{result.total - keep} of {result.total} sessions left out; run_sql reads the sessions table"
        )
    return tool_result(render.render_info(result), result)


@guarded(SqlRows)
def run_sql(
    store: StoreHandle,
    sql_worker: SqlWorker,
    sql_timeout_s: float,
    sql: str | None = None,
    query: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> CallToolResult:
    """The run_sql tool (its description is in server.py)."""
    if (sql is None) == (query is None):
        raise ToolError("give the query as `sql` (or `query`, Ingero's name), exactly one of them")
    with store.connection():
        pass  # readable (else the reason), and reopened if it changed
    store.take_note()  # the query runs in its own process, on the whole recording, not on a checkpoint
    text = sql if sql is not None else query or ""
    if not text.strip():
        raise SqlError("empty query")
    got = sql_worker.run(text, limit, sql_timeout_s)
    result = SqlRows(
        columns=[clean(c, 200) for c in got.columns],
        types=got.types,
        rows=[],
        limit=limit,
        more_rows=got.more_rows,
        elapsed_ms=round(got.elapsed_s * 1000, 1),
        shown=0,
        total=got.fetched,
        truncated=got.more_rows,
        notes=list(got.notes),
    )
    if got.more_rows:
        result.notes.append(f"the query returned more than {limit} rows; only the first {limit} were fetched")
    # the rows that fit the budget with the header, counted against the rows fetched (not only those passed on)
    keep = fit(result, got.rows, lambda rows: setattr(result, "rows", rows))
    result.shown = keep
    if keep < got.fetched:
        result.truncated = True
        result.notes.append(
            f"only {keep} of the {got.fetched} rows fetched fit in one result; select fewer or "
            "narrower columns, aggregate, or lower limit"
        )
    return tool_result(render.render_sql(result), result)


@guarded(StacksToolResult)
def get_stacks(
    store: StoreHandle,
    pid: int | None = None,
    tid: int | None = None,
    since: str | None = None,
    from_: str | None = None,
    to: str | None = None,
    mode: Literal["on_cpu", "off_cpu", "both"] = "both",
    top_n: int = 10,
) -> CallToolResult:
    """The get_stacks tool (its description is in server.py)."""
    from ingero_mcp.analysis import AnalysisError, resolve_window, stacks_of

    with store.connection() as con:
        whole = whole_trace(con)
        window = resolve_window(con, since=since, start=from_, end=to) if since or from_ or to else whole
        if window is None:
            raise AnalysisError("the trace is empty: no stacks to read")
        if pid is None and tid is not None:
            got = con.execute("SELECT any_value(pid) FROM sched_intervals WHERE tid = ?", [tid]).fetchall()
            pid = got[0][0] if got and got[0][0] is not None else None
        if pid is None:
            raise ToolError("pass pid (or tid): get_time_accounting and get_per_process_breakdown list them")
        res = stacks_of(con, int(pid), tid, window, mode, top=top_n, t0=origin_of(whole, window))
    result = StacksToolResult(stacks=res, trace_start_ns=origin_of(whole, window))
    profiles = [p for p in (res.on_cpu, res.off_cpu) if p is not None]
    result.total = sum(p.stacks_total for p in profiles)
    while json_size(result) > STRUCTURED_BUDGET - 400 and any(p.stacks for p in profiles):
        fullest = max(profiles, key=lambda p: len(p.stacks))
        fullest.stacks.pop()  # the lightest stack of the longer list
        result.truncated = True
    result.shown = sum(len(p.stacks) for p in profiles)
    if result.truncated:
        result.notes.append(f"only {result.shown} of the {result.total} distinct stacks fit in one result; narrow "
                            "the window or lower top_n")
    return tool_result(render.render_stacks(result, whole), result)
