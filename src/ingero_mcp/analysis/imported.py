"""Chains found by another tool (Ingero) and imported as they were; shown as theirs, after our own.

Ingero re-detects the same chain every second, so a trace holds hundreds of near-identical rows;
they are grouped per (op, severity), latest first, with how many were stored and when.

Each chain's p99 is checked against the store: a p99 above the longest call of that op stored in the
chain's session (rows, and the aggregates' per-bucket maxima where Ingero kept them) is contradicted
by the store, and said so. Its cause is checked against the rows too (imported_causes.py: did the
feeding thread wait for a CPU in the chain's window? were the pages allocated?). Imported tables this
analysis does not read yet (block I/O, TCP, cgroup statistics...) are listed, so that nothing imported
is silently ignored.
"""

from __future__ import annotations

import json

import duckdb

from ingero_mcp.analysis._sql import pid_in, rows, sql_str, tidy, ts_in, where
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.models import CausalChain, Evidence, ImportedAccounting, TimelineEntry, TimeWindow


def imported_chains_sql(window: TimeWindow | None) -> str:
    """The stored chains grouped per (origin, op, severity), with the latest row of each group."""
    return tidy(f"""
        SELECT origin, op, severity, count(*) AS stored, min(detected_ns) AS first_ns, max(detected_ns) AS last_ns,
               arg_max(chain_id, detected_ns), arg_max(summary, detected_ns), arg_max(root_cause, detected_ns),
               arg_max(explanation, detected_ns), arg_max(recommendations, detected_ns), arg_max(p99_ns, detected_ns),
               arg_max(p50_ns, detected_ns), arg_max(tail_ratio, detected_ns), arg_max(timeline, detected_ns),
               string_agg(DISTINCT node, ',')
        FROM imported_chains {where(ts_in(window, "detected_ns"))}
        GROUP BY origin, op, severity
        ORDER BY CASE severity WHEN 'HIGH' THEN 0 WHEN 'MEDIUM' THEN 1 ELSE 2 END, op
    """)


def chain_check_sql(origin: str | None, op: str | None, severity: str | None, window: TimeWindow | None) -> str:
    """Per stored chain of one group: its p99 against the longest stored call of its op in its session."""
    return tidy(f"""
        SELECT count(*) FILTER (WHERE p99_ns > stored_max) AS contradicted,
               count(*) FILTER (WHERE stored_max IS NULL) AS unchecked,
               arg_max(p99_ns, p99_ns / stored_max) FILTER (WHERE p99_ns > stored_max) AS claimed_p99_ns,
               arg_max(stored_max, p99_ns / stored_max) FILTER (WHERE p99_ns > stored_max) AS stored_max_ns,
               arg_max(row_n, p99_ns / stored_max) FILTER (WHERE p99_ns > stored_max) AS stored_rows
        FROM (SELECT c.p99_ns,
                     nullif(greatest(coalesce((SELECT max(k.duration_ns) FROM cuda_calls k
                                               WHERE k.session_id = c.session_id AND k.op = c.op), -1),
                                     coalesce((SELECT max(a.max_duration_ns) FROM host_aggregates a
                                               WHERE a.session_id = c.session_id AND a.op = c.op), -1)), -1)
                         AS stored_max,
                     (SELECT count(*) FROM cuda_calls k WHERE k.session_id = c.session_id AND k.op = c.op) AS row_n
              FROM imported_chains c
              {where(_equals('origin', origin), _equals('op', op), _equals('severity', severity),
                     ts_in(window, 'detected_ns'))}
              AND c.p99_ns IS NOT NULL)
    """)


def unanalysed_sql() -> str:
    """Imported rows this analysis does not read yet: event kinds mapped to no table, and the other tables' rows."""
    return tidy("""
        SELECT 'imported_events' AS kept_in, source || '/' || op AS what, count(*) AS n, count(DISTINCT pid) AS pids
        FROM imported_events WHERE mapped_to IS NULL GROUP BY source, op
        UNION ALL
        SELECT 'imported_rows', table_name, count(*), NULL FROM imported_rows
        WHERE table_name NOT IN ('ops', 'sources', 'schema_info', 'sqlite_sequence', 'sessions', 'process_names')
        GROUP BY table_name
        ORDER BY kept_in, n DESC
    """)


def unanalysed_note(con: duckdb.DuckDBPyConnection) -> str | None:
    """One line naming the imported data not analysed yet (None when there is none)."""
    got = rows(con, unanalysed_sql())
    if not got:
        return None
    parts = [f"{what} {n:,} rows" + (f" ({pids} pids)" if pids is not None else "") + f" in {kept}"
             for kept, what, n, pids in got]
    return ("imported but not analysed yet (kept verbatim; query them with `ingero-mcp query`): " + "; ".join(parts)
            + (". The processes known only from them are listed per process"
               if any(g[0] == "imported_events" for g in got)
               else ""))


