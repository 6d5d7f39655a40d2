"""Reading the kernel's side of a recording: the four ring buffers, the aggregate map, the thread states.

A drain thread reads the rings in bulk (mmap, no per-event Python) into pending batches, pacing itself on how
fast they fill; the main thread takes those batches to store them, harvests the finished per-second aggregate
buckets, and at the stop turns the calls still in flight and the threads still off-CPU into rows.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ingero_mcp.collector import records as R
from ingero_mcp.collector.kstacks import KernelStacks
from ingero_mcp.collector.ringbuf import RingReader
from ingero_mcp.collector.ustacks import UserStacks

if TYPE_CHECKING:
    from ingero_mcp.collector.governor import Governor

CUDA_RB_PAGES = 16384  # 64 MiB: ~760k call records, >2 s of headroom at 300k calls/s
SCHED_RB_PAGES = 4096  # 16 MiB
PROC_RB_PAGES = 256  # 1 MiB
SAMPLE_RB_PAGES = 256  # 1 MiB: ~21k on-CPU samples (49 Hz x 128 CPUs: 3 s)
# Keys (pid, tid, cpu, second) for sched_switch, (pid, second) for mm_page_alloc; up to ~3 seconds
# live before a harvest. A 16-CPU host with 4,000 threads running each second, each on ~2 CPUs:
# ~24k switch keys a second, ~72k live; drops are counted (collector_stats 'sched_switch' lost).
AGG_ENTRIES = 131072
BUCKET_NS = 1_000_000_000
DRAIN_NICE = -10  # the ring reader's nice value (its thread only)
# The reader sleeps so that, at the rate it last saw, the fullest ring is at most DRAIN_FILL full when it wakes
# (never less than MIN_POLL_S, never more than --poll-interval). Few wake-ups, because they may cost the job
# too: on the H200 the training loop's blocks ran +6.7 % with this reader and +19.5 % with a 20 ms one in the
# same call (bench/README.md; one call, not conclusive), and a process waking every 20 ms, no eBPF, slowed
# them by 18 % in one set and not at all in another.
DRAIN_FILL = 0.25
MIN_POLL_S = 0.01

AGG_SCHEMA = pa.schema([
    ("bucket_start_ns", pa.int64()), ("pid", pa.int32()), ("tid", pa.int32()), ("cpu", pa.int32()),
    ("comm", pa.string()), ("source", pa.string()),
    ("op", pa.string()), ("count", pa.int64()), ("sum_bytes", pa.int64()), ("sum_duration_ns", pa.int64()),
    ("bucket_ns", pa.int64()),
    ("stored", pa.int64()),
])
OPEN_INTERVAL_SCHEMA = pa.schema([
    ("pid", pa.int32()), ("tid", pa.int32()), ("off_ns", pa.int64()), ("off_cpu_ns", pa.int64()),
    ("prev_state", pa.string()), ("preemptor_pid", pa.int32()), ("preemptor_tid", pa.int32()),
    ("preemptor_comm", pa.string()), ("cpu", pa.int32()), ("wakeup_ns", pa.int64()), ("sleep_ns", pa.int64()),
    ("cpu_wait_ns", pa.int64()), ("waker_pid", pa.int32()), ("waker_tid", pa.int32()), ("waker_comm", pa.string()),
    ("waker_context", pa.string()), ("syscall", pa.string()), ("kstack_id", pa.int64()), ("ustack_id", pa.int64()),
])
RINGS = ("cuda", "sched", "proc", "sample")


class Drain:
    """The rings, what was read from them and not yet stored, and the kernel's per-second aggregates."""

    def __init__(self, calibration_pids: set[int]) -> None:
        self.calibration_pids = calibration_pids  # the probe calibration's processes (Probes): not the job's records
        self.rings: dict[str, RingReader] = {}
        self.agg: Any = None  # the kernel's (pid, second) buckets
        self.counters_map: Any = None
        self.governor: Governor | None = None  # counts the CUDA calls drained (Tracer.start makes it)
        self.pending: dict[str, list[np.ndarray]] = {name: [] for name in RINGS}
        self.aggregated = {1: 0, 2: 0}
        self.last_record_ktime = 0  # the latest end of a CUDA call or off-CPU interval drained (kernel clock)
        self.lock = threading.Lock()  # pending, and the sampler's rows (Sink.queue_samples)
        self.stop = threading.Event()
        self.filled = FillSinceRead()  # what the rings received between two of the reader's reads
        self.traced_pages = 0  # page allocations of traced processes harvested so far
        self.calibration_rows = dict.fromkeys(RINGS, 0)

    def open(self, bpf: Any) -> None:
        """Take the loaded program's aggregate map, counters and rings."""
        self.agg = bpf["agg"]
        self.counters_map = bpf["counters"]
        self.rings = {
            "cuda": RingReader(bpf["cuda_events"].map_fd, CUDA_RB_PAGES * 4096, R.CUDA_DTYPE),
            "sched": RingReader(bpf["sched_events"].map_fd, SCHED_RB_PAGES * 4096, R.SCHED_DTYPE),
            "proc": RingReader(bpf["proc_events"].map_fd, PROC_RB_PAGES * 4096, R.PROC_DTYPE),
            "sample": RingReader(bpf["sample_events"].map_fd, SAMPLE_RB_PAGES * 4096, R.SAMPLE_DTYPE),
        }

    def close(self) -> None:
        """Unmap the rings."""
        for ring in self.rings.values():
            ring.close()

    def read(self) -> float:
        """Read every ring; returns the largest share of a ring that this read emptied."""
        fill = 0.0
        with self.lock:
            for name, ring in self.rings.items():
                batch = ring.read()
                share = len(batch) * ring.record / ring.size
                fill = max(fill, share)
                self.filled.add(name, share)
                if len(batch) and self.calibration_pids:
                    mine = np.isin(batch["pid"], list(self.calibration_pids))
                    self.calibration_rows[name] += int(mine.sum())  # seen by the kernel, not the job's
                    batch = batch[~mine]
                if len(batch):
                    self.pending[name].append(batch)
                    end = batch["ts"] + batch["dur"] if name == "cuda" else batch["on_ts"] if name == "sched" else None
                    if end is not None:
                        self.last_record_ktime = max(self.last_record_ktime, int(end.max()))
                    if name == "cuda" and self.governor is not None:
                        self.governor.count(batch["ts"], batch["pid"], (batch["flags"] & R.F_NORET) != 0)
        return fill

    def loop(self, poll_interval_s: float) -> None:
        """The drain thread: read, sleep as long as the rings' rate allows (drain_wait), until `stop`."""
        # Its own thread, so that converting and writing a flush (which mostly releases the GIL)
        # never leaves the rings unread for long. On a host whose CPUs are all busy (the contention
        # we are there to record) a plain-priority reader waits behind the busy tasks until the ring
        # fills: this thread alone runs at nice DRAIN_NICE (a larger CFS share, not real-time; its
        # work per wakeup is bounded by what arrived in one poll interval).
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), DRAIN_NICE)
        except OSError:  # not root, or a container without CAP_SYS_NICE: drain at the default priority
            pass
        wait, last = MIN_POLL_S, time.monotonic()
        while not self.stop.wait(wait):
            self.read()
            with self.lock:
                fill = self.filled.take()  # the governor's reads meanwhile included: the rings' rate, not this read's
            now = time.monotonic()
            wait, last = drain_wait(fill, now - last, poll_interval_s), now

    def take_pending(self) -> dict[str, list[np.ndarray]]:
        """What was read since the last take, per ring."""
        with self.lock:
            taken = self.pending
            self.pending = {name: [] for name in RINGS}
        return taken

    def counters(self) -> np.ndarray:
        """The kernel's counters (records seen, lost...), summed over CPUs."""
        out = np.zeros(R.N_COUNTERS, np.int64)
        for i in range(R.N_COUNTERS):
            out[i] = sum(self.counters_map[self.counters_map.Key(i)])
        return out

    def harvest(self, offset_ns: int, is_traced: Callable[[int], bool], *,
                everything: bool = False) -> pa.Table | None:
        """Move finished (pid, second) buckets out of the kernel map: host_aggregates rows (None if none)."""
        cutoff = (time.monotonic_ns() // BUCKET_NS) - 1
        rows: dict[str, list[Any]] = {k: [] for k in ("bucket_start_ns", "pid", "tid", "cpu", "comm", "source", "op",
                                                      "count", "sum_bytes", "sum_duration_ns")}
        done = []
        for key, val in self.agg.items_lookup_batch():
            if not everything and key.sec >= cutoff:
                continue
            done.append(key)
            source, op = R.AGG_KINDS.get(key.kind, ("?", "?"))
            rows["bucket_start_ns"].append(key.sec * BUCKET_NS + offset_ns)
            rows["pid"].append(key.pid)
            per_thread = key.kind == 1  # sched_switch: per (pid, tid, cpu); mm_page_alloc: per pid
            rows["tid"].append(key.tid if per_thread else None)
            rows["cpu"].append(key.cpu if per_thread and key.cpu != R.AGG_NO_CPU else None)
            rows["comm"].append(bytes(val.comm).rstrip(b"\0").decode("utf-8", "replace"))
            rows["source"].append(source)
            rows["op"].append(op)
            rows["count"].append(val.count)
            rows["sum_bytes"].append(val.sum if key.kind == 2 else None)
            rows["sum_duration_ns"].append(val.sum if key.kind == 1 else None)  # on-CPU time of ended slices
            self.aggregated[key.kind] = self.aggregated.get(key.kind, 0) + val.count
            if key.kind == 2 and is_traced(key.pid):
                self.traced_pages += val.count  # the live view's page-allocation estimate (explain: host_aggregates)
        if not done:
            return None
        keys = (self.agg.Key * len(done))(*done)
        try:
            self.agg.items_delete_batch(keys)
        except Exception:  # noqa: BLE001 - kernels without batch ops
            for key in done:
                del self.agg[key]
        return pa.table({**rows, "bucket_ns": [BUCKET_NS] * len(done), "stored": [0] * len(done)}, schema=AGG_SCHEMA)


def unfinished_rows(tstate: Any, now: int, offset_ns: int, kstacks: KernelStacks,
                    ustacks: UserStacks) -> tuple[list[tuple[int, ...]], dict[str, list[Any]], int]:
    """Calls still in flight and threads still off-CPU at `now` (kernel clock), from the kernel's thread states:
    (CUDA call records without their first two fields, open sched_intervals columns, thread states read)."""
    calls: list[tuple[int, ...]] = []
    intervals: dict[str, list[Any]] = {f.name: [] for f in OPEN_INTERVAL_SCHEMA}
    states = 0
    for key, st in tstate.items():
        states += 1
        off_pre = off_blk = 0
        if st.off_ts:
            runnable = st.off_state in (R.S_PREEMPTED, R.S_NEW)
            woke = not runnable and st.waker_ctx and st.wake_ts >= st.off_ts
            if runnable:
                off_pre = now - st.off_ts
            elif woke:
                off_blk, off_pre = st.wake_ts - st.off_ts, now - st.wake_ts
            else:
                off_blk = now - st.off_ts  # not woken by the stop: asleep all along
            new = st.off_state == R.S_NEW
            seen_waker = woke or new
            row = {
                "pid": st.tgid, "tid": key.value, "off_ns": st.off_ts + offset_ns, "off_cpu_ns": now - st.off_ts,
                "prev_state": R.STATES[st.off_state] if st.off_state < len(R.STATES) else None,
                "preemptor_pid": None if new else st.preemptor_pid,
                "preemptor_tid": None if new else st.preemptor_tid,
                "preemptor_comm": None if new else _text(st.preemptor_comm),
                "cpu": st.cpu,
                "wakeup_ns": st.wake_ts + offset_ns if seen_waker else None,
                "sleep_ns": off_blk, "cpu_wait_ns": off_pre,
                "waker_pid": st.waker_pid if seen_waker else None,
                "waker_tid": st.waker_tid if seen_waker else None,
                "waker_comm": _text(st.waker_comm) if seen_waker else None,
                "waker_context": R.WAKER_CONTEXTS[st.waker_ctx] if seen_waker and st.waker_ctx < 4 else None,
                "syscall": R.syscall_names(np.array([st.syscall]))[0].as_py(),
                "kstack_id": None if new else kstacks.one(st.kstack),
                "ustack_id": None if new else ustacks.one(st.tgid, st.ustack, st.py),
            }
            for k, v in row.items():
                intervals[k].append(v)
        for d in range(min(st.depth, len(st.fr))):
            f = st.fr[d]
            hptr_ok = f.flags & R.F_HOSTPTR
            calls.append((f.ts, now - f.ts, f.bytes, f.stream, f.handle, f.hptr if hptr_ok else 0,
                          st.wait_ns - f.wait0 + off_pre, st.sleep_ns - f.sleep0 + off_blk,
                          st.pg_bytes - f.pgb0, st.tgid, key.value, st.switches - f.sw0, st.pages - f.pg0, 0,
                          f.op, f.kind, f.flags & (R.F_BYTES | R.F_STREAM | R.F_HANDLE | R.F_HOSTPTR)))
    return calls, intervals, states


def _text(comm: Any) -> str:
    """A kernel comm (a NUL-padded char array) as text."""
    return bytes(comm).rstrip(b"\0").decode("utf-8", "replace")


class FillSinceRead:
    """How full each ring got since the ring reader's last read, counting what other threads drained meanwhile (the
    governor reads the rings before each decision): the reader paces itself on the rings' rate, which its own reads
    alone would understate."""

    def __init__(self) -> None:
        self._share: dict[str, float] = {}

    def add(self, ring: str, share: float) -> None:
        """A read that emptied `share` of `ring` (records x record size / ring size)."""
        self._share[ring] = self._share.get(ring, 0.0) + share

    def take(self) -> float:
        """The fullest ring's share since the last take, then start over."""
        fill = max(self._share.values(), default=0.0)
        self._share = {}
        return fill


def drain_wait(fill: float, elapsed_s: float, max_s: float) -> float:
    """How long the ring reader may sleep after a read that emptied `fill` of the fullest ring (a share) filled
    over `elapsed_s`: until that ring would be DRAIN_FILL full at the same rate, within [MIN_POLL_S, max_s]."""
    per_s = fill / max(elapsed_s, 1e-3)
    if per_s <= 0:
        return max_s
    return min(max_s, max(MIN_POLL_S, DRAIN_FILL / per_s))
