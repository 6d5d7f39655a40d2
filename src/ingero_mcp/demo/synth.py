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
# A waker chooser: for each wakeup time, the waking task (pid, tid) and the context it ran in (WAKE_CONTEXTS index).
WakerFn = Callable[[np.ndarray, np.random.Generator], tuple[np.ndarray, np.ndarray, np.ndarray]]
WAKE_CONTEXTS = ["task", "irq", "softirq"]
STATES = ["preempted", "sleeping", "uninterruptible"]


def task_waker(choose: PreemptorFn, tids: Callable[[np.ndarray], np.ndarray] | None = None) -> WakerFn:
    """Woken by a task (a queue, a pipe, a futex): the waker is that task, in task context."""

    def wake(ts: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pids = choose(ts, rng).astype(np.int64)
        return pids, pids if tids is None else tids(pids), np.zeros(ts.size, np.int32)

    return wake


def irq_waker(interrupted: PreemptorFn, context: str = "irq") -> WakerFn:
    """Woken from an interrupt (the GPU's completion interrupt, a NIC's softirq): the waker recorded is the
    task the interrupt landed on (pid 0, swapper/N, when that CPU was idle)."""
    idx = WAKE_CONTEXTS.index(context)

    def wake(ts: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pids = interrupted(ts, rng).astype(np.int64)
        return pids, pids, np.full(ts.size, idx, np.int32)

    return wake


@dataclass(frozen=True)
class Wakers:
    """How a traced thread's sleeps end: inside CUDA calls (the GPU's interrupt, in the driver's ioctl) and
    outside them (between calls: what the thread waited for, in which system call, S or D state)."""

    call: WakerFn | None = None
    call_syscall: str = "ioctl"
    call_state: str = "sleeping"  # 'uninterruptible' for a driver reading files (D state)
    gap: WakerFn | None = None
    gap_syscall: str | None = "futex"
    gap_state: str = "sleeping"


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
    pinned: bool | None = None  # copies: host memory pinned (TRUE), pageable (FALSE), unknown (None)


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
    pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    wake: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gap_wait: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        n = self.spec_idx.size
        if self.pos.size != n:
            self.pos = np.zeros(n, np.int32)
        if self.wake.size != n:
            self.wake = np.zeros(n, np.int64)
        if self.gap_wait.size != n:
            self.gap_wait = np.zeros(n, np.int64)

    @property
    def gap(self) -> np.ndarray:
        """Time between the previous call's return and this call's entry."""
        return self.gap_cpu + self.gap_block + self.gap_wait + self.gap_pre

    def layout(self, start_ns: int) -> None:
        """Place the calls one after another from `start_ns`: each call starts after its gap."""
        gap = self.gap
        self.ts = start_ns + np.cumsum(gap) + (np.cumsum(self.dur) - self.dur)

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the calls in `mask` (every array filtered alike)."""
        for name in ("spec_idx", "dur", "gap_cpu", "gap_block", "gap_pre", "pre", "blk", "n_pre", "n_blk", "pages",
                     "pos", "wake", "gap_wait", "ts"):
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

    def wake_waits(self, in_call: np.ndarray, in_gap: np.ndarray) -> None:
        """After each sleep, the wait for a CPU before the thread runs again (0 on an idle host): `in_call` per call
        that slept inside (added to its CPU wait and its duration), `in_gap` per sleep before a call (lengthens the
        gap). Call before `layout`."""
        slept = self.blk > 0
        w = np.where(slept, in_call, 0).astype(np.int64)
        self.wake += w
        self.pre += w
        self.dur += w
        self.gap_wait = np.where(self.gap_block > 0, in_gap, 0).astype(np.int64)


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
    calls = Calls(idx, dur, gap_cpu, gap_block, z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), z.copy(),
                  pos=pos.astype(np.int32))
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


class Tally:
    """Per-second values of one task (a column per CPU where `cpus`), kept over the seconds it touched only: a
    DataLoader worker living 10 s of a 100M-event trace holds 10 rows, not 7,800 (dense arrays for every task made
    the generator's memory grow with the square of the trace's length)."""

    __slots__ = ("n", "lo", "a")

    def __init__(self, n: int, cpus: int = 0) -> None:
        self.n = n
        self.lo = 0
        self.a = np.zeros((0, cpus) if cpus else 0, np.int64)

    def __iadd__(self, full: np.ndarray) -> Tally:
        """Add a value per second (an array over every second of the trace)."""
        nz = np.flatnonzero(full)
        if nz.size:
            self._add(int(nz[0]), np.asarray(full[nz[0]:nz[-1] + 1], np.int64))
        return self

    def add_at(self, k: np.ndarray, v: np.ndarray | int, cpu: np.ndarray | None = None) -> None:
        """np.add.at over seconds `k` (and CPUs `cpu`)."""
        if k.size == 0:
            return
        lo = int(k.min())
        piece = np.zeros((int(k.max()) + 1 - lo, *self.a.shape[1:]), np.int64)
        np.add.at(piece, (k - lo,) if cpu is None else (k - lo, cpu), v)
        self._add(lo, piece)

    def _add(self, lo: int, piece: np.ndarray) -> None:
        hi = lo + piece.shape[0]
        if self.a.shape[0] == 0:
            self.lo, self.a = lo, piece.copy()
            return
        new_lo, new_hi = min(self.lo, lo), max(self.lo + self.a.shape[0], hi)
        if (new_lo, new_hi) != (self.lo, self.lo + self.a.shape[0]):
            grown = np.zeros((new_hi - new_lo, *self.a.shape[1:]), np.int64)
            grown[self.lo - new_lo:self.lo - new_lo + self.a.shape[0]] = self.a
            self.lo, self.a = new_lo, grown
        self.a[lo - self.lo:hi - self.lo] += piece

    def dense(self) -> np.ndarray:
        """The values over every second of the trace."""
        out = np.zeros((self.n, *self.a.shape[1:]), np.int64)
        out[self.lo:self.lo + self.a.shape[0]] = self.a
        return out


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
        self._agg: dict[tuple[int, str], Tally] = defaultdict(lambda: Tally(self.n_buckets))
        self._agg_stored: dict[tuple[int, str], Tally] = defaultdict(lambda: Tally(self.n_buckets))
        self._agg_bytes: dict[tuple[int, str], Tally] = defaultdict(lambda: Tally(self.n_buckets))
        self.process_events: list[dict[str, Any]] = []
        self.counts: dict[str, int] = defaultdict(int)
        self.cpus = 1  # the host's CPU count: each scenario sets it first
        self._off: dict[tuple[int, int], Tally] = {}  # traced thread -> off-CPU ns per bucket
        self._sw: dict[tuple[int, int], Tally] = {}  # traced thread -> switch-outs per (bucket, cpu)
        self._life: dict[tuple[int, int], tuple[int, int]] = {}  # traced thread -> first, last seen
        # untraced task -> on-CPU ns, switches per (bucket, cpu)
        self._bg: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.threads: dict[tuple[int, int], tuple[str, int | None]] = {}  # named threads of traced processes

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
        self.process_events.append(dict(ts_ns=fork_ns, event="fork", pid=parent, tid=parent,
                                        child_pid=p.pid, comm=parent_comm))
        if exec_file is not None:
            self.process_events.append(dict(ts_ns=exec_ns or fork_ns + 300 * US, event="exec", pid=p.pid, tid=p.pid,
                                            comm=p.comm, filename=exec_file))
        if p.exit_ns is not None:
            self.process_events.append(dict(ts_ns=p.exit_ns, event="exit", pid=p.pid, tid=p.pid, comm=p.comm,
                                            exit_code=p.exit_code or 0))
        return p

    def comm_of(self, pids: np.ndarray, cpu: np.ndarray, cpus: int, tids: bool = False) -> tuple[list[str], np.ndarray]:
        """Dictionary + indices of the comms of `pids` (pid 0 is the idle task `swapper/<cpu>`); with `tids`, the
        ids are threads and named by their thread names where known."""
        comm = {pid: p.comm for pid, p in self.procs.items()}
        comm.update({t: c for (_p, t), (c, _f) in self.threads.items()})
        keys = np.array(sorted(comm), np.int64)
        names = sorted(set(comm.values()))
        name_idx = {n: i for i, n in enumerate(names)}
        by_key = np.array([name_idx[comm[int(k)]] for k in keys], np.int32)
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
            self._agg_bytes[(pid, op)] += np.bincount(b, weights=nbytes.astype(np.float64),
                                                      minlength=self.n_buckets).astype(np.int64)

    def background(self, pid: int, op: str, rate_per_s: np.ndarray | float, pages_per_event: float = 1.0) -> None:
        """Counted-only activity of a process: Poisson counts per bucket at `rate_per_s` (array per bucket or
        scalar)."""
        rate = np.broadcast_to(np.asarray(rate_per_s, np.float64), (self.n_buckets,))
        counts = self.rng.poisson(rate).astype(np.int64)
        p = self.procs[pid]
        alive = self._alive_mask(p)
        counts = counts * alive
        if op == "sched_switch":  # a short-slice task: ~50 us on a CPU per switch
            self.run_on_cpus(pid, pid, rate * 50 * US / SEC, rate, self.cpus)
            return
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
                   preemptor: PreemptorFn, blocked_next: PreemptorFn, cpus: int, wakers: Wakers | None = None) -> None:
        """Write a thread's CUDA calls and the scheduler intervals their attribution is made of."""
        calls.keep(calls.ts + calls.dur <= self.end_ns)
        n = calls.ts.size
        if n == 0:
            return
        wakers = wakers or Wakers()
        ops = [s.op for s in template]
        op_names = sorted(set(ops))
        op_idx = np.array([op_names.index(o) for o in ops], np.int32)[calls.spec_idx]
        byt = np.array([-1 if s.bytes is None else s.bytes for s in template], np.int64)[calls.spec_idx]
        kinds = sorted({s.kind for s in template if s.kind})
        kind_idx = np.array([kinds.index(s.kind) if s.kind else -1 for s in template], np.int32)[calls.spec_idx]
        stream = np.array([s.stream for s in template], np.uint64)[calls.spec_idx]
        # Kernel identity: each launch position of the loop iteration launches its own kernel (a model's layers).
        is_launch = np.array(["aunch" in s.op for s in template])[calls.spec_idx]
        handle = (0x7F00_0000_0000 + (pid << 24) + calls.pos.astype(np.int64) * 0x140).astype(np.uint64)
        # Host side of copies: a few buffers per copy site, pinned or pageable as the template says.
        is_copy = np.array([s.kind in ("H2D", "D2H") for s in template])[calls.spec_idx]
        pinned = np.array([-1 if s.pinned is None else int(s.pinned) for s in template], np.int8)[calls.spec_idx]
        base = np.where(pinned == 1, 0x7F3A_0000_0000, 0x5560_0000_0000).astype(np.uint64)
        host_ptr = (base + (pid << 28) + calls.pos.astype(np.uint64) * (1 << 22)
                    + (np.arange(n) % 4).astype(np.uint64) * (1 << 30))
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
            "kernel_handle": pa.array(handle, pa.uint64(), mask=~is_launch),
            "host_ptr": pa.array(host_ptr, pa.uint64(), mask=~is_copy),
            "host_pinned": pa.array(pinned == 1, pa.bool_(), mask=~is_copy | (pinned < 0)),
        })
        self.w.append("cuda_calls", batch)
        self.counts["cuda"] += n
        has_pages = pages > 0
        if has_pages.any():
            self.count(pid, "mm_page_alloc", calls.ts[has_pages], weights=pages[has_pages],
                       nbytes=pages[has_pages] * PAGE_BYTES)
        # Scheduler intervals inside the calls: preempted ones first, then sleeping ones (the first of which
        # also waits for a CPU after its wakeup), spread over the call's on-CPU time so that they sum exactly
        # to the call's attribution.
        c_off, c_sleep, c_wait = self._split_intervals(calls.ts, calls.dur, calls.pre, calls.blk, calls.wake,
                                                       calls.n_pre, calls.n_blk)
        # Intervals inside the gaps before the calls: a preemption, then a sleep (and the wait for a CPU after it).
        gap_start = calls.ts - calls.gap
        third = calls.gap_cpu // 3
        pre_mask = calls.gap_pre > 0
        blk_mask = calls.gap_block > 0
        g_off = np.concatenate([(gap_start + third)[pre_mask], (gap_start + 2 * third + calls.gap_pre)[blk_mask]])
        g_sleep = np.concatenate([np.zeros(int(pre_mask.sum()), np.int64), calls.gap_block[blk_mask]])
        g_wait = np.concatenate([calls.gap_pre[pre_mask], calls.gap_wait[blk_mask]])
        state = np.concatenate([np.where(c_sleep > 0, STATES.index(wakers.call_state), 0),
                                np.zeros(int(pre_mask.sum()), np.int32),
                                np.full(int(blk_mask.sum()), STATES.index(wakers.gap_state))]).astype(np.int32)
        where = np.concatenate([np.ones(c_off.size, bool), np.zeros(g_off.size, bool)])  # inside a call?
        off_ns = np.concatenate([c_off, g_off])
        sleep = np.concatenate([c_sleep, g_sleep])
        wait = np.concatenate([c_wait, g_wait])
        keep = off_ns >= self.start_ns
        self.emit_intervals(pid, tid, off_ns[keep], sleep[keep], wait[keep], state[keep], preemptor, blocked_next, cpus,
                            wakers=wakers, in_call=where[keep])

    @staticmethod
    def _split_intervals(ts: np.ndarray, dur: np.ndarray, pre: np.ndarray, blk: np.ndarray, wake: np.ndarray,
                         n_pre: np.ndarray, n_blk: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per call, n_pre preempted intervals (sharing pre - wake) then n_blk sleeping ones (sharing blk; the first
        one also waits `wake` for a CPU after its wakeup). Returns off_ns, sleep_ns, cpu_wait_ns per interval."""
        n = (n_pre + n_blk).astype(np.int64)
        sel = np.nonzero(n > 0)[0]
        if sel.size == 0:
            e = np.zeros(0, np.int64)
            return e, e, e
        n_s = n[sel]
        total = int(n_s.sum())
        call = np.repeat(sel, n_s)
        first = np.repeat(np.cumsum(n_s) - n_s, n_s)
        pos = np.arange(total) - first
        np_rep = n_pre[call]
        nb_rep = n_blk[call]
        is_pre = pos < np_rep
        pure = pre[call] - wake[call]
        pre_each = np.where(np_rep > 0, pure // np.maximum(np_rep, 1), 0)
        blk_each = np.where(nb_rep > 0, blk[call] // np.maximum(nb_rep, 1), 0)
        # Remainders go to the first interval of each kind so sums are exact.
        wait = np.where(is_pre, pre_each + np.where(pos == 0, pure - pre_each * np_rep, 0), 0)
        sleep = np.where(is_pre, 0, blk_each + np.where(pos == np_rep, blk[call] - blk_each * nb_rep, 0))
        wait = wait + np.where(~is_pre & (pos == np_rep), wake[call], 0)
        length = sleep + wait
        on_cpu = dur[call] - pre[call] - blk[call]
        step = on_cpu // (n[call] + 1)
        csum = np.cumsum(length)
        before = csum - length - np.repeat(csum[np.cumsum(n_s) - n_s] - length[np.cumsum(n_s) - n_s], n_s)
        off_ns = ts[call] + (pos + 1) * step + before
        return off_ns, sleep.astype(np.int64), wait.astype(np.int64)

    def emit_intervals(self, pid: int, tid: int, off_ns: np.ndarray, sleep: np.ndarray, wait: np.ndarray,
                       state: np.ndarray, preemptor: PreemptorFn, blocked_next: PreemptorFn, cpus: int,
                       wakers: Wakers | None = None, in_call: np.ndarray | None = None) -> None:
        """Write sched_intervals rows of a traced thread as the v2 collector records them: both halves of each
        off-CPU interval (sleep until the wakeup, then the wait for a CPU), the waker, the first holder (who took
        the CPU at switch-out) and the last (who left the CPU it came back on), the system call it slept in.
        Its switches and on-CPU time go to the per-(thread, CPU, second) aggregates."""
        wakers = wakers or Wakers()
        in_call = np.zeros(off_ns.size, bool) if in_call is None else in_call
        order = np.argsort(off_ns, kind="stable")
        off_ns, sleep, wait, state, in_call = off_ns[order], sleep[order], wait[order], state[order], in_call[order]
        length = (sleep + wait).astype(np.int64)
        on_ns = off_ns + length
        keep = (on_ns <= self.end_ns) & (length > 0)
        off_ns, sleep, wait, state, in_call, length, on_ns = (a[keep] for a in (off_ns, sleep, wait,
                                                                                state, in_call, length, on_ns))
        n = off_ns.size
        if n == 0:
            return
        rng = self.rng
        is_pre = state == 0
        wakeup = off_ns + sleep
        # First holder: the preemptor, or (a sleep) whatever ran next on that CPU; last holder: who ran on the CPU
        # the thread came back on until then (the hog when it waited, else the idle task).
        first = np.where(is_pre, preemptor(off_ns, rng), blocked_next(off_ns, rng)).astype(np.int64)
        last = np.where(wait > 0, preemptor(on_ns, rng), blocked_next(on_ns, rng)).astype(np.int64)
        cpu = rng.integers(0, cpus, n).astype(np.int32)
        on_cpu = np.where(wait > 0, rng.integers(0, cpus, n), cpu).astype(np.int32)
        idle_waker = irq_waker(pick([0]))
        wk_pid = np.zeros(n, np.int64)
        wk_tid = np.zeros(n, np.int64)
        wk_ctx = np.zeros(n, np.int32)
        syscall = np.full(n, -1, np.int32)
        sc_names = [wakers.call_syscall] + ([wakers.gap_syscall] if wakers.gap_syscall else [])
        for mask, fn, sc in ((~is_pre & in_call, wakers.call or idle_waker, 0),
                             (~is_pre & ~in_call, wakers.gap or idle_waker, 1 if wakers.gap_syscall else -1)):
            if mask.any():
                p, t, c = fn(wakeup[mask], rng)
                wk_pid[mask], wk_tid[mask], wk_ctx[mask] = p, t, c
                syscall[mask] = sc
        f_names, f_idx = self.comm_of(first, cpu, cpus)
        l_names, l_idx = self.comm_of(last, on_cpu, cpus)
        w_names, w_idx = self.comm_of(wk_tid, on_cpu, cpus, tids=True)
        batch = pa.table({
            "pid": pa.array(np.full(n, pid, np.int32)),
            "tid": pa.array(np.full(n, tid, np.int32)),
            "off_ns": pa.array(off_ns, pa.int64()),
            "on_ns": pa.array(on_ns, pa.int64()),
            "off_cpu_ns": pa.array(length, pa.int64()),
            "prev_state": dict_array(STATES, state),
            "wakeup_ns": pa.array(wakeup, pa.int64(), mask=is_pre),
            "sleep_ns": pa.array(sleep.astype(np.int64), pa.int64()),
            "cpu_wait_ns": pa.array(wait.astype(np.int64), pa.int64()),
            "preemptor_pid": pa.array(first.astype(np.int32)),
            "preemptor_tid": pa.array(first.astype(np.int32)),
            "preemptor_comm": dict_array(f_names, f_idx),
            "cpu": pa.array(cpu),
            "on_cpu": pa.array(on_cpu),
            "last_holder_pid": pa.array(last.astype(np.int32)),
            "last_holder_tid": pa.array(last.astype(np.int32)),
            "last_holder_comm": dict_array(l_names, l_idx),
            "waker_pid": pa.array(wk_pid.astype(np.int32), mask=is_pre),
            "waker_tid": pa.array(wk_tid.astype(np.int32), mask=is_pre),
            "waker_comm": pa.DictionaryArray.from_arrays(pa.array(w_idx, mask=is_pre), pa.array(w_names, pa.string())),
            "waker_context": pa.DictionaryArray.from_arrays(pa.array(wk_ctx, mask=is_pre),
                                                            pa.array(WAKE_CONTEXTS, pa.string())),
            "syscall": pa.DictionaryArray.from_arrays(pa.array(np.maximum(syscall, 0), mask=syscall < 0),
                                                       pa.array(sc_names, pa.string())),
        })
        self.w.append("sched_intervals", batch)
        self.counts["sched_rows"] += n
        self.count(pid, "sched_switch", off_ns, stored=True)
        self._off_cpu(pid, tid, off_ns, on_ns, cpu, cpus)

    def renewal_intervals(self, pid: int, tid: int, start_ns: int, end_ns: int, on_median_ns: float,
                          pre_median_ns: float, blk_median_ns: float, pre_frac: float,
                          preemptor: PreemptorFn, blocked_next: PreemptorFn, cpus: int,
                          wakers: Wakers | None = None, wake_wait_ns: float = 0.0) -> None:
        """A CPU-bound thread's life: run slices (exponential) separated by preemptions and short sleeps (each
        followed, on a busy host, by a wait for a CPU of median `wake_wait_ns`)."""
        period = on_median_ns + pre_frac * pre_median_ns + (1 - pre_frac) * (blk_median_ns + wake_wait_ns)
        n = int((end_ns - start_ns) / period * 1.2) + 2
        on = self.rng.exponential(on_median_ns, n).astype(np.int64) + 20 * US
        is_pre = self.rng.random(n) < pre_frac
        sleep = np.where(is_pre, 0, lognormal(self.rng, blk_median_ns, 0.8, n)).astype(np.int64)
        after = lognormal(self.rng, max(wake_wait_ns, 1.0), 0.6, n) if wake_wait_ns else np.zeros(n)
        wait = np.where(is_pre, lognormal(self.rng, pre_median_ns, 0.6, n), after).astype(np.int64)
        length = sleep + wait
        off_ns = start_ns + np.cumsum(on) + (np.cumsum(length) - length)
        keep = off_ns + length <= end_ns
        self._life[(pid, tid)] = (start_ns, end_ns)
        self.emit_intervals(pid, tid, off_ns[keep], sleep[keep], wait[keep],
                            np.where(is_pre, 0, 1)[keep].astype(np.int32), preemptor, blocked_next, cpus, wakers=wakers)

    # -- per-CPU time: who ran where, every second ---------------------------------------------
    def _split_buckets(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Spans [a, b) (each shorter than a bucket) as (bucket, ns) pieces, split at bucket edges."""
        ka = (a - self.start_ns) // BUCKET_NS
        edge = self.start_ns + (ka + 1) * BUCKET_NS
        first = np.minimum(b, edge) - a
        second = np.maximum(b - edge, 0)
        ks = np.concatenate([ka, ka + 1])
        ns = np.concatenate([first, second])
        ok = (ns > 0) & (ks >= 0) & (ks < self.n_buckets)
        return ks[ok], ns[ok]

    def _off_cpu(self, pid: int, tid: int, off_ns: np.ndarray, on_ns: np.ndarray, cpu: np.ndarray, cpus: int) -> None:
        key = (pid, tid)
        if key not in self._off:
            self._off[key] = Tally(self.n_buckets)
            self._sw[key] = Tally(self.n_buckets, cpus)
        k, ns = self._split_buckets(off_ns, on_ns)
        self._off[key].add_at(k, ns)
        self._sw[key].add_at(self._bucket(off_ns), 1, cpu)
        lo, hi = self._life.get(key, (int(off_ns.min()), int(on_ns.max())))
        self._life[key] = (min(lo, int(off_ns.min())), max(hi, int(on_ns.max())))

    def run_on_cpus(self, pid: int, tid: int, cpu_share: np.ndarray | float, switches_per_s: np.ndarray | float,
                    cpus: int) -> None:
        """An untraced task's on-CPU time per second (`cpu_share` of one CPU), spread over the CPUs, with its
        switch counts: what the kernel's per-(task, CPU, second) aggregate records for it."""
        share = (np.broadcast_to(np.asarray(cpu_share, np.float64), (self.n_buckets,))
                 * self._alive_mask(self.procs[pid]))
        rate = (np.broadcast_to(np.asarray(switches_per_s, np.float64), (self.n_buckets,))
                * self._alive_mask(self.procs[pid]))
        weights = self.rng.dirichlet(np.full(cpus, 8.0), self.n_buckets)
        self._bg[(pid, tid)] = ((share[:, None] * weights * BUCKET_NS).astype(np.int64),
                                self.rng.poisson(rate[:, None] * weights).astype(np.int64))

    def thread(self, pid: int, tid: int, comm: str, first_seen_ns: int | None = None) -> None:
        """A named thread of a traced process (threads table, and a 'thread' process event when born in the trace)."""
        self.threads[(pid, tid)] = (comm, first_seen_ns)
        if first_seen_ns is not None and first_seen_ns > self.start_ns:
            self.process_events.append(dict(ts_ns=first_seen_ns, event="thread", pid=pid, tid=tid, comm=comm))

    # -- finish ----------------------------------------------------------------------------
    def _sched_rows(self, cpus: int) -> dict[str, np.ndarray]:
        """sched_switch aggregates per (pid, tid, CPU, second): switch counts and on-CPU ns of every task, the idle
        task (pid 0) taking what is left of each CPU-second."""
        starts = self.start_ns + np.arange(self.n_buckets, dtype=np.int64) * BUCKET_NS

        def task(key: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, bool]:
            """A task's on-CPU ns and switches per (second, CPU), made when asked: held for every task at once, they
            grew with the number of tasks times the seconds."""
            if key in self._bg:  # an untraced task's (a key in both was the untraced one's)
                on_bg, sw_bg = self._bg[key]
                return on_bg.astype(np.float64), sw_bg, False
            lo, hi = self._life[key]
            p = self.procs.get(key[0])
            if p is not None:
                lo = min(lo, p.first_seen_ns or lo)
                hi = max(hi, p.exit_ns if p.exit_ns is not None else self.end_ns) if p.pid == key[1] else hi
            alive = np.clip(np.minimum(starts + BUCKET_NS, hi) - np.maximum(starts, lo), 0, None)
            on = np.maximum(alive - self._off[key].dense(), 0)
            return on[:, None] * np.full((1, cpus), 1.0 / cpus), self._sw[key].dense(), True

        keys = list(self._off) + [key for key in self._bg if key not in self._off]
        traced = np.zeros((self.n_buckets, cpus))
        other = np.zeros((self.n_buckets, cpus))
        for key in keys:  # summed in the order the dense arrays were (float sums: the same bits)
            on, _sw, is_traced = task(key)
            if is_traced:
                traced = traced + on
            else:
                other = other + on
        room = np.clip(BUCKET_NS - traced, 0, None)
        squeeze = np.where(other > room, room / np.maximum(other, 1), 1.0)
        cols: dict[str, list[np.ndarray]] = defaultdict(list)
        used = np.zeros((self.n_buckets, cpus))
        for pid, tid in sorted(keys):
            on, sw, is_traced = task((pid, tid))
            on = on if is_traced else on * squeeze
            on = on.astype(np.int64)
            used += on
            k, c = np.nonzero((on > 0) | (sw > 0))
            for name, v in (("k", k), ("cpu", c), ("pid", np.full(k.size, pid)), ("tid", np.full(k.size, tid)),
                            ("on", on[k, c]), ("n", np.maximum(sw[k, c], 1)),
                            ("stored", sw[k, c] if is_traced else 0 * k)):
                cols[name].append(np.asarray(v, np.int64))
        idle = np.clip(BUCKET_NS - used, 0, None).astype(np.int64)
        live = (starts[:, None] + np.zeros((1, cpus), np.int64)) < self.end_ns
        k, c = np.nonzero((idle > 0) & live)
        for name, v in (("k", k), ("cpu", c), ("pid", 0 * k), ("tid", 0 * k), ("on", idle[k, c]),
                        ("n", np.maximum(idle[k, c] // (2 * MS), 1)), ("stored", 0 * k)):
            cols[name].append(np.asarray(v, np.int64))
        return {name: np.concatenate(v) for name, v in cols.items()}

    def write_aggregates(self, cpus: int = 1) -> None:
        """host_aggregates: sched_switch per (pid, tid, CPU, second) with on-CPU ns; other ops per (pid, second)."""
        cols: dict[str, list[np.ndarray]] = defaultdict(list)
        comms: list[str] = []
        for (pid, op), tally in sorted(self._agg.items()):
            if op == "sched_switch":
                continue
            counts = tally.dense()
            nz = np.nonzero(counts)[0]
            if nz.size == 0:
                continue
            comm = self.procs[pid].comm
            if comm not in comms:
                comms.append(comm)
            cols["bucket_start_ns"].append(self.start_ns + nz.astype(np.int64) * BUCKET_NS)
            cols["pid"].append(np.full(nz.size, pid, np.int32))
            cols["tid"].append(np.full(nz.size, -1, np.int32))
            cols["cpu"].append(np.full(nz.size, -1, np.int32))
            cols["comm"].append(np.full(nz.size, comms.index(comm), np.int32))
            cols["src"].append(np.full(nz.size, 1, np.int32))
            cols["count"].append(counts[nz])
            cols["stored"].append(np.zeros(nz.size, np.int64))
            cols["dur"].append(np.full(nz.size, -1, np.int64))
            byt = (self._agg_bytes[(pid, op)].dense()[nz] if (pid, op) in self._agg_bytes
                   else np.full(nz.size, -1, np.int64))
            cols["sum_bytes"].append(byt)
        sched = self._sched_rows(cpus)
        names = {(p, p): self.procs[p].comm for p in self.procs}
        names.update(self.threads and {k: c for k, (c, _f) in self.threads.items()})

        def name(pid: int, tid: int, cpu: int) -> str:
            return f"swapper/{cpu}" if pid == 0 else names.get((pid, tid), self.procs[pid].comm)

        row_names = [name(int(p), int(t), int(c))
                     for p, t, c in zip(sched["pid"], sched["tid"], sched["cpu"], strict=True)]
        comms_all = comms + sorted(set(row_names) - set(comms))
        index = {n: i for i, n in enumerate(comms_all)}
        tid_name = np.array([index[n] for n in row_names], np.int32)
        m = sched["k"].size
        cols["bucket_start_ns"].append(self.start_ns + sched["k"] * BUCKET_NS)
        cols["pid"].append(sched["pid"].astype(np.int32))
        cols["tid"].append(sched["tid"].astype(np.int32))
        cols["cpu"].append(sched["cpu"].astype(np.int32))
        cols["comm"].append(tid_name)
        cols["src"].append(np.zeros(m, np.int32))
        cols["count"].append(sched["n"])
        cols["stored"].append(sched["stored"])
        cols["dur"].append(sched["on"])
        cols["sum_bytes"].append(np.full(m, -1, np.int64))
        c = {k: np.concatenate(v) for k, v in cols.items()}
        n = c["pid"].size
        self.w.append("host_aggregates", pa.table({
            "bucket_start_ns": pa.array(c["bucket_start_ns"], pa.int64()),
            "bucket_ns": pa.array(np.full(n, BUCKET_NS, np.int64)),
            "pid": pa.array(c["pid"]),
            "tid": pa.array(c["tid"], mask=c["tid"] < 0),
            "cpu": pa.array(c["cpu"], mask=c["cpu"] < 0),
            "comm": dict_array(comms_all, c["comm"]),
            "source": dict_array(["sched", "mm"], c["src"]),
            "op": dict_array(["sched_switch", "mm_page_alloc"], c["src"]),
            "count": pa.array(c["count"], pa.int64()),
            "stored": pa.array(c["stored"], pa.int64()),
            "sum_duration_ns": pa.array(c["dur"], mask=c["dur"] < 0),
            "sum_bytes": pa.array(c["sum_bytes"], mask=c["sum_bytes"] < 0),
        }))
        sw = c["src"] == 0
        self.counts["sched_seen"] = int(c["count"][sw].sum())
        self.counts["mm_seen"] = int(c["count"][~sw].sum())

    def write_gpu_processes(self, pid: int, used_bytes: int, sm_util: np.ndarray | float | None,
                            alive: np.ndarray | None = None) -> None:
        """NVML's per-process rows, one a second while the process holds GPU memory."""
        ts = self.start_ns + np.arange(self.n_buckets, dtype=np.int64) * SEC + 500 * MS
        keep = self._alive_mask(self.procs[pid]).astype(bool) if alive is None else alive
        util = (None if sm_util is None
                else np.round(np.clip(np.broadcast_to(np.asarray(sm_util, float), ts.shape), 0, 100), 1))
        n = int(keep.sum())
        self.w.append("gpu_processes", {
            "ts_ns": ts[keep].tolist(), "gpu_id": [0] * n, "pid": [pid] * n, "used_memory_bytes": [used_bytes] * n,
            "sm_util_percent": [None] * n if util is None else util[keep].tolist(),
        })

    def write_snapshots(self, cpu_percent: np.ndarray, cpu_count: int, mem_total: int, mem_used_frac: np.ndarray,
                        gpu_util: np.ndarray | None, gpu_mem_used: np.ndarray | None,
                        gpu_mem_total: int | None) -> None:
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

        self.write_aggregates(cpu_count)
        threads = {(p.pid, p.pid): (p.comm, p.first_seen_ns) for p in self.procs.values() if p.traced}
        threads.update(self.threads)
        keys = sorted(threads)
        self.w.replace("threads", {
            "pid": [k[0] for k in keys], "tid": [k[1] for k in keys], "comm": [threads[k][0] for k in keys],
            "first_seen_ns": [threads[k][1] or self.start_ns for k in keys],
            "last_seen_ns": [self.procs[k[0]].last_seen_ns for k in keys],
            "exit_ns": [self.procs[k[0]].exit_ns for k in keys],
        })
        ev = sorted(self.process_events, key=lambda e: e["ts_ns"])
        if ev:
            keys = ("ts_ns", "event", "pid", "tid", "child_pid", "comm", "filename", "exit_code", "old_comm")
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
            ("host_aggregates", "exact counts, all processes: sched_switch per (pid, tid, CPU, 1 s) with on-CPU ns "
                                "(pid 0: idle), mm_page_alloc per (pid, 1 s)"),
            ("threads", "every thread of traced processes, latest name"),
            ("gpu_processes", "NVML's GPU processes, one sample a second"),
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