def only_imported_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """Per pid, the imported events not mapped to any analysed table (block I/O, TCP...), as 'source/op N rows'."""
    return tidy(f"""
        SELECT pid, string_agg(what || ' ' || n || ' rows', ', ' ORDER BY what)
        FROM (SELECT pid, source || '/' || op AS what, count(*) AS n FROM imported_events
              {where("mapped_to IS NULL", "pid IS NOT NULL", ts_in(window), pid_in(pids))} GROUP BY ALL)
        GROUP BY pid
    """)


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.1f} ms" if ns >= 1_000_000 else f"{ns / 1e3:,.0f} us"


def _equals(column: str, value: str | None) -> str:
    """`column` matches the stored text (quotes and all), or is NULL like it: the group's rows, as GROUP BY made it."""
    return f"{column} IS NULL" if value is None else f"{column} = {sql_str(value)}"


def _severity(text: str | None) -> str:
    value = (text or "").upper()
    return value if value in ("HIGH", "MEDIUM", "LOW") else "LOW"


def _recommendations(text: str | None) -> list[str]:
    if not text:
        return []
    try:
        got = json.loads(text)
    except ValueError:
        return [text]
    return [str(r) for r in got] if isinstance(got, list) else [str(got)]


def _timeline(text: str | None, ts_ns: int) -> list[TimelineEntry]:
    try:
        got = json.loads(text) if text else []
    except ValueError:
        return []
    entries = []
    for item in got if isinstance(got, list) else []:
        if not isinstance(item, dict):
            continue
        dur_us = item.get("dur_us")
        entries.append(
            TimelineEntry(
                ts_ns=ts_ns, kind=str(item.get("layer", "")).lower() or "event",
                description=f"{item.get('op', '')}: {item.get('detail', '')}".strip(": "),
                duration_ns=int(dur_us) * 1000 if isinstance(dur_us, (int, float)) else None,
            )
        )
    return entries


def imported_chains(con: duckdb.DuckDBPyConnection, window: TimeWindow | None = None,
                    imp: ImportedAccounting | None = None) -> list[CausalChain]:
    """Imported chains, one per (origin, op, severity), marked with their origin, each checked against the store for
    its p99 and (with the import's accounting `imp`, where a thread's rows are complete) for its cause."""
    from ingero_mcp.analysis.accounting import thread_names
    from ingero_mcp.analysis.imported_causes import cause_check

    names = thread_names(con) if imp else {}
    out: list[CausalChain] = []
    for (origin, op, sev, stored, first_ns, last_ns, cid, summary, cause, expl, recs,
         p99, p50, ratio, tl, nodes) in shared_rows(
        con, imported_chains_sql(window)
    ):
        sql = tidy(
            f"SELECT count(*), min(detected_ns), max(detected_ns) FROM imported_chains "
            f"WHERE {_equals('origin', origin)} AND {_equals('op', op)} AND {_equals('severity', sev)}"
        )
        evidence = [Evidence(name="stored_chains", value=int(stored), unit="rows", sql=sql)]
        if nodes:
            evidence.append(Evidence(name="nodes", value=nodes))
        note = f" [{origin}: {stored} similar chain(s) stored]" if stored > 1 else f" [{origin}]"
        check_sql = chain_check_sql(origin, op, sev, window)
        contradicted, unchecked, claimed, stored_max, stored_rows = rows(con, check_sql)[0]
        check = None
        if contradicted:
            check = (f"the store contradicts it: {contradicted} of {stored} stored chain(s) claim a p99 above "
                     f"every stored {op} of their session; the worst claims {_ms(int(claimed))} where the "
                     f"longest stored is {_ms(int(stored_max))} ({stored_rows} rows and the aggregates' maxima)")
            evidence.append(Evidence(name="chains_contradicted_by_store", value=int(contradicted),
                                     unit="chains", sql=check_sql))
            evidence.append(Evidence(name="stored_max_ns", value=int(stored_max), unit="ns",
                                     sql=f"SELECT stored_max_ns FROM ({check_sql})"))
            note += " [contradicted by the store's rows]"
        elif unchecked:
            check = (f"not checked: {unchecked} of {stored} stored chain(s) have no {op} row or aggregate in "
                     "their session")
        group = " AND ".join(c for c in (_equals("origin", origin), _equals("op", op), _equals("severity", sev),
                                         ts_in(window, "detected_ns")) if c)
        said, cause_evidence, cause_contradicted = (cause_check(con, group, imp, names, last_ns) if imp
                                                    else (None, [], False))
        if said:  # after the p99 check, as it was worded
            check = f"{check}. Cause: {said}" if check else f"Cause: {said}"
            evidence += cause_evidence
            if cause_contradicted:
                note += " [its cause contradicted by the rows]"

        out.append(
            CausalChain(
                # Ingero is the only tool whose chains are imported; its own origin string stays in the id.
                id=f"{origin}:{cid}", origin="ingero", op=op or "", severity=_severity(sev),
                summary=(summary or "") + note, root_cause=cause or "", explanation=expl or "",
                p50_ns=p50, p99_ns=p99, tail_ratio=ratio, evidence=evidence,
                recommendations=_recommendations(recs), timeline=_timeline(tl, int(last_ns or first_ns or 0)),
                store_check=check,
            )
        )
    return out
