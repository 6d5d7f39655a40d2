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
import re
from collections import defaultdict
from importlib.resources import files
from pathlib import Path

import duckdb

from ingero_mcp.analysis import cost_lines
from ingero_mcp.analysis import CausalChain, ProcessBreakdown, Report, ThreadAccount, TimeWindow
from ingero_mcp.export.flame import flame_html
from ingero_mcp.export.output import check_output, write_whole
from ingero_mcp.render.summary import cost_line
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
# Kernel threads (no user code of the job): folded into one row of the processes table.
KERNEL_THREAD = re.compile(r"(kworker|ksoftirqd|swapper|irq/|rcu_|migration|kthreadd|cpuhp|idle_inject|watchdog|"
                           r"kcompactd|kswapd|khugepaged|oom_reaper|kblockd|kauditd|khungtaskd|ksmd|jbd2/|kthrotld|"
                           r"kdevtmpfs|writeback|mm_percpu_wq|kintegrityd|ecryptfs|nvme-|scsi_|nvidia|nv_queue|UVM )")
SHADE = {"HIGH": "rgba(225,87,89,0.16)", "MEDIUM": "rgba(242,142,43,0.16)", "LOW": "rgba(156,156,156,0.14)"}


def esc(text: object, cap: int = 2_000) -> str:
    """A traced (or any) string for HTML text: cleaned, capped, escaped."""
    return html.escape(clean("" if text is None else str(text), cap))


