"""Causal chains as the model receives them: every chain up to top_n, each shrunk inside itself to fit.

A chain is rendered generically from whatever fields `CausalChain` and `Evidence` have (fields the
analysis adds later pass through), as one compact JSON view that the text is rendered from too, so
both halves of a result carry the same findings (Claude Code forwards only the structured half).
Evidence SQL is left out unless asked for (it can be most of a chain's size).

When the chains do not fit the budgets, the largest chain gives up detail first, one level at a
time (fewer timeline entries and evidence items, shorter explanation, ...), so that a chain is
dropped only when every chain is already at its smallest; each view says what it left out.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from ingero_mcp.analysis import SEVERITY_RANK, Frame
from ingero_mcp.sanitize import clean, clean_data
from ingero_mcp.units import fmt_ns, fmt_rel

# Per level of detail: (timeline entries, evidence items, recommendations, explanation chars,
# summary chars, root cause chars, items of other lists, keep other fields).
_LEVELS: list[tuple[int, int, int, int, int, int, int, bool]] = [
    (20, 30, 10, 1500, 800, 400, 20, True),
    (8, 15, 5, 800, 600, 300, 10, True),
    (3, 8, 3, 400, 400, 250, 5, True),
    (0, 4, 2, 200, 300, 200, 3, True),
    (0, 0, 1, 0, 300, 160, 0, False),
    (0, 0, 0, 0, 160, 0, 0, False),
]
MAX_LEVEL = len(_LEVELS) - 1
_KNOWN = {"id", "origin", "op", "severity", "summary", "root_cause", "explanation", "evidence", "recommendations",
          "timeline", "pids", "count", "p50_ns", "p99_ns", "max_ns", "tail_ratio", "from_sample", "store_check",
          "frames"}


def rank(chains: list[Any]) -> list[Any]:
    """Most severe first, whoever found them (stable: the analysis's order within a severity)."""
    return sorted(chains, key=lambda c: SEVERITY_RANK.get(getattr(c, "severity", "LOW"), 3))


def with_offsets(value: Any, origin_ns: int) -> Any:
    """Timestamps (ns since the epoch, in *_ns keys) gain a readable `*_at` offset from the trace start."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out[key] = with_offsets(item, origin_ns)
            if isinstance(key, str) and key.endswith("_ns") and isinstance(item, int) and item >= 10**17:
                out[key[:-3] + "_at"] = fmt_rel(item, origin_ns)
        return out
    if isinstance(value, list):
        return [with_offsets(item, origin_ns) for item in value]
    return value


def chain_view(chain: BaseModel, origin_ns: int, level: int = 0, include_sql: bool = False) -> dict[str, Any]:
    """One chain as compact JSON data at a level of detail (0 = all of it); traced strings cleaned."""
    n_tl, n_ev, n_rec, expl, summ, root, n_other, others = _LEVELS[level]
    data = chain.model_dump(mode="json")
    omitted: dict[str, int] = {}

    def cut(key: str, items: list[Any], n: int) -> list[Any]:
        if len(items) > n:
            omitted[key] = len(items) - n
        return items[:n]

    view: dict[str, Any] = {
        "id": clean(str(data.get("id", "")), 200),
        "severity": clean(str(data.get("severity")), 10),
        "found_by": "imported from Ingero (as Ingero stored it)" if data.get("origin") == "ingero" else "ingero-mcp",
        "op": clean(str(data.get("op", "")), 120),
        "summary": clean(str(data.get("summary") or ""), summ),
    }
    if data.get("store_check"):  # an imported chain checked against the store's rows: kept at every level
        view["store_check"] = clean(str(data["store_check"]), 900)
    if root:
        view["root_cause"] = clean(str(data.get("root_cause") or ""), root)
    elif data.get("root_cause"):
        omitted["root_cause"] = 1
    if expl:
        view["explanation"] = clean(str(data.get("explanation") or ""), expl)
    elif data.get("explanation"):
        omitted["explanation"] = 1
    numbers = {k: data.get(k) for k in ("count", "p50_ns", "p99_ns", "max_ns", "tail_ratio") if data.get(k) is not None}
    view["numbers"] = numbers | {k[:-3]: fmt_ns(v) for k, v in numbers.items() if k.endswith("_ns")}
    if data.get("from_sample"):
        view["numbers"]["from_sample"] = True
    if data.get("pids"):
        view["pids"] = cut("pids", list(data["pids"]), 20 if level < 4 else 5)
    evidence = []
    # With include_sql: every query at level 0-1; from level 2 on, as many whole queries as a shrinking
    # allowance holds (a query is never cut: cut SQL recomputes nothing).
    sql_room = None if level < 2 else 16_000 >> (level - 2)
    for e in cut("evidence", list(data.get("evidence") or []), n_ev):
        item = {k: v for k, v in e.items() if k != "sql" and v not in (None, "")}
        sql = e.get("sql")
        if include_sql and sql:
            if sql_room is None or len(sql) <= sql_room:
                item["sql"] = sql
                sql_room = None if sql_room is None else sql_room - len(sql)
            else:
                omitted["sql"] = omitted.get("sql", 0) + 1
        evidence.append(clean_data(item, 200, {"sql": 100_000}))
    if evidence:
        view["evidence"] = evidence
    recs = [clean(str(r), 400 if level < 2 else 250)
            for r in cut("recommendations", list(data.get("recommendations") or []), n_rec)]
    if recs:
        view["recommendations"] = recs
    timeline = []
    for t in cut("timeline", list(data.get("timeline") or []), n_tl):
        entry = {"at": fmt_rel(t.get("ts_ns"), origin_ns)}
        for key, value in t.items():
            if key == "ts_ns" or value is None:
                continue
            if key == "duration_ns":
                entry["duration"] = fmt_ns(value)
            else:
                entry[key] = value
        timeline.append(clean_data(entry, 160))
    if timeline:
        view["timeline"] = timeline
    if data.get("frames"):
        view["code"] = _code_view(data["frames"], level)
    # Fields the analysis has that this renderer does not know by name: passed through, bounded.
    for key in (k for k in data if k not in _KNOWN):
        value = data[key]
        if value in (None, [], {}, ""):
            continue
        if not others:
            omitted[key] = 1
            continue
        if isinstance(value, list):
            value = cut(key, value, n_other)
        view[clean(key, 80)] = with_offsets(clean_data(value, 300), origin_ns)
        if key.endswith("_ns") and isinstance(value, int) and value >= 10**17:  # a moment: its offset beside it
            view[clean(key[:-3], 80) + "_at"] = fmt_rel(value, origin_ns)
    if omitted:
        view["omitted"] = omitted
    return view


def _code_view(frames: dict[str, Any], level: int) -> dict[str, Any]:
    """A finding's code, compact: its sentence, then (while there is room) each profile's top frames and heaviest
    folded stacks; get_stacks gives them whole."""
    out: dict[str, Any] = {"sentence": clean(str(frames.get("sentence") or ""), 600 if level < 4 else 300)}
    n_frames, n_stacks = [(5, 3), (3, 2), (2, 1), (1, 0), (0, 0), (0, 0)][level]
    if not n_frames:
        return out
    profiles = []
    for p in [frames.get("profile") or {}] + list(frames.get("culprits") or []):
        who = {k: p[k] for k in ("mode", "pid", "tid", "tids") if p.get(k) not in (None, [])}
        top = [{"frame": clean(_label(f["frame"]), 300), "self_share": f["self_share"],
                "inclusive_share": f["inclusive_share"]} | ({"caller": clean(_label(f["caller"]), 300)}
                                                            if f.get("caller") else {})
               for f in (p.get("top_frames") or [])[:n_frames]]
        stacks = [{"folded": clean(s["folded"], 1500), "share": s["share"]} for s in (p.get("stacks") or [])[:n_stacks]]
        profiles.append(who | {"top_frames": top} | ({"stacks": stacks} if stacks else {}))
    out["profiles"] = profiles
    return out


def _label(frame: dict[str, Any]) -> str:
    """A frame as the analysis labels it ('f (file:line)', 'f [module]', 'f')."""
    return Frame.model_validate(frame).label()


def _q(value: Any) -> str:
    """A view's string (already cleaned and capped) as a JSON literal, not cut a second time."""
    return json.dumps(str(value), ensure_ascii=False)


def _block(view: dict[str, Any]) -> str:
    """The text of one chain view: the same facts, one per line."""
    lines = [f"[{view['severity']}] {_q(view['id'])} ({view['found_by']}) op {_q(view['op'])}",
             f"  summary: {_q(view['summary'])}"]
    if "store_check" in view:
        lines.append(f"  checked against the store: {_q(view['store_check'])}")
    if "root_cause" in view:
        lines.append(f"  root cause: {_q(view['root_cause'])}")
    if "explanation" in view:
        lines.append(f"  explanation: {_q(view['explanation'])}")
    nums = view["numbers"]
    parts = [f"count {nums['count']}" if "count" in nums else ""]
    parts += [f"{k} {nums[k]}" for k in ("p50", "p99", "max") if k in nums]
    parts += [f"tail ratio {nums['tail_ratio']:.1f}x" if "tail_ratio" in nums else "",
              "from a SAMPLE of calls" if nums.get("from_sample") else ""]
    lines.append("  numbers: " + ", ".join(p for p in parts if p)
                 + (f"; pids {view['pids']}" if view.get("pids") else ""))
    for e in view.get("evidence", []):
        value = e.get("value")
        shown = _q(value) if isinstance(value, str) else value
        extra = "".join(f"; {k} {_q(v) if isinstance(v, str) else json.dumps(v)}"
                        for k, v in e.items() if k not in ("name", "value", "unit", "sql"))
        lines.append(f"  evidence: {_q(e.get('name', ''))} = "
                     f"{shown}{(' ' + _q(e['unit'])) if e.get('unit') else ''}{extra}")
        if "sql" in e:
            lines.append(f"    sql: {e['sql']}")
    for rec in view.get("recommendations", []):
        lines.append(f"  recommendation: {_q(rec)}")
    for t in view.get("timeline", []):
        rest = {k: v for k, v in t.items() if k not in ("at", "pid", "tid", "kind", "description", "duration")}
        lines.append(
            f"  timeline {t['at']} pid {t.get('pid', '-')} tid {t.get('tid', '-')} {_q(t.get('kind', ''))}: "
            f"{_q(t.get('description', ''))}"
            + (f" ({t['duration']})" if "duration" in t else "")
            + "".join(f"; {k} {json.dumps(v, ensure_ascii=False)}" for k, v in rest.items())
        )
    code = view.get("code") or {}
    if code.get("sentence"):
        lines.append(f"  code: {_q(code['sentence'])}")
    for p in code.get("profiles", []):
        who = f"pid {p.get('pid')}" + (f" tid {p['tid']}" if "tid" in p else "") + (
            f" tids {p['tids']}" if "tids" in p else "")
        for f in p["top_frames"]:
            lines.append(f"  frame ({p.get('mode')}, {who}): self {100 * f['self_share']:.1f}% incl "
                         f"{100 * f['inclusive_share']:.1f}% {_q(f['frame'])}"
                         + (f" called from {_q(f['caller'])}" if "caller" in f else ""))
        for st in p.get("stacks", []):
            lines.append(f"  stack ({p.get('mode')}, {who}) {100 * st['share']:.1f}%: {_q(st['folded'])}")
    for key, value in view.items():
        if key in {"id", "severity", "found_by", "op", "summary", "root_cause", "explanation", "numbers", "pids",
                   "evidence", "recommendations", "timeline", "omitted", "code"}:
            continue
        lines.append(f"  {key}: {json.dumps(value, ensure_ascii=False)}")
    if view.get("omitted"):
        lines.append("  left out to fit: " + ", ".join(f"{n} {k}" for k, n in view["omitted"].items())
                     + " (get_evidence_sql has a chain's evidence with its SQL)")
    return "\n".join(lines)


def chains_text(views: list[dict[str, Any]]) -> str:
    """The chain views as text blocks."""
    return "\n".join(_block(v) for v in views)


def _json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def fit_chains(
    chains: list[Any], origin_ns: int, json_budget: int, text_budget: int, include_sql: bool = False
) -> tuple[list[dict[str, Any]], list[str]]:
    """Views of all `chains`, shrunk (largest first) until the JSON and the text both fit; notes say what gave.

    Only when every chain is at its smallest and they still do not fit are chains dropped, from the
    least severe end."""
    levels = [0] * len(chains)
    views = [chain_view(c, origin_ns, 0, include_sql) for c in chains]
    jsizes = [_json_size(v) + 1 for v in views]
    tsizes = [len(_block(v)) + 1 for v in views]
    notes: list[str] = []
    while sum(jsizes) > json_budget or sum(tsizes) > text_budget:
        over_json = sum(jsizes) > json_budget
        sizes = jsizes if over_json else tsizes
        candidates = [i for i in range(len(views)) if levels[i] < MAX_LEVEL]
        if not candidates:
            break
        i = max(candidates, key=lambda k: sizes[k])
        levels[i] += 1
        views[i] = chain_view(chains[i], origin_ns, levels[i], include_sql)
        jsizes[i], tsizes[i] = _json_size(views[i]) + 1, len(_block(views[i])) + 1
    shrunk = sum(1 for lv in levels if lv)
    if shrunk:
        notes.append(f"{shrunk} of {len(chains)} chains shortened to fit one result (each says what it left out); "
                     "get_evidence_sql(chain_id) gives one chain's evidence in full with its SQL")
    while views and (sum(jsizes) > json_budget or sum(tsizes) > text_budget):
        views.pop(), jsizes.pop(), tsizes.pop()
    if len(views) < len(chains):
        notes.append(f"only {len(views)} of the {len(chains)} chains fit in one result even at their shortest; "
                     "lower top_n or filter by pid to see the rest")
    return views, notes
