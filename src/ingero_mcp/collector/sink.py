"""The store's side of a recording: what was drained, decoded and appended; the latest-state tables rewritten.

Every flush appends the pending ring batches (process events first, so that new pids are known), the kernel
stacks they name, the probe costs and the governor's rows, the harvested aggregates and the system snapshots,
then replaces the latest-state tables: sessions, collector_stats, table_coverage, threads and processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ingero_mcp.collector import records as R
from ingero_mcp.collector.calibrate import defaults
from ingero_mcp.collector.drain import OPEN_INTERVAL_SCHEMA, Drain, unfinished_rows
from ingero_mcp.collector.kstacks import KernelStacks
from ingero_mcp.collector.ops import OP_NAMES, OPS
from ingero_mcp.collector.targets import Targets
from ingero_mcp.collector.ustacks import UserStacks

if TYPE_CHECKING:
    from ingero_mcp.collector.cgroups import CgroupSampler
    from ingero_mcp.collector.governor import Governor
    from ingero_mcp.collector.probes import Probes
    from ingero_mcp.collector.sampler import SystemSampler
    from ingero_mcp.store import TraceWriter

HIST_BINS = 256  # log2 durations, 4 bins per octave (live view only; the store keeps every value)
OpRow = tuple[str, int, float | None, float | None, int | None, float | None, float | None]

CGROUP_SCHEMA = pa.schema([
    ("ts_ns", pa.int64()), ("pid", pa.int32()), ("cgroup", pa.string()), ("own", pa.bool_()), ("quota_us", pa.int64()),
    ("period_us", pa.int64()), ("usage_usec", pa.int64()), ("nr_periods", pa.int64()), ("nr_throttled", pa.int64()),
    ("throttled_usec", pa.int64()),
])
GPU_PROC_SCHEMA = pa.schema([
    ("ts_ns", pa.int64()), ("gpu_id", pa.int32()), ("pid", pa.int32()), ("used_memory_bytes", pa.int64()),
    ("sm_util_percent", pa.float64()),
])


class OpStats:
    """Per-op latency histograms and totals of the CUDA calls stored so far, for the live view."""

    def __init__(self) -> None:
        self.hist = np.zeros((len(OPS), HIST_BINS), np.int64)
        self.count = np.zeros(len(OPS), np.int64)
        self.max = np.zeros(len(OPS), np.int64)
        self.sums = np.zeros((3, len(OPS)), np.float64)  # duration, off-CPU, preempted (live view)

    def add(self, ev: np.ndarray) -> None:
        """Count these call records; their latencies where the call's end was seen."""
        self.count += np.bincount(ev["op"].astype(np.int64), minlength=len(OPS))
        ev = ev[(ev["flags"] & R.F_NORET) == 0]  # the live view's latencies: calls whose end was seen
        op = ev["op"].astype(np.int64)
        dur = ev["dur"].astype(np.int64)
        bins = np.clip((np.log2(np.maximum(dur, 1)) * 4).astype(np.int64), 0, HIST_BINS - 1)
        self.hist += np.bincount(op * HIST_BINS + bins, minlength=len(OPS) * HIST_BINS).reshape(len(OPS), HIST_BINS)
        np.maximum.at(self.max, op, dur)
        pre = ev["wait_ns"].astype(np.float64)
        for row, weights in enumerate((dur.astype(np.float64), pre + ev["sleep_ns"], pre)):
            self.sums[row] += np.bincount(op, weights=weights, minlength=len(OPS))

    def summary(self) -> list[OpRow]:
        """Per op seen so far: (op, calls, ~p50 ns, ~p99 ns, max ns, off-CPU share, preempted share); the
        latency columns None for entry-only ops (their end is not seen).

        Percentiles come from log histograms (4 bins per octave), for the live view only.
        """
        out: list[OpRow] = []
        for i in np.nonzero(self.count)[0].tolist():
            hist = self.hist[i]
            cum = np.cumsum(hist)
            total = cum[-1]
            if not total:
                out.append((OP_NAMES[i], int(self.count[i]), None, None, None, None, None))
                continue
            p50 = 2 ** ((np.searchsorted(cum, 0.50 * total) + 0.5) / 4)
            p99 = 2 ** ((np.searchsorted(cum, 0.99 * total) + 0.5) / 4)
            mx = int(self.max[i])
            total = self.sums[0, i] or 1.0
            out.append((OP_NAMES[i], int(self.count[i]), min(float(p50), mx), min(float(p99), mx), mx,
                        self.sums[1, i] / total, self.sums[2, i] / total))
        return sorted(out, key=lambda r: -r[1])