def script_json(data: object) -> str:
    """JSON safe inside <script type="application/json">: no '<' can end the element."""
    return json.dumps(data, ensure_ascii=True, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")


def _culprits(con: duckdb.DuckDBPyConnection, threads: list[ThreadAccount], t0: int) -> dict:
    """Per (tid, second): who held the CPU while it waited, who woke it, by time (the top few)."""
    tids = [t.tid for t in threads]
    if not tids:
        return {}
    got = con.execute(f"""
        SELECT tid, (start_ns - {int(t0)}) // {NS} AS k, state,
               CASE WHEN state = 'cpu_wait' THEN coalesce(first_holder_comm, last_holder_comm)
                    ELSE waker_comm END AS who,
               sum(dur_ns) AS ns
        FROM thread_state WHERE tid IN ({', '.join(map(str, tids))}) AND state IN ('cpu_wait', 'sleeping')
        GROUP BY ALL HAVING who IS NOT NULL ORDER BY tid, k, state, ns DESC""").fetchall()
    out: dict = defaultdict(lambda: {"cpu_wait": [], "sleeping": []})
    for tid, k, state, who, ns in got:
        lst = out[(tid, int(k))][state]
        if len(lst) < TOP_CULPRITS:
            lst.append(f"{clean(who, 40)} {ns / 1e6:.0f} ms")
    return out


def _chain_windows(chains: list[CausalChain], ks: list[int], t0: int, pid: int | None = None) -> list[dict]:
    """The chains' windows as ranges of chart points (the seconds `ks`), to shade: a thread's chart gets the chains of
    its process, the host chart every chain."""
    out = []
    for c in chains:
        if c.window is None or not ks or (pid is not None and pid not in c.pids):
            continue
        first, last = (c.window.start_ns - t0) // NS, -(-(c.window.end_ns - t0) // NS) - 1
        idx = [i for i, k in enumerate(ks) if first <= k <= max(first, last)]
        if idx:
            color = SHADE.get(c.severity, SHADE["LOW"])
            out.append({"from": idx[0], "to": idx[-1], "severity": c.severity, "color": color,
                        "label": f"{c.severity} {clean(c.root_cause, 40)}"})
    return out


def _thread_chart(t: ThreadAccount, culprits: dict, entry_only: bool = False, chains: list[CausalChain] | None = None,
                  t0: int = 0, verdict: bool = False) -> dict:
    labels = [f"{s.k}s" for s in t.seconds]
    datasets = [{"type": "bar",
                 "label": name + (" (incl. kernel launches, entry-only)" if entry_only and i == 0 else ""),
                 "backgroundColor": color, "stack": "t", "yAxisID": "y", "unit": "ms of the second",
                 "data": [round(part(s) / 1e6, 2) for s in t.seconds]} for i, (name, color, part) in enumerate(PARTS)]
    datasets.append({"type": "line", "label": "GPU utilisation %", "borderColor": "#f28e2b", "yAxisID": "pct",
                     "unit": "% busy (NVML, mean of the second)", "pointRadius": 0,
                     "data": [s.gpu_util_percent for s in t.seconds]})
    hover = []
    for s in t.seconds:
        c = culprits.get((t.tid, s.k), {})
        hover.append({"cpu": c.get("cpu_wait", []), "woke": c.get("sleeping", [])})
    title = (f"{clean(t.comm or '?', 60)} (tid {t.tid}, pid {t.pid} {clean(t.process_comm or '', 60)})"
             + (": the thread the verdict names" if verdict else ""))
    return {"kind": "thread", "title": title, "labels": labels, "datasets": datasets, "culprits": hover, "tid": t.tid,
            "windows": _chain_windows(chains or [], [s.k for s in t.seconds], t0, t.pid)}


def _host_chart(con: duckdb.DuckDBPyConnection, window: TimeWindow, t0: int,
                chains: list[CausalChain] | None = None) -> dict:
    got = con.execute(f"""SELECT (ts_ns - {int(t0)}) // {NS} AS k, avg(gpu_util_percent), avg(cpu_percent)
                          FROM snapshots WHERE ts_ns BETWEEN {int(window.start_ns)} AND {int(window.end_ns)}
                          GROUP BY k ORDER BY k""").fetchall()
    labels = [f"{int(k)}s" for k, _, _ in got]
    rnd = lambda v: None if v is None else round(float(v), 1)  # noqa: E731
    return {"kind": "host", "title": "GPU utilisation and host CPU", "labels": labels, "datasets": [
        {"type": "line", "label": "GPU utilisation %", "borderColor": "#f28e2b", "yAxisID": "pct", "pointRadius": 1,
         "unit": "% busy (NVML, mean of the second)", "data": [rnd(g) for _, g, _ in got]},
        {"type": "line", "label": "host CPU %", "borderColor": "#4e79a7", "yAxisID": "pct", "pointRadius": 1,
         "unit": "% of all CPUs busy (mean of the second)", "data": [rnd(c) for _, _, c in got]}],
        "windows": _chain_windows(chains or [], [int(k) for k, _, _ in got], t0)}


def _ns(v: int | None) -> str:
    if v is None:
        return "–"
    return f"{v / 1e9:.2f} s" if v >= NS else f"{v / 1e6:.1f} ms" if v >= 1_000_000 else f"{v / 1e3:.0f} µs"


def _chain_card(chain) -> str:  # noqa: ANN001 (CausalChain)
    ev = "".join(
        f"<tr><td>{esc(e.name)}</td><td class=num>{esc(e.value)} {esc(e.unit)}</td>"
        f"<td>{'<details><summary>SQL</summary><pre>' + esc(e.sql, 100_000) + '</pre></details>' if e.sql else ''}"
        "</td></tr>"
        for e in chain.evidence)
    culprits = ", ".join(f"{esc(c.comm or c.pid)} ({esc(c.relation)}, {_ns(c.ns)})" for c in chain.culprits)
    recs = "".join(f"<li>{esc(r)}</li>" for r in chain.recommendations)
    lost = f" · {chain.seconds_lost:.2f} s of feeding time" if chain.seconds_lost is not None else ""
    return (f'<section class="chain sev-{esc(chain.severity)}"><h3>[{esc(chain.severity)}] {esc(chain.summary)}</h3>'
            f'<p class=meta>{esc(chain.op)}{lost} · id {esc(chain.id)}</p>'
            f"<p><b>Root cause:</b> {esc(chain.root_cause)}</p><p>{esc(chain.explanation, 5_000)}</p>"
            + (f"<p><b>Culprits:</b> {culprits}</p>" if culprits else "")
            + (f"<table class='evidence sortable'><thead><tr><th>evidence</th><th>value</th><th>recompute</th></tr>"
               f"</thead><tbody>{ev}</tbody></table>" if ev else "")
            + flame_html(chain.frames)
            + (f"<p><b>Fix:</b></p><ul>{recs}</ul>" if recs else "") + "</section>")


def is_kernel_thread(p: ProcessBreakdown) -> bool:
    """A kernel thread (kworker, ksoftirqd, migration, swapper...): no CUDA call, a kernel thread's name or pid 0/2."""
    return not p.ops and (p.pid in (0, 2) or p.ppid == 2 or bool(KERNEL_THREAD.match(p.comm or "")))


def _cell(value: float | int | None, text: str) -> str:
    """A number cell that sorts by its value (data-v), shown as `text`."""
    return f"<td class=num data-v={'' if value is None else value}>{text}</td>"


def _process_table(report: Report) -> str:
    """Every process, kernel threads folded into one row (their names listed in it); sortable by any column."""
    def row(name: str, pid: object, calls: int, switches: int, off: int | None, pre: int | None, blk: int | None,
            stall: int | None, children: str) -> str:
        return (f"<tr><td class=num data-v={pid if isinstance(pid, int) else ''}>{pid}</td><td>{name}</td>"
                + _cell(calls, f"{calls:,}") + _cell(switches, f"{switches:,}") + _cell(off, _secs(off))
                + _cell(pre, _secs(pre)) + _cell(blk, _secs(blk)) + _cell(stall, _ns(stall))
                + f"<td>{children}</td></tr>")

    rows = []
    kernel = [p for p in report.processes if is_kernel_thread(p)]
    for p in report.processes:
        if p in kernel:
            continue
        rows.append(row(esc(p.comm, 60), p.pid, sum(o.count for o in p.ops), p.context_switches, p.off_cpu_ns,
                        p.preempted_ns, p.blocked_ns, p.worst_stall_ns, esc(", ".join(map(str, p.children)), 200)))
    if kernel:
        def total(values: list[int | None]) -> int | None:
            known = [v for v in values if v is not None]
            return sum(known) if known else None
        names = esc(", ".join(f"{p.comm}[{p.pid}]" for p in kernel), 20_000)
        label = (f"<details><summary>kernel threads ({len(kernel)})</summary><span class=meta>{names}</span>"
                 "</details>")
        rows.append(row(label, "", 0, sum(p.context_switches for p in kernel), total([p.off_cpu_ns for p in kernel]),
                        total([p.preempted_ns for p in kernel]), total([p.blocked_ns for p in kernel]),
                        max((p.worst_stall_ns for p in kernel if p.worst_stall_ns is not None), default=None), ""))
    head = "".join(f'<th title="{esc(tip)}">{esc(name)}</th>' for name, tip in (
        ("pid", "process id"), ("name", "the process's name (comm)"), ("CUDA calls", "CUDA calls stored as rows"),
        ("context switches", "switches of all its threads"),
        ("off-CPU (thread-s)", "off-CPU time summed over its threads, in thread-seconds"),
        ("waiting for a CPU (thread-s)", "preempted: runnable, waiting for a CPU, summed over its threads"),
        ("sleeping (thread-s)", "blocked: asleep, summed over its threads"),
        ("worst stall", "its longest single off-CPU interval"), ("children", "its child processes")))
    return (f"<table class='procs sortable'><thead><tr>{head}</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
            "<p class=meta>Click a column's header to sort by it. thread-s: seconds summed over a process's threads "
            "(a process with many threads can exceed the window).</p>")


def _secs(v: int | None) -> str:
    """ns as seconds for a thread-seconds column."""
    return "–" if v is None else f"{v / 1e9:,.2f}" if v >= 10_000_000 else f"{v / 1e9:.3f}"


CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222}
h1{font-size:1.4em}.verdict{background:#fff7e6;border-left:4px solid #f28e2b;padding:.6em 1em}
.chart{height:320px;margin:1em 0 2em}.chain{border:1px solid #ddd;border-radius:6px;padding:.5em 1em;margin:1em 0}
.sev-HIGH{border-left:5px solid #e15759}.sev-MEDIUM{border-left:5px solid #f28e2b}\
.sev-LOW{border-left:5px solid #9c9c9c}
.meta{color:#666}table{border-collapse:collapse;margin:.5em 0}\
td,th{border:1px solid #ddd;padding:2px 6px;vertical-align:top}
.num{text-align:right;font-variant-numeric:tabular-nums}pre{white-space:pre-wrap;max-width:900px;font-size:12px}
table.sortable th{cursor:pointer;user-select:none}table.sortable th[aria-sort=ascending]::after{content:" \\25B2"}
table.sortable th[aria-sort=descending]::after{content:" \\25BC"}.shade{padding:0 .4em;border-radius:3px}
svg.flame{display:block;margin:.5em 0 1em}svg.flame g.frame:hover rect{stroke:#222}"""

JS = r"""
(function(){
  const specs = JSON.parse(document.getElementById('charts-data').textContent);
  // the causal chains' windows, shaded behind the bars and lines, each with its label at the top
  const chainWindows = {id: 'chainWindows', beforeDatasetsDraw: function(chart, args, opts){
    const ws = opts.windows || [], x = chart.scales.x, area = chart.chartArea, ctx = chart.ctx;
    if (!x || !ws.length) return;
    const n = chart.data.labels.length;
    const step = n > 1 ? Math.abs(x.getPixelForValue(1) - x.getPixelForValue(0)) : (area.right - area.left);
    const rows = [];  // per label row, where its last label ends: a label goes in the first row it fits
    ws.forEach(function(w){
      const x0 = Math.max(area.left, x.getPixelForValue(w.from) - step / 2);
      const x1 = Math.min(area.right, x.getPixelForValue(w.to) + step / 2);
      ctx.save();
      ctx.fillStyle = w.color;
      ctx.fillRect(x0, area.top, x1 - x0, area.bottom - area.top);
      ctx.fillStyle = '#444'; ctx.font = '11px system-ui, sans-serif';
      const width = ctx.measureText(w.label).width;
      let row = rows.findIndex(function(end){ return end < x0; });
      if (row < 0) { row = rows.length; rows.push(0); }
      rows[row] = x0 + width + 6;
      ctx.fillText(w.label, x0 + 3, area.top + 12 + 13 * row);
      ctx.restore();
    });
  }};
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
    const label = function(item){
      const v = item.parsed && item.parsed.y;
      const known = v !== null && v !== undefined;
      return item.dataset.label + ': ' + (known ? v + ' ' + (item.dataset.unit || '') : 'not recorded');
    };
    const title = function(items){
      const k = items.length ? String(items[0].label).replace('s', '') : null;
      return k === null ? '' : 'second ' + k + ' (+' + k + ' s from the trace start)';
    };
    charts.push(new Chart(canvas, {data: {labels: spec.labels, datasets: spec.datasets}, plugins: [chainWindows],
      options: {animation: false, responsive: true, maintainAspectRatio: false,
                interaction: {mode: 'index', intersect: false},
                plugins: {title: {display: true, text: spec.title}, chainWindows: {windows: spec.windows || []},
                          tooltip: {callbacks: {footer: footer, label: label, title: title}}}, scales: scales}}));
  });
  window.ingeroCharts = charts;
  // sortable tables: a click on a header sorts the rows by that column (numbers by their value), again to reverse
  document.querySelectorAll('table.sortable').forEach(function(table){
    const heads = table.querySelectorAll('thead th');
    heads.forEach(function(th, col){
      th.addEventListener('click', function(){
        const body = table.tBodies[0];
        const desc = th.getAttribute('aria-sort') === 'ascending';
        heads.forEach(function(h){ h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', desc ? 'descending' : 'ascending');
        const key = function(tr){
          const td = tr.cells[col];
          if (!td) return '';
          const v = td.getAttribute('data-v');
          if (v !== null) return v === '' ? -Infinity : parseFloat(v);
          return td.textContent.trim().toLowerCase();
        };
        const rows = Array.from(body.rows);
        rows.sort(function(a, b){
          const ka = key(a), kb = key(b);
          const c = (typeof ka === 'number' && typeof kb === 'number') ? ka - kb : String(ka).localeCompare(String(kb));
          return desc ? -c : c;
        });
        rows.forEach(function(r){ body.appendChild(r); });
      });
    });
  });
})();
"""


def render_html(report: Report, charts: list[dict], db_name: str) -> str:
    """The page: verdict, charts, chains, processes, notes."""
    chart_js = (files("ingero_mcp.export") / "vendor" / "chart.umd.min.js").read_text(encoding="utf-8")
    verdict = "".join(f"<p>{esc(line)}</p>" for line in report.verdict) or "<p>(no verdict)</p>"
    canvases = "".join(f'<div class=chart><canvas id="chart-{i}" role="img" '
                       f'aria-label="{esc(c["title"])}"></canvas></div>' for i, c in enumerate(charts))
    chains = "".join(_chain_card(c) for c in report.chains) or "<p>No causal chain found.</p>"
    minor = "".join(f"<li>{esc(m)}</li>" for m in report.minor)
    notes = "".join(f"<li>{esc(n)}</li>" for n in report.notes)
    lines = cost_lines(report.info.tracing)  # v4 stores only
    cost = (f"<details><summary class=meta>{esc(cost_line(report, ' (open for the detail and why)'))}</summary>"
            + "".join(f"<p class=meta>{esc(line)}</p>" for line in lines) + "</details>") if lines else ""
    w = report.window
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; \
style-src 'unsafe-inline'; img-src data:">
<title>ingero-mcp report: {esc(db_name, 200)}</title><style>{CSS}</style></head><body>
<h1>Why was the GPU job slow? <small>{esc(db_name, 200)}</small></h1>
<p class=meta>window {w.duration_ns / 1e9:.1f} s · {len(report.processes)} processes · \
{len(report.chains)} causal chains</p>
<div class=verdict id=verdict>{verdict}</div>
{'<div id=tracing-cost>' + cost + '</div>' if cost else ''}
<h2>Where each feeding thread's time went, second by second</h2>
<p class=meta>Hover a bar: who held the CPU while the thread waited, and who woke it. Shaded: the causal chains'
windows (<span class=shade style="background:{SHADE['HIGH']}">HIGH</span>
<span class=shade style="background:{SHADE['MEDIUM']}">MEDIUM</span>
<span class=shade style="background:{SHADE['LOW']}">LOW</span>).</p>
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
    from ingero_mcp.analysis import origin_ns

    t0 = origin_ns(con) or report.window.start_ns
    acc = report.accounting
    feeders = [t for t in (acc.threads if acc else []) if t.role == "feeder"]
    if acc and feeders:  # the thread the verdict names first (one per process, busiest first), then the others
        from ingero_mcp.analysis import pace_threads

        paced = pace_threads(acc)
        feeders = paced + [t for t in feeders if t not in paced]
    culprits = _culprits(con, feeders, t0)
    entry_only = bool(acc and acc.entry_only_launches)
    own = [c for c in report.chains if c.origin == "ingero-mcp"]
    charts = [_thread_chart(t, culprits, entry_only, own, t0, verdict=i == 0) for i, t in enumerate(feeders)]
    charts.append(_host_chart(con, report.window, t0, own))
    return render_html(report, charts, db_name)


def write_report(db: str | os.PathLike[str], out: str | os.PathLike[str], pids: list[int] | None = None,
                 since: str | None = None, start: str | None = None, end: str | None = None,
                 window: TimeWindow | None = None) -> int:
    """Write the HTML report of `db` (window/pids as in explain); returns its size in bytes."""
    from ingero_mcp.analysis import diagnose
    from ingero_mcp.analysis import resolve_window
    from ingero_mcp.analysis import open_finished

    check_output(out, reads=[db])
    con = open_finished(db)
    try:
        if window is None and (since or start or end):
            window = resolve_window(con, since=since, start=start, end=end)
        report = diagnose(con, window=window, pids=pids)
        page = build_html(con, report, Path(db).name)
    finally:
        con.close()
    data = page.encode("utf-8")
    write_whole(out, lambda f: f.write(data))
    return len(data)
