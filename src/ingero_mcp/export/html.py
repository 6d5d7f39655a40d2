"""The incident report as one self-contained HTML file: it opens offline and requests nothing.

Charts are drawn by Chart.js (MIT, vendored in `vendor/` from npm's chart.js 4.6.1, its source-map
line removed so no browser asks for it): ~200 KB embedded inline, against Plotly's 4.8 MB bundle,
which alone would nearly fill the report's 5 MB budget. Every traced string goes through `clean`
and then `html.escape` (text) or a JSON encoding that cannot close the script element (chart data).
"""

from __future__ import annotations

import html
import json
import os
from collections import defaultdict
from importlib.resources import files
from pathlib import Path

import duckdb

from ingero_mcp.analysis.cost import cost_lines
from ingero_mcp.analysis.models import Report, ThreadAccount, TimeWindow
from ingero_mcp.export.output import check_output, write_whole
from ingero_mcp.sanitize import clean

NS = 1_000_000_000
# The four parts of a feeding thread's second, as the chart stacks them (ms of the second).
PARTS = (
    ("running outside CUDA", "#4e79a7", lambda s: s.run_outside_ns),
    ("in CUDA (on CPU or waiting for the GPU)", "#59a14f", lambda s: s.run_inside_ns + s.sleep_inside_ns),
    ("waiting for a CPU", "#e15759", lambda s: s.cpu_wait_inside_ns + s.cpu_wait_outside_ns),
    ("sleeping (lock, queue, IO)", "#9c9c9c", lambda s: s.sleep_outside_ns + s.off_cpu_unknown_ns),
)
TOP_CULPRITS = 3


def esc(text: object, cap: int = 2_000) -> str:
    """A traced (or any) string for HTML text: cleaned, capped, escaped."""
    return html.escape(clean("" if text is None else str(text), cap))


