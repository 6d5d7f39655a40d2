"""Vectorised building blocks of synthetic traces: call loops, scheduler intervals, aggregates.

The scenarios in `scenarios.py` describe *what* happens on a host; this module turns that into
columnar batches for `TraceWriter` the way the real collector would record them: every CUDA call
of a traced thread with its per-call attribution, the scheduler intervals that attribution is
made of, exact per-(pid, 1 s) counts for every process, and snapshots. Everything is numpy arrays;
no Python loop runs per event, so 10M-event traces are cheap to make.
"""

from __future__ import annotations

import json
import platform
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ingero_mcp.store import TraceWriter

SEC = 1_000_000_000
MS = 1_000_000
US = 1_000
PAGE_BYTES = 4096
BUCKET_NS = SEC

# 2026-01-15 10:00:00 UTC: a fixed epoch so that every run of a scenario is the same trace.
T0_NS = 1_768_471_200 * SEC

PreemptorFn = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def dict_array(values: list[str], indices: np.ndarray) -> pa.DictionaryArray:
    """A string column as Arrow dictionary (one small dictionary, int32 indices): no Python strings per row."""
    return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32)), pa.array(values, pa.string()))


def const_str(value: str, n: int) -> pa.DictionaryArray:
    """A column of `n` copies of one string."""
    return dict_array([value], np.zeros(n, np.int32))


def lognormal(rng: np.random.Generator, median: np.ndarray | float, sigma: np.ndarray | float, n: int) -> np.ndarray:
    """Durations (ns) with the given median: latency distributions of real calls are close to this."""
    return np.maximum(1.0, np.asarray(median, dtype=np.float64) * np.exp(sigma * rng.standard_normal(n)))


@dataclass(frozen=True)
class OpSpec:
    """One CUDA call of a loop iteration: how long it takes when nothing disturbs it, and the
    Python/CPU time spent before it (`gap_ns`), part of which may be a blocking wait (`block_ns`)."""

    op: str
    median_ns: float
    sigma: float = 0.3
    bytes: int | None = None
    kind: str | None = None
    gap_ns: float = 20 * US
    block_ns: float = 0.0
    repeat: int = 1
    stream: int = 0


@dataclass
class Calls:
    """The calls of one thread over one time window, before they are written (all arrays, same length)."""

    spec_idx: np.ndarray
    dur: np.ndarray
    gap_cpu: np.ndarray
    gap_block: np.ndarray
    gap_pre: np.ndarray
    pre: np.ndarray
    blk: np.ndarray
    n_pre: np.ndarray
    n_blk: np.ndarray
    pages: np.ndarray
    ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def gap(self) -> np.ndarray:
        """Time between the previous call's return and this call's entry."""
        return self.gap_cpu + self.gap_block + self.gap_pre

    def layout(self, start_ns: int) -> None:
        """Place the calls one after another from `start_ns`: each call starts after its gap."""
        gap = self.gap
        self.ts = start_ns + np.cumsum(gap) + (np.cumsum(self.dur) - self.dur)

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the calls in `mask` (every array filtered alike)."""
        for name in ("spec_idx", "dur", "gap_cpu", "gap_block", "gap_pre", "pre", "blk", "n_pre", "n_blk", "pages", "ts"):
            setattr(self, name, getattr(self, name)[mask])

    def add_stall(self, mask: np.ndarray, pre: np.ndarray | None = None, blk: np.ndarray | None = None,
                  n_pre: np.ndarray | None = None, n_blk: np.ndarray | None = None) -> None:
        """Lengthen the calls in `mask` by off-CPU time: preempted (runnable, waiting for a CPU) and/or blocked."""
        k = int(mask.sum())
        zero = np.zeros(k, np.int64)
        pre_v = zero if pre is None else pre.astype(np.int64)
        blk_v = zero if blk is None else blk.astype(np.int64)
        self.pre[mask] += pre_v
        self.blk[mask] += blk_v
        self.dur[mask] += pre_v + blk_v
        self.n_pre[mask] += np.where(pre_v > 0, 1 if n_pre is None else n_pre, 0)
        self.n_blk[mask] += np.where(blk_v > 0, 1 if n_blk is None else n_blk, 0)


def loop_calls(rng: np.random.Generator, template: list[OpSpec], start_ns: int, end_ns: int) -> Calls:
    """Repeat `template` (one loop iteration) from `start_ns` until `end_ns`, with lognormal jitter."""
    specs = [i for i, s in enumerate(template) for _ in range(s.repeat)]
    med = np.array([template[i].median_ns for i in specs])
    sig = np.array([template[i].sigma for i in specs])
    gap_med = np.array([template[i].gap_ns for i in specs])
    blk_med = np.array([template[i].block_ns for i in specs])
    period = float(med.sum() + gap_med.sum() + blk_med.sum())
    n_iter = max(1, int((end_ns - start_ns) / period * 1.1) + 1)
    idx = np.tile(np.array(specs, np.int32), n_iter)
    n = idx.size
    pos = np.tile(np.arange(len(specs)), n_iter)
    dur = lognormal(rng, med[pos], sig[pos], n).astype(np.int64)
    gap_cpu = lognormal(rng, gap_med[pos], 0.4, n).astype(np.int64)
    gap_block = np.where(blk_med[pos] > 0, lognormal(rng, np.maximum(blk_med[pos], 1), 0.5, n), 0).astype(np.int64)
    z = np.zeros(n, np.int64)
    calls = Calls(idx, dur, gap_cpu, gap_block, z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), z.copy())
    calls.layout(start_ns)
    return calls


@dataclass
class Proc:
    """A process as the collector's process table records it."""

    pid: int
    comm: str
    cmdline: str
    ppid: int | None = None
    traced: bool = False
    first_seen_ns: int | None = None
    last_seen_ns: int | None = None
    exit_ns: int | None = None
    exit_code: int | None = None


