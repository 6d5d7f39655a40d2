"""Our verdict on an import: a chain per accountable feeding thread (imported_accounting.py), then what could not be
accounted and why, then a line on Ingero's own chains and their checks (imported_causes.py).

A feeding thread on the CPU nearly all the time its rows account for (HOST_BOUND_SHARE), with little time in CUDA
calls (bounded by Ingero's counted durations), was busy with its own work, not waiting: host-bound. One on the CPU
most of it is mostly host-bound, its off-CPU share said beside; one mostly off the CPU was asleep or waiting for a
CPU: Ingero does not record which, so the chain says only that.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import rows
from ingero_mcp.analysis.imported_accounting import (
    BUSY_SECOND_OFF,
    IMPORT_GAP_NS,
    SECOND_NS,
    busy_seconds_sql,
    cuda_sql,
    label,
    short_why,
    who,
)
from ingero_mcp.analysis.models import CausalChain, Evidence, ImportedAccounting, ImportedThread, TimeWindow

HOST_BOUND_SHARE = 0.9  # on-CPU share (a lower bound) from which it was not waiting: host-bound, HIGH
MOSTLY_SHARE = 0.5  # on-CPU share from which it is said to be mostly host-bound (MEDIUM)
ID_SUFFIX = "@import"  # our chains of an import end their id with it


def _rel(ns: int, t0: int) -> str:
    return f"+{(ns - t0) / 1e9:,.1f} s"


def _cuda_phrase(t: ImportedThread) -> str:
    """What the CUDA calls of its process say (a sample; the counted time in them bounds the time inside them)."""
    if t.cuda_counted is None:
        return (f"its process's {t.cuda_rows:,} CUDA call rows carry no per-minute count, so the time inside CUDA "
                "calls is unknown (part of the on-CPU or off-CPU time)")
    sample = "complete" if t.cuda_rows >= t.cuda_counted else f"a sample: {t.cuda_rows:,} of {t.cuda_counted:,} stored"
    bound = (f"; in CUDA calls at most {t.cuda_ns_max / 1e9:,.2f} s in those minutes (Ingero's counted durations, "
             "both API layers)" if t.cuda_ns_max is not None else "; the time in them is not counted")
    return f"its process's CUDA calls are {sample}, so the time inside them per second is unknown{bound}"


def _left_out(t: ImportedThread, window: TimeWindow, t0: int) -> str:
    """What of the window the thread's rows do not account for."""
    out = []
    if t.span and t.span.start_ns > window.start_ns + SECOND_NS:
        out.append(f"before {_rel(t.span.start_ns, t0)} (no switch row of it yet)")
    if t.span and t.span.end_ns < window.end_ns - SECOND_NS:
        out.append(f"after {_rel(t.span.end_ns, t0)} (its last switch row)")
    if t.unknown_ns:
        out.append(f"{t.unknown_ns / 1e9:,.1f} s without one switch row in stretches of {IMPORT_GAP_NS // SECOND_NS} s "
                   "or more (it ran all that time, or Ingero dropped its events: it does not count drops)")
    return "; ".join(out) or "nothing"


def imported_accounting_chains(con: duckdb.DuckDBPyConnection, imp: ImportedAccounting) -> list[CausalChain]:
    """Per accountable feeding thread, where its time went, with the SQL behind each number."""
    from ingero_mcp.analysis.accounting import origin_ns

    t0 = origin_ns(con) or imp.window.start_ns
    return [_thread_chain(con, t, imp.window, t0) for t in imp.feeders if t.accountable]


def _evidence(t: ImportedThread, busy: tuple, busy_sql: str, window: TimeWindow) -> list[Evidence]:
    """The chain's numbers, each with the SQL that recomputes it (one column of the thread's row, or of its seconds)."""
    off_seconds, worst_pct, _k, n_seconds = busy

    def col(column: str) -> str:
        return f"SELECT {column} FROM ({t.sql})"

    evidence = [
        Evidence(name="time its scheduler rows account for", value=round(t.accounted_ns / 1e9, 3), unit="s",
                 sql=col("accounted_s")),
        Evidence(name="on-CPU share of it (a lower bound)", value=round(100 * t.on_cpu_share, 1), unit="%",
                 sql=col("on_cpu_pct")),
        Evidence(name="switches (rows)", value=t.switch_rows, unit="switches", sql=col("switches")),
        Evidence(name="off-CPU (sleeping or waiting for a CPU; split not recorded)", value=round(t.off_cpu_ns / 1e9, 3),
                 unit="s", sql=col("off_cpu_s")),
        Evidence(name="switches counted by Ingero in those minutes", value=t.switches_counted or 0, unit="switches",
                 sql=col("counted")),
        Evidence(name="counted switches not stored as rows", value=t.missing_switches, unit="switches",
                 sql=col("missing")),
        Evidence(name="time without one switch row (unknown)", value=round(t.unknown_ns / 1e9, 3), unit="s",
                 sql=col("unknown_s")),
    ]
    if n_seconds:
        evidence += [Evidence(name=f"seconds off-CPU {100 * BUSY_SECOND_OFF:.0f}% or more", value=int(off_seconds),
                              unit="seconds", sql=f"SELECT off_seconds FROM ({busy_sql})"),
                     Evidence(name="the largest off-CPU share of one second", value=float(worst_pct), unit="%",
                              sql=f"SELECT worst_off_pct FROM ({busy_sql})")]
    if t.cuda_ns_max is not None:
        csql = cuda_sql(t.session_id, t.pid, window)
        evidence += [Evidence(name="its process's time in CUDA calls, at most (counted, both API layers)",
                              value=round(t.cuda_ns_max / 1e9, 3), unit="s", sql=f"SELECT cuda_s FROM ({csql})"),
                     Evidence(name="its process's CUDA calls stored as rows", value=t.cuda_rows, unit="calls",
                              sql=f"SELECT cuda_rows FROM ({csql})")]
    return evidence