class Sink:
    """Writes a recording's rows into the store and counts them (the `stored` figures the live view shows)."""

    counter_snapshot: np.ndarray  # the kernel's counters as of the last collector_stats rows (live view)

    def __init__(self, drain: Drain, targets: Targets) -> None:
        self.drain = drain
        self.targets = targets
        self.writer: TraceWriter | Any = None  # opened by Tracer.start
        self.offset_ns = 0
        self.kstacks: KernelStacks | Any = None
        self.ustacks: UserStacks | Any = None
        self.stored: dict[str, int] = {"cuda_calls": 0, "sched_intervals": 0, "process_events": 0,
                                       "host_aggregates": 0, "snapshots": 0}
        self.ops = OpStats()
        self.snapshot: dict[str, Any] = {}  # the latest system snapshot stored
        self._snapshots: list[dict[str, Any]] = []
        self._gpu_rows: list[dict[str, list[Any]]] = []
        self._cgroup_rows: list[dict[str, list[Any]]] = []
        self._costs_written = False
        self.unfinished: dict[str, int] = {}  # calls in flight and threads off-CPU at the stop, once recorded
        self.thread_states_left: int | None = None

    def open(self, writer: TraceWriter, offset_ns: int, kstacks: KernelStacks, ustacks: UserStacks) -> None:
        """Start writing: the store's writer, wall minus kernel clock, the kernel and user stacks' readers."""
        self.writer = writer
        self.offset_ns = offset_ns
        self.kstacks = kstacks
        self.ustacks = ustacks

    def _count(self, table: str, rows: int) -> None:
        self.stored[table] = self.stored.get(table, 0) + rows

    # ---- rows appended --------------------------------------------------------------------

    def queue_samples(self, snap: dict[str, Any], gpu: dict[str, list[Any]], cgroups: dict[str, list[Any]]) -> None:
        """The sampler thread's rows of one second, kept until the next flush."""
        with self.drain.lock:
            self._snapshots.append(snap)
            if gpu["pid"]:
                self._gpu_rows.append(gpu)
            if cgroups["pid"]:
                self._cgroup_rows.append(cgroups)

    def store_pending(self) -> None:
        """Decode and append what the drain thread queued: process events first (so that new pids are
        known), then CUDA calls, then scheduler intervals, then on-CPU samples."""
        taken = self.drain.take_pending()
        for name in ("proc", "cuda", "sched", "sample"):
            parts = taken[name]
            if not parts:
                continue
            ev = np.concatenate(parts) if len(parts) > 1 else parts[0]
            if name == "cuda":
                self._store_cuda(ev)
            elif name == "sched":
                kstack_ids = self.kstacks.column(ev["kstack"])
                ustack_ids = self.ustacks.column(ev["pid"], ev["ustack"], ev["py"])
                self.writer.append("sched_intervals", R.sched_table(ev, self.offset_ns, kstack_ids, ustack_ids))
                self._count("sched_intervals", len(ev))
                self.store_stacks()
                self.targets.on_intervals(ev, self.offset_ns)
            elif name == "sample":
                table = R.sample_table(ev, self.offset_ns, self.kstacks.column(ev["kstack"]),
                                       self.ustacks.column(ev["pid"], ev["ustack"], ev["py"]))
                self.writer.append("stack_samples", table)
                self._count("stack_samples", len(ev))
                self.store_stacks()
            else:
                self._store_proc(ev)

    def _store_cuda(self, ev: np.ndarray) -> None:
        table = R.cuda_table(ev, self.offset_ns)
        self.writer.append("cuda_calls", table.append_column("host_pinned", self._pinned(ev)))
        self._count("cuda_calls", len(ev))
        self.ops.add(ev)
        self.targets.note_cuda_pids(np.unique(ev["pid"]).tolist())

    def _pinned(self, ev: np.ndarray) -> pa.Array:
        """host_pinned of these call records: did the host pointer lie in pinned memory (PinnedRanges)."""
        return self.targets.pinned.annotate(ev["pid"], ev["op"], ev["ret"], ev["ts"], ev["kind"], ev["host_ptr"],
                                            (ev["flags"] & R.F_HOSTPTR) != 0, ev["bytes"], self.targets.pins_seen)

    def _store_proc(self, ev: np.ndarray) -> None:
        rows = ev[ev["kind"] != R.P_TEXIT]  # thread exits only end threads rows
        if len(rows):
            self.writer.append("process_events", R.proc_table(rows, self.offset_ns))
        self._count("process_events", len(ev))
        self.targets.on_proc_events(ev, self.offset_ns)
        if self.ustacks is not None:
            for pid in np.unique(ev["pid"][ev["kind"] == R.P_EXEC]).tolist():
                self.ustacks.forget(int(pid))

    def store_stacks(self) -> None:
        """The kernel and user stacks first seen in the rows just stored."""
        for stacks in (self.kstacks, self.ustacks):
            rows = stacks.take_rows()
            if rows is not None:
                self.writer.append("stacks", rows)
                self._count("stacks", rows.num_rows)

    def store_costs(self, probes: Probes, governor: Governor | None, *, final: bool = False) -> None:
        """probe_costs once known, the governor's gaps and tracing_cost rows as they are made."""
        if (probes.costs_final or final) and not self._costs_written:
            costs = probes.costs if probes.costs_final else defaults("not measured: no libcuda was attached")
            rows = [c.row() for c in [*costs.values(), probes.sched_cost, probes.page_cost]]
            self.writer.append("probe_costs", {k: [r[k] for r in rows] for k in rows[0]})
            self._costs_written = True
        if governor is None:
            return
        if final:
            governor.finish()
        gaps, rows = governor.take()
        if gaps:
            self.writer.append("probe_gaps", {k: [g[k] for g in gaps] for k in gaps[0]})
        if rows:
            self.writer.append("tracing_cost", {k: [r[k] for r in rows] for k in rows[0]})

    def harvest(self, *, everything: bool = False) -> None:
        """Finished (pid, second) buckets of the kernel's aggregate map into host_aggregates (all at the stop)."""
        table = self.drain.harvest(self.offset_ns, self.targets.is_traced, everything=everything)
        if table is None:
            return
        self.writer.append("host_aggregates", table)
        self._count("host_aggregates", table.num_rows)

    def store_snapshots(self) -> None:
        """The sampler's rows queued since the last flush: cgroup samples, GPU processes, system snapshots."""
        with self.drain.lock:
            snaps, self._snapshots = self._snapshots, []
            gpu, self._gpu_rows = self._gpu_rows, []
            cgroups, self._cgroup_rows = self._cgroup_rows, []
        for rows in cgroups:
            self.writer.append("cgroup_samples", pa.table(rows, schema=CGROUP_SCHEMA))
            self._count("cgroup_samples", len(rows["pid"]))
        for rows in gpu:
            self.writer.append("gpu_processes", pa.table(rows, schema=GPU_PROC_SCHEMA))
            self._count("gpu_processes", len(rows["pid"]))
        if snaps:
            self.snapshot = snaps[-1]
            self.writer.append("snapshots", {k: [s[k] for s in snaps] for k in snaps[0]})
            self._count("snapshots", len(snaps))

    def store_unfinished(self, tstate: Any, now: int) -> None:
        """Calls still in flight and threads still off-CPU when the recording stops, from the kernel's
        thread states: a hung cudaStreamSynchronize is exactly what a user wants to see. Such calls get
        duration = entry to stop and a NULL return_code; such intervals a NULL on_ns."""
        calls, intervals, states = unfinished_rows(tstate, now, self.offset_ns, self.kstacks, self.ustacks)
        self.thread_states_left = states
        self.unfinished = {"calls_in_flight": len(calls), "threads_off_cpu": len(intervals["pid"])}
        if calls:
            ev = np.array([(0, 0, *c) for c in calls], dtype=R.CUDA_DTYPE)
            table = R.cuda_table(ev, self.offset_ns)
            table = table.append_column("host_pinned", self._pinned(ev))
            table = table.set_column(table.schema.get_field_index("return_code"), "return_code",
                                     pa.nulls(len(calls), pa.int32()))
            self.writer.append("cuda_calls", table)
            self._count("cuda_calls", len(calls))
        if intervals["pid"]:
            self.writer.append("sched_intervals", pa.table(intervals, schema=OPEN_INTERVAL_SCHEMA))
            self._count("sched_intervals", len(intervals["pid"]))
            self.store_stacks()

    # ---- latest-state tables --------------------------------------------------------------

    def write_latest(self, session: dict[str, list[Any]], c: np.ndarray, sampler: SystemSampler,
                     cgroups: CgroupSampler) -> None:
        """Replace this session's latest-state rows: `session` (the sessions row), the kernel counters `c` as
        collector_stats and table_coverage, and threads and processes where they changed."""
        self.writer.replace("sessions", session)
        self.writer.replace("collector_stats", self._stats_table(c, sampler))
        self.writer.replace("table_coverage", _coverage_table(c, cgroups))
        if self.targets.threads_dirty:
            self.writer.replace("threads", self.targets.threads_table())
            self.targets.threads_dirty = False
        if self.targets.procs_dirty:
            self.writer.replace("processes", self.targets.procs_table())
            self.targets.procs_dirty = False
        if self.ustacks is not None and self.ustacks.sources_dirty:
            self.writer.replace("stack_sources", self.ustacks.sources_table())
            self.ustacks.sources_dirty = False

    def _stats_table(self, c: np.ndarray, sampler: SystemSampler) -> dict[str, list[Any]]:
        lost = lost_counts(c)
        unfinished = self.unfinished
        calibration, aggregated = self.drain.calibration_rows, self.drain.aggregated
        rows = [
            ("cuda_calls", int(c[R.C_CUDA_SEEN] + c[R.C_CUDA_DEPTH]) + unfinished.get("calls_in_flight", 0)
             - calibration["cuda"], self.stored["cuda_calls"], lost["cuda_calls"], 0),
            ("sched_intervals", int(c[R.C_SCHED_SEEN]) + unfinished.get("threads_off_cpu", 0) - calibration["sched"],
             self.stored["sched_intervals"], lost["sched_intervals"], 0),
            ("process_events", int(c[R.C_PROC_SEEN]) - calibration["proc"], self.stored["process_events"],
             lost["process_events"], 0),
            ("sched_switch", int(c[R.C_SWITCH_TOTAL]), 0, lost["sched_switch"], aggregated.get(1, 0)),
            ("mm_page_alloc", int(c[R.C_PAGE_TOTAL]), 0, lost["mm_page_alloc"], aggregated.get(2, 0)),
            ("snapshots", sampler.samples, self.stored["snapshots"], 0, 0),
            ("stack_samples", int(c[R.C_SAMPLE_SEEN]) - calibration["sample"], self.stored.get("stack_samples", 0),
             lost["stack_samples"], 0),
        ]
        self.counter_snapshot = c
        return {
            "source": [r[0] for r in rows],
            "events_seen": [r[1] for r in rows],
            "events_stored": [r[2] for r in rows],
            "events_lost": [r[3] for r in rows],
            "events_aggregated": [r[4] for r in rows],
        }