class TraceBuilder:
    """Accumulates one synthetic session and writes it through `TraceWriter` in columnar batches.

    Rows (cuda_calls, sched_intervals) are written as they are made; exact per-(pid, bucket)
    counts are accumulated in arrays and written as host_aggregates at the end, so aggregates
    always count at least the rows stored (equal for traced threads' sched_switch).
    """

    def __init__(self, writer: TraceWriter, start_ns: int, end_ns: int, seed: int) -> None:
        self.w = writer
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.rng = np.random.default_rng(seed)
        self.n_buckets = int((end_ns - start_ns + BUCKET_NS - 1) // BUCKET_NS)
        self.procs: dict[int, Proc] = {}
        self._agg: dict[tuple[int, str], np.ndarray] = defaultdict(lambda: np.zeros(self.n_buckets, np.int64))
        self._agg_stored: dict[tuple[int, str], np.ndarray] = defaultdict(lambda: np.zeros(self.n_buckets, np.int64))
        self._agg_bytes: dict[tuple[int, str], np.ndarray] = defaultdict(lambda: np.zeros(self.n_buckets, np.int64))
        self.process_events: list[dict[str, Any]] = []
        self.counts: dict[str, int] = defaultdict(int)

    # -- processes -------------------------------------------------------------------------
    def proc(self, p: Proc) -> Proc:
        """Register a process (alive for the whole trace unless told otherwise)."""
        if p.first_seen_ns is None:
            p.first_seen_ns = self.start_ns
        if p.last_seen_ns is None:
            p.last_seen_ns = p.exit_ns if p.exit_ns is not None else self.end_ns
        self.procs[p.pid] = p
        return p

    def fork_exec_exit(self, parent: int, p: Proc, fork_ns: int, exec_file: str | None = None,
                       exec_ns: int | None = None) -> Proc:
        """A child process born (and possibly exiting) inside the trace, with its events."""
        p.ppid = parent
        p.first_seen_ns = fork_ns
        self.proc(p)
        parent_comm = self.procs[parent].comm if parent in self.procs else None
        self.process_events.append(dict(ts_ns=fork_ns, event="fork", pid=parent, tid=parent, child_pid=p.pid, comm=parent_comm))
        if exec_file is not None:
            self.process_events.append(dict(ts_ns=exec_ns or fork_ns + 300 * US, event="exec", pid=p.pid, tid=p.pid,
                                            comm=p.comm, filename=exec_file))
        if p.exit_ns is not None:
            self.process_events.append(dict(ts_ns=p.exit_ns, event="exit", pid=p.pid, tid=p.pid, comm=p.comm,
                                            exit_code=p.exit_code or 0))
        return p

    def comm_of(self, pids: np.ndarray, cpu: np.ndarray, cpus: int) -> tuple[list[str], np.ndarray]:
        """Dictionary + indices of the comms of `pids` (pid 0 is the idle task `swapper/<cpu>`)."""
        keys = np.array(sorted(self.procs), np.int64)
        names = sorted({p.comm for p in self.procs.values()})
        name_idx = {n: i for i, n in enumerate(names)}
        by_key = np.array([name_idx[self.procs[int(k)].comm] for k in keys], np.int32)
        pos = np.clip(np.searchsorted(keys, pids), 0, len(keys) - 1)
        found = keys[pos] == pids
        names = names + [f"swapper/{c}" for c in range(cpus)]
        return names, np.where(found, by_key[pos], len(name_idx) + cpu).astype(np.int32)

    # -- buckets ---------------------------------------------------------------------------
    def _bucket(self, ts: np.ndarray) -> np.ndarray:
        return np.clip((ts - self.start_ns) // BUCKET_NS, 0, self.n_buckets - 1)

    def count(self, pid: int, op: str, ts: np.ndarray, weights: np.ndarray | None = None,
              stored: bool = False, nbytes: np.ndarray | None = None) -> None:
        """Add exact event counts (one per ts, or `weights` each) to the (pid, bucket) aggregates."""
        b = self._bucket(ts)
        w = np.ones(ts.size, np.int64) if weights is None else weights.astype(np.int64)
        self._agg[(pid, op)] += np.bincount(b, weights=w, minlength=self.n_buckets).astype(np.int64)
        if stored:
            self._agg_stored[(pid, op)] += np.bincount(b, weights=w, minlength=self.n_buckets).astype(np.int64)
        if nbytes is not None:
            self._agg_bytes[(pid, op)] += np.bincount(b, weights=nbytes.astype(np.float64), minlength=self.n_buckets).astype(np.int64)

    def background(self, pid: int, op: str, rate_per_s: np.ndarray | float, pages_per_event: float = 1.0) -> None:
        """Counted-only activity of a process: Poisson counts per bucket at `rate_per_s` (array per bucket or scalar)."""
        rate = np.broadcast_to(np.asarray(rate_per_s, np.float64), (self.n_buckets,))
        counts = self.rng.poisson(rate).astype(np.int64)
        p = self.procs[pid]
        alive = self._alive_mask(p)
        counts = counts * alive
        self._agg[(pid, op)] += counts
        if op == "mm_page_alloc":
            self._agg_bytes[(pid, op)] += (counts * pages_per_event * PAGE_BYTES).astype(np.int64)

    def _alive_mask(self, p: Proc) -> np.ndarray:
        starts = self.start_ns + np.arange(self.n_buckets, dtype=np.int64) * BUCKET_NS
        first = p.first_seen_ns or self.start_ns
        last = p.exit_ns if p.exit_ns is not None else self.end_ns
        return ((starts + BUCKET_NS > first) & (starts < last)).astype(np.int64)

    # -- rows ------------------------------------------------------------------------------
    def emit_calls(self, pid: int, tid: int, template: list[OpSpec], calls: Calls,
                   preemptor: PreemptorFn, blocked_next: PreemptorFn, cpus: int) -> None:
        """Write a thread's CUDA calls and the scheduler intervals their attribution is made of."""
        calls.keep(calls.ts + calls.dur <= self.end_ns)
        n = calls.ts.size
        if n == 0:
            return
        ops = [s.op for s in template]
        op_names = sorted(set(ops))
        op_idx = np.array([op_names.index(o) for o in ops], np.int32)[calls.spec_idx]
        byt = np.array([-1 if s.bytes is None else s.bytes for s in template], np.int64)[calls.spec_idx]
        kinds = sorted({s.kind for s in template if s.kind})
        kind_idx = np.array([kinds.index(s.kind) if s.kind else -1 for s in template], np.int32)[calls.spec_idx]
        stream = np.array([s.stream for s in template], np.uint64)[calls.spec_idx]
        off = calls.pre + calls.blk
        pages = calls.pages
        kind_col = pa.DictionaryArray.from_arrays(
            pa.array(kind_idx, mask=kind_idx < 0), pa.array(kinds or [""], pa.string()))
        batch = pa.table({
            "ts_ns": pa.array(calls.ts, pa.int64()),
            "duration_ns": pa.array(calls.dur, pa.int64()),
            "pid": pa.array(np.full(n, pid, np.int32)),
            "tid": pa.array(np.full(n, tid, np.int32)),
            "api": const_str("runtime", n),
            "op": dict_array(op_names, op_idx),
            "bytes": pa.array(byt, mask=byt < 0),
            "memcpy_kind": kind_col,
            "stream": pa.array(stream, pa.uint64()),
            "return_code": pa.array(np.zeros(n, np.int32)),
            "off_cpu_ns": pa.array(off),
            "cpu_wait_ns": pa.array(calls.pre),
            "sleep_ns": pa.array(calls.blk),
            "context_switches": pa.array((calls.n_pre + calls.n_blk).astype(np.int32)),
            "page_allocs": pa.array(pages.astype(np.int32)),
            "page_alloc_bytes": pa.array(pages * PAGE_BYTES),
            "gpu_id": pa.array(np.zeros(n, np.int32)),
        })
        self.w.append("cuda_calls", batch)
        self.counts["cuda"] += n
        has_pages = pages > 0
        if has_pages.any():
            self.count(pid, "mm_page_alloc", calls.ts[has_pages], weights=pages[has_pages],
                       nbytes=pages[has_pages] * PAGE_BYTES)
        # Scheduler intervals inside the calls: preempted ones first, then blocked ones, spread
        # evenly over the call's on-CPU time so that they sum exactly to the call's attribution.
        in_call = self._split_intervals(calls.ts, calls.dur, calls.pre, calls.blk, calls.n_pre, calls.n_blk)
        # Intervals inside the gaps before the calls: a preemption, then a blocking wait.
        gap_start = calls.ts - calls.gap
        third = calls.gap_cpu // 3
        pre_mask = calls.gap_pre > 0
        blk_mask = calls.gap_block > 0
        g_off = np.concatenate([(gap_start + third)[pre_mask], (gap_start + 2 * third + calls.gap_pre)[blk_mask]])
        g_len = np.concatenate([calls.gap_pre[pre_mask], calls.gap_block[blk_mask]])
        g_pre = np.concatenate([np.ones(int(pre_mask.sum()), bool), np.zeros(int(blk_mask.sum()), bool)])
        off_ns = np.concatenate([in_call[0], g_off])
        length = np.concatenate([in_call[1], g_len])
        is_pre = np.concatenate([in_call[2], g_pre])
        keep = off_ns >= self.start_ns
        self.emit_intervals(pid, tid, off_ns[keep], length[keep], is_pre[keep], preemptor, blocked_next, cpus)

    @staticmethod
    def _split_intervals(ts: np.ndarray, dur: np.ndarray, pre: np.ndarray, blk: np.ndarray,
                         n_pre: np.ndarray, n_blk: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = (n_pre + n_blk).astype(np.int64)
        sel = np.nonzero(n > 0)[0]
        if sel.size == 0:
            e = np.zeros(0, np.int64)
            return e, e, np.zeros(0, bool)
        n_s = n[sel]
        total = int(n_s.sum())
        call = np.repeat(sel, n_s)
        first = np.repeat(np.cumsum(n_s) - n_s, n_s)
        pos = np.arange(total) - first
        np_rep = n_pre[call]
        nb_rep = n_blk[call]
        is_pre = pos < np_rep
        pre_each = np.where(np_rep > 0, pre[call] // np.maximum(np_rep, 1), 0)
        blk_each = np.where(nb_rep > 0, blk[call] // np.maximum(nb_rep, 1), 0)
        length = np.where(is_pre, pre_each, blk_each)
        # Remainders go to the first interval of each kind so sums are exact.
        length = length + np.where(pos == 0, pre[call] - pre_each * np_rep, 0)
        length = length + np.where(pos == np_rep, blk[call] - blk_each * nb_rep, 0)
        on_cpu = dur[call] - pre[call] - blk[call]
        step = on_cpu // (n[call] + 1)
        csum = np.cumsum(length)
        before = csum - length - np.repeat(csum[np.cumsum(n_s) - n_s] - length[np.cumsum(n_s) - n_s], n_s)
        off_ns = ts[call] + (pos + 1) * step + before
        return off_ns, length, is_pre

    def emit_intervals(self, pid: int, tid: int, off_ns: np.ndarray, length: np.ndarray, is_pre: np.ndarray,
                       preemptor: PreemptorFn, blocked_next: PreemptorFn, cpus: int) -> None:
        """Write sched_intervals rows of a traced thread and count its switches as stored."""
        order = np.argsort(off_ns, kind="stable")
        off_ns, length, is_pre = off_ns[order], length[order].astype(np.int64), is_pre[order]
        on_ns = off_ns + length
        keep = on_ns <= self.end_ns
        off_ns, length, is_pre, on_ns = off_ns[keep], length[keep], is_pre[keep], on_ns[keep]
        n = off_ns.size
        if n == 0:
            return
        who = np.where(is_pre, preemptor(off_ns, self.rng), blocked_next(off_ns, self.rng)).astype(np.int64)
        cpu = self.rng.integers(0, cpus, n).astype(np.int32)
        names, comm_idx = self.comm_of(who, cpu, cpus)
        batch = pa.table({
            "pid": pa.array(np.full(n, pid, np.int32)),
            "tid": pa.array(np.full(n, tid, np.int32)),
            "off_ns": pa.array(off_ns, pa.int64()),
            "on_ns": pa.array(on_ns, pa.int64()),
            "off_cpu_ns": pa.array(length, pa.int64()),
            "prev_state": dict_array(["sleeping", "preempted"], is_pre.astype(np.int32)),
            # Schema v2's split. The demo's sleeps end as the thread gets a CPU back (woken onto an
            # idle CPU: no wait), so the calls' per-call split equals the sum of their intervals'.
            "wakeup_ns": pa.array(on_ns, pa.int64(), mask=is_pre),
            "sleep_ns": pa.array(np.where(is_pre, 0, length), pa.int64()),
            "cpu_wait_ns": pa.array(np.where(is_pre, length, 0), pa.int64()),
            "on_cpu": pa.array(cpu),
            "preemptor_pid": pa.array(who.astype(np.int32)),
            "preemptor_comm": dict_array(names, comm_idx),
            "cpu": pa.array(cpu),
        })
        self.w.append("sched_intervals", batch)
        self.counts["sched_rows"] += n
        self.count(pid, "sched_switch", off_ns, stored=True)

    def renewal_intervals(self, pid: int, tid: int, start_ns: int, end_ns: int, on_median_ns: float,
                          pre_median_ns: float, blk_median_ns: float, pre_frac: float,
                          preemptor: PreemptorFn, blocked_next: PreemptorFn, cpus: int) -> None:
        """A CPU-bound thread's life: run slices (exponential) separated by preemptions and short blocks."""
        period = on_median_ns + pre_frac * pre_median_ns + (1 - pre_frac) * blk_median_ns
        n = int((end_ns - start_ns) / period * 1.2) + 2
        on = self.rng.exponential(on_median_ns, n).astype(np.int64) + 20 * US
        is_pre = self.rng.random(n) < pre_frac
        length = np.where(is_pre, lognormal(self.rng, pre_median_ns, 0.6, n), lognormal(self.rng, blk_median_ns, 0.8, n)).astype(np.int64)
        off_ns = start_ns + np.cumsum(on) + (np.cumsum(length) - length)
        keep = off_ns + length <= end_ns
        self.emit_intervals(pid, tid, off_ns[keep], length[keep], is_pre[keep], preemptor, blocked_next, cpus)

    # -- finish ----------------------------------------------------------------------------
    def write_aggregates(self) -> None:
        """host_aggregates: one row per (pid, bucket, op) with a non-zero exact count."""
        cols: dict[str, list[np.ndarray]] = defaultdict(list)
        comms: list[str] = []
        for (pid, op), counts in sorted(self._agg.items()):
            nz = np.nonzero(counts)[0]
            if nz.size == 0:
                continue
            comm = self.procs[pid].comm
            if comm not in comms:
                comms.append(comm)
            cols["bucket_start_ns"].append(self.start_ns + nz.astype(np.int64) * BUCKET_NS)
            cols["pid"].append(np.full(nz.size, pid, np.int32))
            cols["comm"].append(np.full(nz.size, comms.index(comm), np.int32))
            cols["src"].append(np.full(nz.size, 0 if op == "sched_switch" else 1, np.int32))
            cols["count"].append(counts[nz])
            cols["stored"].append(self._agg_stored[(pid, op)][nz] if (pid, op) in self._agg_stored else np.zeros(nz.size, np.int64))
            byt = self._agg_bytes[(pid, op)][nz] if (pid, op) in self._agg_bytes else np.full(nz.size, -1, np.int64)
            cols["sum_bytes"].append(byt)
        if not cols:
            return
        c = {k: np.concatenate(v) for k, v in cols.items()}
        n = c["pid"].size
        self.w.append("host_aggregates", pa.table({
            "bucket_start_ns": pa.array(c["bucket_start_ns"], pa.int64()),
            "bucket_ns": pa.array(np.full(n, BUCKET_NS, np.int64)),
            "pid": pa.array(c["pid"]),
            "comm": dict_array(comms, c["comm"]),
            "source": dict_array(["sched", "mm"], c["src"]),
            "op": dict_array(["sched_switch", "mm_page_alloc"], c["src"]),
            "count": pa.array(c["count"], pa.int64()),
            "stored": pa.array(c["stored"], pa.int64()),
            "sum_bytes": pa.array(c["sum_bytes"], mask=c["sum_bytes"] < 0),
        }))
        self.counts["sched_seen"] = int(sum(v.sum() for (p, o), v in self._agg.items() if o == "sched_switch"))
        self.counts["mm_seen"] = int(sum(v.sum() for (p, o), v in self._agg.items() if o == "mm_page_alloc"))

    def write_snapshots(self, cpu_percent: np.ndarray, cpu_count: int, mem_total: int, mem_used_frac: np.ndarray,
                        gpu_util: np.ndarray | None, gpu_mem_used: np.ndarray | None, gpu_mem_total: int | None) -> None:
        """One snapshot a second: the arrays are per second of the trace."""
        n = self.n_buckets
        ts = self.start_ns + np.arange(n, dtype=np.int64) * SEC + 500 * MS
        cpu = np.clip(cpu_percent, 0, 100)
        running = np.maximum(0, np.round(cpu / 100 * cpu_count + self.rng.normal(0, 0.3, n))).astype(np.int32)
        load = np.convolve(running.astype(float), np.ones(5) / 5, mode="same")
        mem_used = np.clip(mem_used_frac, 0.01, 0.99)
        cols: dict[str, Any] = {
            "ts_ns": pa.array(ts),
            "cpu_percent": pa.array(np.round(cpu, 1)),
            "cpu_count": pa.array(np.full(n, cpu_count, np.int32)),
            "procs_running": pa.array(running),
            "load1": pa.array(np.round(load, 2)),
            "mem_total_bytes": pa.array(np.full(n, mem_total, np.int64)),
            "mem_available_bytes": pa.array(((1 - mem_used) * mem_total).astype(np.int64)),
            "mem_used_percent": pa.array(np.round(mem_used * 100, 1)),
            "swap_used_bytes": pa.array(np.zeros(n, np.int64)),
        }
        if gpu_util is not None:
            cols["gpu_util_percent"] = pa.array(np.round(np.clip(gpu_util, 0, 100), 1))
            cols["gpu_mem_used_bytes"] = pa.array(np.asarray(gpu_mem_used, np.int64))
            cols["gpu_mem_total_bytes"] = pa.array(np.full(n, gpu_mem_total, np.int64))
        self.w.append("snapshots", pa.table(cols))
        self.counts["snapshots"] = n

    def write_session(self, name: str, seed: int, scale: float, cpu_count: int, mem_total: int,
                      gpu_model: str | None, notes: str) -> None:
        """sessions, processes, process_events, collector_stats and table_coverage rows."""
        from ingero_mcp import __version__

        self.write_aggregates()
        ev = sorted(self.process_events, key=lambda e: e["ts_ns"])
        if ev:
            keys = ("ts_ns", "event", "pid", "tid", "child_pid", "comm", "filename", "exit_code")
            self.w.append("process_events", {k: [e.get(k) for e in ev] for k in keys})
        procs = sorted(self.procs.values(), key=lambda p: p.pid)
        self.w.replace("processes", {
            "pid": [p.pid for p in procs], "ppid": [p.ppid for p in procs], "comm": [p.comm for p in procs],
            "cmdline": [p.cmdline for p in procs], "first_seen_ns": [p.first_seen_ns for p in procs],
            "last_seen_ns": [p.last_seen_ns for p in procs], "exit_ns": [p.exit_ns for p in procs],
            "exit_code": [p.exit_code for p in procs], "traced": [p.traced for p in procs],
        })
        c = self.counts
        stats = [
            ("cuda_uprobes", c["cuda"], c["cuda"], 0),
            ("sched_switch", c["sched_seen"], c["sched_rows"], c["sched_seen"]),
            ("mm_page_alloc", c["mm_seen"], 0, c["mm_seen"]),
            ("process_events", len(ev), len(ev), 0),
            ("snapshots", c["snapshots"], c["snapshots"], 0),
        ]
        self.w.replace("collector_stats", {
            "source": [s[0] for s in stats], "events_seen": [s[1] for s in stats],
            "events_stored": [s[2] for s in stats], "events_lost": [0] * len(stats),
            "events_aggregated": [s[3] for s in stats],
        })
        coverage = [
            ("cuda_calls", "every CUDA runtime call of traced processes"),
            ("sched_intervals", "every switch-out of traced threads (and their children)"),
            ("host_aggregates", "exact per-(pid, 1 s) counts of sched_switch and mm_page_alloc, all processes"),
            ("process_events", "every fork/exec/exit"),
            ("snapshots", "one per second"),
            ("processes", "every process seen"),
        ]
        self.w.replace("table_coverage", {
            "table_name": [t for t, _ in coverage], "complete": [True] * len(coverage),
            "note": [f"synthetic: {n}" for _, n in coverage],
        })
        self.w.replace("sessions", {
            "source": [f"demo:{name}"], "host": ["demo-host"], "kernel": ["6.8.0-demo"],
            "os_release": ["Ubuntu 24.04 (synthetic)"], "cpu_model": ["Synthetic x86_64"],
            "cpu_count": [cpu_count], "memory_bytes": [mem_total],
            "gpu_model": [gpu_model], "gpu_driver": ["550.54.15" if gpu_model else None],
            "cuda_runtime_version": ["12.4" if gpu_model else None],
            "python_version": [platform.python_version()], "collector_version": [__version__],
            "collector_flags": [json.dumps({"demo": name, "seed": seed, "scale": scale})],
            "attached": [json.dumps({"attached": ["libcudart.so.12 (synthetic)"], "not_attached": []})],
            "started_ns": [self.start_ns], "stopped_ns": [self.end_ns], "notes": [notes],
        })


def pick(pids: list[int]) -> PreemptorFn:
    """A preemptor chooser: uniformly one of `pids` for each interval."""
    arr = np.array(pids, np.int64)

    def choose(ts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return arr[rng.integers(0, arr.size, ts.size)]

    return choose
