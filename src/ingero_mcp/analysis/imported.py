"""Chains found by another tool (Ingero) and imported as they were; shown as theirs, after our own.

Ingero re-detects the same chain every second, so a trace holds hundreds of near-identical rows;
they are grouped per (op, severity), latest first, with how many were stored and when.
"""

from __future__ import annotations

import json

import duckdb

from ingero_mcp.analysis._sql import rows, sql_str, tidy, ts_in, where
from ingero_mcp.analysis.models import CausalChain, Evidence, TimelineEntry, TimeWindow


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


def imported_chains(con: duckdb.DuckDBPyConnection, window: TimeWindow | None = None) -> list[CausalChain]:
    """Imported chains, one per (origin, op, severity), marked with their origin."""
    out: list[CausalChain] = []
    for (origin, op, sev, stored, first_ns, last_ns, cid, summary, cause, expl, recs, p99, p50, ratio, tl, nodes) in rows(
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
        out.append(
            CausalChain(
                # Ingero is the only tool whose chains are imported; its own origin string stays in the id.
                id=f"{origin}:{cid}", origin="ingero", op=op or "", severity=_severity(sev),
                summary=(summary or "") + note, root_cause=cause or "", explanation=expl or "",
                p50_ns=p50, p99_ns=p99, tail_ratio=ratio, evidence=evidence,
                recommendations=_recommendations(recs), timeline=_timeline(tl, int(last_ns or first_ns or 0)),
            )
        )
    return out