def script_json(data: object) -> str:
    """JSON safe inside <script type="application/json">: no '<' can end the element."""
    return json.dumps(data, ensure_ascii=True, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")


def _culprits(con: duckdb.DuckDBPyConnection, threads: list[ThreadAccount], t0: int) -> dict:
    """Per (tid, second): who held the CPU while it waited, who woke it, by time (the top few)."""
    from ingero_mcp.analysis.views import install_views

    tids = [t.tid for t in threads]
    if not tids:
        return {}
    install_views(con)
    got = con.execute(f"""
        SELECT tid, (start_ns - {int(t0)}) // {NS} AS k, state,
               CASE WHEN state = 'cpu_wait' THEN coalesce(first_holder_comm, last_holder_comm) ELSE waker_comm END AS who,
               sum(dur_ns) AS ns
        FROM thread_state WHERE tid IN ({', '.join(map(str, tids))}) AND state IN ('cpu_wait', 'sleeping')
        GROUP BY ALL HAVING who IS NOT NULL ORDER BY tid, k, state, ns DESC""").fetchall()
    out: dict = defaultdict(lambda: {"cpu_wait": [], "sleeping": []})
    for tid, k, state, who, ns in got:
        lst = out[(tid, int(k))][state]
        if len(lst) < TOP_CULPRITS:
            lst.append(f"{clean(who, 40)} {ns / 1e6:.0f} ms")
    return out


def _thread_chart(t: ThreadAccount, culprits: dict, entry_only: bool = False) -> dict:
    labels = [f"{s.k}s" for s in t.seconds]
    datasets = [{"type": "bar", "label": name + (" (incl. kernel launches, entry-only)" if entry_only and i == 0 else ""),
                 "backgroundColor": color, "stack": "t", "yAxisID": "y",
                 "data": [round(part(s) / 1e6, 2) for s in t.seconds]} for i, (name, color, part) in enumerate(PARTS)]
    datasets.append({"type": "line", "label": "GPU utilisation %", "borderColor": "#f28e2b", "yAxisID": "pct",
                     "pointRadius": 0, "data": [s.gpu_util_percent for s in t.seconds]})
    hover = []
    for s in t.seconds:
        c = culprits.get((t.tid, s.k), {})
        hover.append({"cpu": c.get("cpu_wait", []), "woke": c.get("sleeping", [])})
    title = f"{clean(t.comm or '?', 60)} (tid {t.tid}, pid {t.pid} {clean(t.process_comm or '', 60)})"
    return {"kind": "thread", "title": title, "labels": labels, "datasets": datasets, "culprits": hover}


def _host_chart(con: duckdb.DuckDBPyConnection, window: TimeWindow, t0: int) -> dict:
    got = con.execute(f"""SELECT (ts_ns - {int(t0)}) // {NS} AS k, avg(gpu_util_percent), avg(cpu_percent)
                          FROM snapshots WHERE ts_ns BETWEEN {int(window.start_ns)} AND {int(window.end_ns)}
                          GROUP BY k ORDER BY k""").fetchall()
    labels = [f"{int(k)}s" for k, _, _ in got]
    rnd = lambda v: None if v is None else round(float(v), 1)  # noqa: E731
    return {"kind": "host", "title": "GPU utilisation and host CPU", "labels": labels, "datasets": [
        {"type": "line", "label": "GPU utilisation %", "borderColor": "#f28e2b", "yAxisID": "pct", "pointRadius": 1,
         "data": [rnd(g) for _, g, _ in got]},
        {"type": "line", "label": "host CPU %", "borderColor": "#4e79a7", "yAxisID": "pct", "pointRadius": 1,
         "data": [rnd(c) for _, _, c in got]}]}


def _ns(v: int | None) -> str:
    if v is None:
        return "–"
    return f"{v / 1e9:.2f} s" if v >= NS else f"{v / 1e6:.1f} ms" if v >= 1_000_000 else f"{v / 1e3:.0f} µs"


def _chain_card(chain) -> str:  # noqa: ANN001 (CausalChain)
    ev = "".join(
        f"<tr><td>{esc(e.name)}</td><td class=num>{esc(e.value)} {esc(e.unit)}</td>"
        f"<td>{'<details><summary>SQL</summary><pre>' + esc(e.sql, 100_000) + '</pre></details>' if e.sql else ''}</td></tr>"
        for e in chain.evidence)
    culprits = ", ".join(f"{esc(c.comm or c.pid)} ({esc(c.relation)}, {_ns(c.ns)})" for c in chain.culprits)
    recs = "".join(f"<li>{esc(r)}</li>" for r in chain.recommendations)
    lost = f" · {chain.seconds_lost:.2f} s of feeding time" if chain.seconds_lost is not None else ""
    return (f'<section class="chain sev-{esc(chain.severity)}"><h3>[{esc(chain.severity)}] {esc(chain.summary)}</h3>'
            f'<p class=meta>{esc(chain.op)}{lost} · id {esc(chain.id)}</p>'
            f"<p><b>Root cause:</b> {esc(chain.root_cause)}</p><p>{esc(chain.explanation, 5_000)}</p>"
            + (f"<p><b>Culprits:</b> {culprits}</p>" if culprits else "")
            + (f"<table class=evidence><tr><th>evidence</th><th>value</th><th>recompute</th></tr>{ev}</table>" if ev else "")
            + (f"<p><b>Fix:</b></p><ul>{recs}</ul>" if recs else "") + "</section>")


def _process_table(report: Report) -> str:
    rows = []
    for p in report.processes:
        calls = sum(o.count for o in p.ops)
        rows.append(f"<tr><td class=num>{p.pid}</td><td>{esc(p.comm, 60)}</td><td class=num>{calls:,}</td>"
                    f"<td class=num>{p.context_switches:,}</td><td class=num>{_ns(p.off_cpu_ns)}</td>"
                    f"<td class=num>{_ns(p.preempted_ns)}</td><td class=num>{_ns(p.blocked_ns)}</td>"
                    f"<td class=num>{_ns(p.worst_stall_ns)}</td><td>{esc(', '.join(map(str, p.children)), 200)}</td></tr>")
    return ("<table class=procs><tr><th>pid</th><th>name</th><th>CUDA calls</th><th>context switches</th>"
            "<th>off-CPU</th><th>waiting for a CPU</th><th>sleeping</th><th>worst stall</th><th>children</th></tr>"
            + "".join(rows) + "</table>")


CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222}
h1{font-size:1.4em}.verdict{background:#fff7e6;border-left:4px solid #f28e2b;padding:.6em 1em}
.chart{height:320px;margin:1em 0 2em}.chain{border:1px solid #ddd;border-radius:6px;padding:.5em 1em;margin:1em 0}
.sev-HIGH{border-left:5px solid #e15759}.sev-MEDIUM{border-left:5px solid #f28e2b}.sev-LOW{border-left:5px solid #9c9c9c}
.meta{color:#666}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 6px;vertical-align:top}
.num{text-align:right;font-variant-numeric:tabular-nums}pre{white-space:pre-wrap;max-width:900px;font-size:12px}"""

JS = r"""
(function(){
  const specs = JSON.parse(document.getElementById('charts-data').textContent);
  const charts = [];
  specs.forEach(function(spec, i){
    const canvas = document.getElementById('chart-' + i);
    const scales = {pct: {position: spec.kind === 'host' ? 'left' : 'right', min: 0, max: 100,
                          title: {display: true, text: '%'}, grid: {drawOnChartArea: spec.kind === 'host'}}};
    if (spec.kind === 'thread') {
      scales.x = {stacked: true};
      scales.y = {stacked: true, min: 0, suggestedMax: 1000, title: {display: true, text: 'ms of each second'}};
    }
    const footer = function(items){
      if (!spec.culprits || !items.length) return '';
      const c = spec.culprits[items[0].dataIndex] || {};
      const out = [];
      if (c.cpu && c.cpu.length) out.push('CPU held by: ' + c.cpu.join(', '));
      if (c.woke && c.woke.length) out.push('woken by: ' + c.woke.join(', '));
      return out.join('\n');
    };
    charts.push(new Chart(canvas, {data: {labels: spec.labels, datasets: spec.datasets},
      options: {animation: false, responsive: true, maintainAspectRatio: false, interaction: {mode: 'index', intersect: false},
                plugins: {title: {display: true, text: spec.title}, tooltip: {callbacks: {footer: footer}}}, scales: scales}}));
  });
  window.ingeroCharts = charts;
})();
"""


def render_html(report: Report, charts: list[dict], db_name: str) -> str:
    """The page: verdict, charts, chains, processes, notes."""
    chart_js = (files("ingero_mcp.export") / "vendor" / "chart.umd.min.js").read_text(encoding="utf-8")
    verdict = "".join(f"<p>{esc(line)}</p>" for line in report.verdict) or "<p>(no verdict)</p>"
    canvases = "".join(f'<div class=chart><canvas id="chart-{i}" role="img" aria-label="{esc(c["title"])}"></canvas></div>'
                       for i, c in enumerate(charts))
    chains = "".join(_chain_card(c) for c in report.chains) or "<p>No causal chain found.</p>"
    minor = "".join(f"<li>{esc(m)}</li>" for m in report.minor)
    notes = "".join(f"<li>{esc(n)}</li>" for n in report.notes)
    cost = "".join(f"<p class=meta>{esc(line)}</p>" for line in cost_lines(report.info.tracing))  # v4 stores only
    w = report.window
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>ingero-mcp report: {esc(db_name, 200)}</title><style>{CSS}</style></head><body>
<h1>Why was the GPU job slow? <small>{esc(db_name, 200)}</small></h1>
<p class=meta>window {w.duration_ns / 1e9:.1f} s · {len(report.processes)} processes · {len(report.chains)} causal chains</p>
<div class=verdict id=verdict>{verdict}</div>
{'<div id=tracing-cost>' + cost + '</div>' if cost else ''}
<h2>Where each feeding thread's time went, second by second</h2>
<p class=meta>Hover a bar: who held the CPU while the thread waited, and who woke it.</p>
{canvases}
<h2>Causal chains</h2>{chains}
{'<h3>Minor causes</h3><ul>' + minor + '</ul>' if minor else ''}
<h2>Processes</h2>{_process_table(report)}
{'<h2>Notes</h2><ul>' + notes + '</ul>' if notes else ''}
<p class=meta>Made by ingero-mcp; charts by Chart.js (MIT). Every number has the SQL that recomputes it.</p>
<script type="application/json" id="charts-data">{script_json(charts)}</script>
<script>{chart_js}</script>
<script>{JS}</script>
</body></html>
"""


def build_html(con: duckdb.DuckDBPyConnection, report: Report, db_name: str) -> str:
    """The report page of an analysed store (report from build_report on the same connection)."""
    from ingero_mcp.analysis.accounting import origin_ns

    t0 = origin_ns(con) or report.window.start_ns
    feeders = [t for t in (report.accounting.threads if report.accounting else []) if t.role == "feeder"]
    culprits = _culprits(con, feeders, t0)
    entry_only = bool(report.accounting and report.accounting.entry_only_launches)
    charts = [_thread_chart(t, culprits, entry_only) for t in feeders]
    charts.append(_host_chart(con, report.window, t0))
    return render_html(report, charts, db_name)


def write_report(db: str | os.PathLike[str], out: str | os.PathLike[str], pids: list[int] | None = None,
                 since: str | None = None, start: str | None = None, end: str | None = None,
                 window: TimeWindow | None = None) -> int:
    """Write the HTML report of `db` (window/pids as in explain); returns its size in bytes."""
    from ingero_mcp.analysis.report import build_report
    from ingero_mcp.analysis.window import resolve_window
    from ingero_mcp.store import open_store

    check_output(out, reads=[db])
    con = open_store(db)
    try:
        if window is None and (since or start or end):
            window = resolve_window(con, since=since, start=start, end=end)
        report = build_report(con, window=window, pids=pids)
        page = build_html(con, report, Path(db).name)
    finally:
        con.close()
    data = page.encode("utf-8")
    write_whole(out, lambda f: f.write(data))
    return len(data)