def lost_counts(c: np.ndarray) -> dict[str, int]:
    """Records lost per source, from the kernel's counters `c` (ring full, map full, call stack too deep)."""
    return {
        "cuda_calls": int(c[R.C_CUDA_DROP] + c[R.C_CUDA_DEPTH]),
        "sched_intervals": int(c[R.C_SCHED_DROP]),
        "process_events": int(c[R.C_PROC_DROP]),
        "sched_switch": int(c[R.C_AGG_DROP_SWITCH]),
        "mm_page_alloc": int(c[R.C_AGG_DROP_PAGE]),
        "stack_samples": int(c[R.C_SAMPLE_DROP]),
    }


def _coverage_table(c: np.ndarray, cgroups: CgroupSampler) -> dict[str, list[Any]]:
    """table_coverage: whether each table holds every row it should, and what its rows are."""
    lost = lost_counts(c)
    rows = [
        ("cuda_calls", lost["cuda_calls"] == 0,
         f"every call of traced processes to the attached symbols (see sessions.attached); lost "
         f"{lost['cuda_calls']}; return_code NULL: still in flight when the recording stopped (duration up to the "
         "stop), or an entry-only launch (duration_ns NULL: its end is not seen, see sessions.attached entry_only); "
         "launches made while the governor had detached the launch probes are not rows (probe_gaps)"),
        ("sched_intervals", lost["sched_intervals"] == 0,
         f"every switch-out/switch-in of threads of traced processes; lost {lost['sched_intervals']}; "
         "on_ns NULL: still off-CPU when the recording stopped (off_cpu_ns up to the stop); kstack_id / ustack_id "
         "NULL: the kernel / user stack at switch-out was not taken (a preemption takes neither; sessions.notes "
         "kernel_stacks / user_stacks not_taken)"),
        ("stacks", True, "every distinct kernel, user or python stack that a kstack_id or ustack_id of "
         "sched_intervals or stack_samples names"),
        ("stack_samples", lost["stack_samples"] == 0, f"on-CPU samples of threads of traced processes at "
         f"stack_sources.sample_hz per CPU (none when 0); lost {lost['stack_samples']}; kstack_id NULL: the sample "
         "fell in user space"),
        ("stack_sources", True, "each traced process: whether its Python frames were walked, whether its native "
         "stacks go past the leaf (frame pointers; NULL: no user stack read), and why not"),
        ("host_aggregates", lost["sched_switch"] + lost["mm_page_alloc"] == 0,
         "exact counts for every task on the host: sched_switch per (pid, tid, cpu, 1 s bucket), sum_duration_ns "
         "the on-CPU time of the slices that ended in the bucket (pid 0: that CPU's idle); mm_page_alloc per "
         "(pid, 1 s bucket), tid and cpu NULL"),
        ("threads", True, "threads of traced processes: /proc at attach, thread creations, renames, exits and "
         "scheduler intervals; comm the latest name"),
        ("process_events", lost["process_events"] == 0, "every fork/exec/exit/oom_kill on the host; 'thread' (new "
         "thread) and 'rename' (comm changed, old_comm the old name) for threads of traced processes"),
        ("snapshots", True, "one system snapshot per second"),
        ("cgroup_samples", cgroups.ctl is not None, "each traced process's cgroup (cpu controller) and its "
         "ancestors with a quota, once a second: cpu.max / cfs quota and cpu.stat's throttling counters; empty "
         "where no cgroup hierarchy has the cpu controller"),
        ("gpu_processes", True, "every compute process NVML lists on each GPU, once a second (also processes not "
         "traced); empty without NVML or a GPU"),
        ("processes", True, "every traced process (targets, their children, CUDA users); other processes appear in "
         "host_aggregates and process_events"),
    ]
    return {"table_name": [r[0] for r in rows], "complete": [r[1] for r in rows], "note": [r[2] for r in rows]}