def _thread_chain(con: duckdb.DuckDBPyConnection, t: ImportedThread, window: TimeWindow, t0: int) -> CausalChain:
    """One accountable feeding thread: host-bound (on-CPU most of its time) or off-CPU (split not recorded)."""
    busy_sql = busy_seconds_sql(t.session_id, t.pid, t.tid, window, t0)
    busy = rows(con, busy_sql)[0]
    off_seconds, worst_pct, worst_k, n_seconds = busy
    span = t.span or window
    when = f"{_rel(span.start_ns, t0)} to {_rel(span.end_ns, t0)}"
    accounted = f"{t.accounted_ns / 1e9:,.1f} s its scheduler rows account for"
    on_pct, off_pct = round(100 * t.on_cpu_share, 1), round(100 * t.off_cpu_ns / t.accounted_ns, 1)
    whose = who(t)
    if t.on_cpu_ns >= MOSTLY_SHARE * t.accounted_ns:
        own_pct, own = None, ""
        if t.cuda_ns_max is not None:
            own_pct = round(100 * max(0, t.on_cpu_ns - t.cuda_ns_max) / t.accounted_ns, 1)
            own = (f"; at most {t.cuda_ns_max / 1e9:,.2f} s of it in CUDA calls, so at least {own_pct}% its own "
                   "work")
        peaks = (f". Off-CPU {100 * BUSY_SECOND_OFF:.0f}% or more in {off_seconds} of its {n_seconds} seconds (the "
                 f"most {worst_pct:.0f}% at +{worst_k} s)" if off_seconds else "")
        head = (f"{whose} fed the GPU and was on-CPU {on_pct}% of the {accounted} ({t.switch_rows:,} switches, "
                f"{t.off_cpu_ns / 1e9:,.2f} s off-CPU{own}): ")
        if t.on_cpu_ns >= HOST_BOUND_SHARE * t.accounted_ns:
            severity, said = "HIGH", ("busy with its own work (Python, data preparation), not waiting for a CPU, "
                                      "another thread or the GPU: host-bound")
        else:
            severity, said = "MEDIUM", (f"mostly busy with its own work (Python, data preparation): mostly host-bound; "
                                        f"off-CPU {off_pct}%, asleep or waiting for a CPU, not recorded which")
        summary = head + said + peaks
        cause = rc.HOST_BOUND
        recs = rc.recommend(cause, {"who": whose, "share": f"{own_pct or on_pct:.0f}", "window": when})
    else:
        summary = (f"{whose} fed the GPU and was off-CPU {off_pct}% of the {accounted} ({t.switch_rows:,} switches): "
                   "asleep or waiting for a CPU, Ingero does not record which")
        severity, cause = "MEDIUM", rc.UNEXPLAINED
        recs = rc.recommend(cause, {"who": whose, "window": when})
    missing = (f" {t.missing_switches:,} switches Ingero counted are not rows: their "
               f"{(t.missing_off_cpu_ns or 0) / 1e6:,.1f} ms off-CPU (the counted sum less the rows') is counted as "
               "off-CPU, so the on-CPU share is a lower bound." if t.missing_switches else "")
    seconds = (f" Per second: off-CPU {100 * BUSY_SECOND_OFF:.0f}% or more in {off_seconds} of the {n_seconds} "
               f"seconds its rows account for (the most {worst_pct}% at +{worst_k} s)." if n_seconds else "")
    explanation = ("Read from Ingero's scheduler rows of the thread, imported: each row is one switch back onto a CPU "
                   "with the off-CPU time before it; between two rows it ran. Its rows are complete: "
                   f"{t.switch_rows:,} rows against {t.switches_counted:,} switches Ingero counted in the minutes of "
                   f"the window.{missing} Off-CPU is sleeping or waiting for a CPU: the split is not recorded. Not "
                   f"accounted: {_left_out(t, window, t0)}.{seconds} CUDA calls: {_cuda_phrase(t)}.")
    return CausalChain(
        id=f"{cause}:{t.pid}/{t.tid}{ID_SUFFIX}", op=cause, severity=severity,  # type: ignore[arg-type]
        root_cause=cause, summary=summary, explanation=explanation, window=span, pids=[t.pid],
        evidence=_evidence(t, busy, busy_sql, window), recommendations=recs,
    )


def verdict_lines(imp: ImportedAccounting, chains: list[CausalChain]) -> list[str]:
    """The verdict on an import: our chains first, then what could not be accounted and why, then Ingero's."""
    lines = [f"{c.severity}: {c.summary}" for c in chains if c.origin == "ingero-mcp" and c.id.endswith(ID_SUFFIX)]
    feeders = imp.feeders
    if not feeders:
        lines.append("No time accounting of ours: no imported process has a CUDA call stored or counted, so which "
                     "thread fed the GPU is not known.")
    for t in feeders:
        if not t.accountable:
            lines.append(f"No time accounting of {who(t)}, which fed the GPU: {t.why_not}.")
    others = [t for t in imp.threads if not t.feeds_gpu and not t.accountable]
    if others:
        shown = "; ".join(f"{label(t)}: {short_why(t)}" for t in others[:4])
        lines.append(f"Not accountable: {shown}" + (f"; {len(others) - 4} more" if len(others) > 4 else "") + ".")
    imported = [c for c in chains if c.origin != "ingero-mcp"]
    if imported:
        contradicted = [c for c in imported if "contradicted by" in c.summary]
        lines.append(f"Ingero's own chains follow ({len(imported)} kinds), each checked against the rows: the rows "
                     f"contradict {len(contradicted)} of them, wholly or in part (each chain's check says where).")
    return lines
