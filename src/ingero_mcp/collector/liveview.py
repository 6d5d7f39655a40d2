"""The `top`-like view while recording: per-op counts and latency, host context, lost events."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ingero_mcp.collector import records as R
from ingero_mcp.collector.tracer import Tracer
from ingero_mcp import units as fmt


class LiveView:
    """Re-renders after each flush of the tracer (about once a second)."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.console = Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=2, transient=False)
        self.t0 = time.monotonic()
        self.prev: tuple[float, Any] | None = None

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        self.tracer.on_flush = self.render
        return self

    def __exit__(self, *exc: object) -> None:
        self.tracer.on_flush = None
        self.live.__exit__(None, None, None)

    def render(self, tracer: Tracer) -> None:
        """Rebuild the view from the tracer's running totals."""
        now = time.monotonic()
        c = tracer.counter_snapshot
        rates = ""
        if self.prev is not None:
            dt = now - self.prev[0]
            pc = self.prev[1]
            sw = (c[R.C_SWITCH_TOTAL] - pc[R.C_SWITCH_TOTAL]) / dt
            pg = (c[R.C_PAGE_TOTAL] - pc[R.C_PAGE_TOTAL]) / dt
            rates = f"context switches {sw:,.0f}/s   page allocs {pg:,.0f}/s   "
        self.prev = (now, c.copy())
        ops = Table(title=None, expand=False, caption="off-CPU / preempted: share of the op's time in calls")
        for col in ("op", "calls", "p50 (~)", "p99 (~)", "max", "off-CPU", "preempted"):
            ops.add_column(col, justify="right" if col != "op" else "left", no_wrap=True)
        summary = tracer.op_summary()
        if not summary:
            ops.caption = "no CUDA call recorded yet"
        for op, n, p50, p99, mx, off, pre in summary[:20]:
            if p50 is None:  # entry-only (launches): counted, no duration
                ops.add_row(op, f"{n:,}", "entry-only", "", "", "", "")
                continue
            ops.add_row(op, f"{n:,}", fmt.ns(p50), fmt.ns(p99), fmt.ns(mx), f"{off:.0%}", f"{pre:.0%}")
        snap = tracer.snapshot
        cpu = snap.get("cpu_percent")
        mem = snap.get("mem_used_percent")
        gpu = snap.get("gpu_util_percent")
        host = ((f"{rates}CPU {cpu:.0f}%   " if cpu is not None else rates)
                + (f"mem {mem:.0f}%   " if mem is not None else ""))
        if gpu is not None:
            host += f"GPU {gpu:.0f}%"
        lost = tracer.lost(c)
        lost_text = "   ".join(f"{k} {v}" for k, v in lost.items())
        traced = sum(1 for p in tracer.procs.values() if p["traced"] and p["exit_ns"] is None)
        head = (f"ingero-mcp trace -> {tracer.opts.db}   {now - self.t0:,.0f} s   traced processes {traced}   "
                f"libraries {len(tracer.libs)}   rows: {tracer.stored['cuda_calls']:,} calls, "
                f"{tracer.stored['sched_intervals']:,} sched intervals")
        layers = tracer.layer_summary()
        probed = Text(f"probed: {layers}" if layers else "probed: no process maps libcudart/libcuda yet")
        self.live.update(Group(Text(head, style="bold"), probed, ops, Text(host), Text(cost_line(tracer)),
                               Text(f"lost: {lost_text}", style="red" if sum(lost.values()) else "green")))


def cost_line(tracer: Tracer) -> str:
    """The tracing cost so far, as the governor estimates it (hits x the per-hit costs measured at start), and the
    scheduler records' and page allocations' (off-CPU intervals stored and traced processes' pages harvested x their
    costs measured at start), as explain adds them."""
    gov = tracer.governor
    if gov is None:
        return ""
    worst = max(gov.last_share.items(), key=lambda kv: kv[1], default=None)
    e, r = tracer.costs["entry"].cost_ns, tracer.costs["entry_return"].cost_ns
    intervals, per_interval = tracer.stored["sched_intervals"], tracer.sched_cost.cost_ns
    tracepoints = ("the scheduler records' share unknown (not measured)" if per_interval is None else
                   f"+{intervals * per_interval / 1e9:.2f} s by the scheduler records ({intervals:,} off-CPU "
                   f"intervals x {per_interval:.0f} ns)")
    pages, per_page = tracer.traced_pages, tracer.page_cost.cost_ns
    tracepoints += (", the page allocations' share unknown (not measured)" if per_page is None else
                    f", +{pages * per_page / 1e9:.2f} s by the page-allocation tracepoint ({pages:,} pages x "
                    f"{per_page:.0f} ns)")
    text = (f"tracing cost (estimated): {gov.total_added_ns / 1e9:.2f} s added by the CUDA probes so far, "
            f"{tracepoints}; per hit {e:.0f} ns entry-only, {r:.0f} ns entry + return; launch probes attached "
            f"{gov.duty:.0%} of the time")
    if worst is not None:
        text += f"; highest now pid {worst[0]} at {100 * worst[1]:.1f} % at full coverage"
    return text
