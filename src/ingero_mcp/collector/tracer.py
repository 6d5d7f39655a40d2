"""The collector: loads the eBPF program, attaches CUDA uprobes, drains the rings into the store.

Three threads. A drain thread reads the three ring buffers every ~20 ms (bulk mmap reads, no
per-event Python). A sampler thread takes a system snapshot each second (/proc, and NVML, whose
calls can block on a wedged GPU). The main thread, every second, converts what was drained into
Arrow batches, harvests the finished per-(pid, second) aggregate buckets, stores the snapshots,
rewrites the latest-state tables and flushes a store segment; every second or two it rescans /proc
for CUDA libraries and traced processes. SIGINT, SIGTERM, --duration and the exit of every traced
process all end the same way: probes detached, rings drained, everything written, the store folded
and closed.
"""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa

from ingero_mcp.collector import records as R
from ingero_mcp.collector import uprobelink
from ingero_mcp.collector.cgroups import CgroupSampler
from ingero_mcp.collector.calibrate import ProbeCost, defaults
from ingero_mcp.collector.discovery import CudaLibrary, alive, descendants, resolve_library, runtime_version
from ingero_mcp.collector.drain import (
    AGG_ENTRIES,
    BUCKET_NS,
    CUDA_RB_PAGES,
    DRAIN_FILL,
    MIN_POLL_S,
    OPEN_INTERVAL_SCHEMA,
    PROC_RB_PAGES,
    SCHED_RB_PAGES,
    Drain,
    FillSinceRead,
    drain_wait,
    unfinished_rows,
)
from ingero_mcp.collector.governor import Governor
from ingero_mcp.collector.kstacks import KernelStacks, bcc_symbolizer
from ingero_mcp.collector.ops import OP_NAMES, OPS, entry_functions_c
from ingero_mcp.collector.preflight import tracefs_dir
from ingero_mcp.collector.probes import ENDBR64, AttachedLibrary, Probes, bpf_prog_info, bpf_run_stats, probe_site
from ingero_mcp.collector.sampler import Nvml, SystemSampler, host_info
from ingero_mcp.collector.targets import Targets

__all__ = [
    "AGG_ENTRIES", "CUDA_RB_PAGES", "DRAIN_FILL", "ENDBR64", "MIN_POLL_S", "PROC_RB_PAGES", "SCHED_RB_PAGES",
    "AttachedLibrary", "FillSinceRead", "TraceOptions", "Tracer", "bpf_prog_info", "bpf_run_stats",
    "clock_offset_ns", "collectors_dir", "drain_wait", "install_signal_handlers", "probe_site",
]

HIST_BINS = 256  # log2 durations, 4 bins per octave (live view only; the store keeps every value)


def collectors_dir() -> Path:
    """`collectors/` in a source checkout, or the copy packed into the wheel."""
    repo = Path(__file__).resolve().parents[3] / "collectors"
    if (repo / "ingero.bpf.c").is_file():
        return repo
    return Path(str(resources.files("ingero_mcp") / "collectors"))


def clock_offset_ns() -> int:
    """Wall clock minus CLOCK_MONOTONIC (bpf_ktime_get_ns), measured once, best of several reads."""
    best: tuple[int, int] | None = None
    for _ in range(9):
        m0 = time.monotonic_ns()
        wall = time.time_ns()
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, wall - (m0 + m1) // 2)
    assert best is not None
    return best[1]


@dataclass
class TraceOptions:
    """What `ingero-mcp trace` was asked to do."""

    db: Path
    duration_s: float | None = None
    pids: list[int] = field(default_factory=list)
    cuda_libs: list[str] = field(default_factory=list)
    apis: tuple[str, ...] = ("runtime", "driver")  # which libraries get probes (--api)
    layer: str = "auto"  # 'auto': one layer per logical call (ops.AUTO_RUNTIME_OPS); 'both': every symbol of each API
    launch_probes: str = "entry"  # 'entry': launches probed entry-only (no duration); 'full': entry + return
    max_overhead_pct: float | None = 2.0  # the governor's budget (share of a process's wall time); None: estimate only
    calibrate: bool = True  # measure the per-hit probe costs at start (else the documented defaults)
    quiet: bool = False
    flush_interval_s: float = 1.0
    poll_interval_s: float = 0.25  # the longest the rings stay unread; sooner when they fill faster (_drain_loop)
    rescan_interval_s: float = 1.0
    bpf_cache: bool = True  # load the compiled eBPF program from ~/.cache/ingero-mcp/bpf (--no-bpf-cache)


class Tracer:
    """One recording: from compiling the eBPF program to the folded store."""

    def __init__(self, opts: TraceOptions, *, log: TextIO | None = None, argv: list[str] | None = None) -> None:
        self.opts = opts
        self.log = log or sys.stderr
        self.argv = argv or []
        self.trace_all = not opts.pids
        self._stop_reason: str | None = None
        self.targets = Targets(self.trace_all)
        self.probes = Probes(opts, self.targets, self._say)
        self.drain = Drain(self.probes.calibration_pids)
        self.stored: dict[str, int] = {"cuda_calls": 0, "sched_intervals": 0, "process_events": 0,
                                       "host_aggregates": 0, "snapshots": 0}
        self.op_hist = np.zeros((len(OPS), HIST_BINS), np.int64)
        self.op_count = np.zeros(len(OPS), np.int64)
        self.op_max = np.zeros(len(OPS), np.int64)
        self.op_sums = np.zeros((3, len(OPS)), np.float64)  # duration, off-CPU, preempted (live view)
        self.on_flush: Callable[[Tracer], None] | None = None
        self.started_ns = 0
        self.stopped_ns: int | None = None
        self.cpu_at_start_s = 0.0  # the collector's CPU seconds when recording began (start-up's share)
        self.detach_s = 0.0  # how long the stop's detach took
        self.snapshot: dict[str, Any] = {}
        self._wake = threading.Event()  # request_stop wakes the main loop
        self._drain_thread: threading.Thread | None = None
        self._sample_thread: threading.Thread | None = None
        self._sample_stop = threading.Event()
        self._snapshots: list[dict[str, Any]] = []
        self._gpu_rows: list[dict[str, list[Any]]] = []
        self._cgroup_rows: list[dict[str, list[Any]]] = []
        self.sample_errors = 0
        self.last_sample_error: str | None = None
        self._finished = False
        self._costs_written = False
        self.governor: Governor | None = None
        self._governor_thread: threading.Thread | None = None
        self._governor_stop = threading.Event()

    @property
    def procs(self) -> dict[int, dict[str, Any]]:
        """The processes rows (Targets)."""
        return self.targets.procs

    @property
    def traced_map(self) -> Any:
        """The kernel's set of traced pids (Targets)."""
        return self.targets.traced_map

    @property
    def libs(self) -> dict[tuple[int, int], AttachedLibrary]:
        """The library files met, attached or not (Probes)."""
        return self.probes.libs

    @property
    def uprobe_links(self) -> dict[bytes, int]:
        """Uprobe event name -> BPF link fd (Probes)."""
        return self.probes.uprobe_links

    @property
    def costs(self) -> dict[str, ProbeCost]:
        """What one probe hit costs, entry-only and entry + return (Probes)."""
        return self.probes.costs

    @property
    def sched_cost(self) -> ProbeCost:
        """What the scheduler tracepoints add to one off-CPU interval (Probes)."""
        return self.probes.sched_cost

    @property
    def page_cost(self) -> ProbeCost:
        """What the page-allocation tracepoint adds to one page (Probes)."""
        return self.probes.page_cost

    @property
    def traced_pages(self) -> int:
        """Page allocations of traced processes harvested so far (Drain)."""
        return self.drain.traced_pages

    def attach_library(self, lib: CudaLibrary, *, forced: bool = False) -> AttachedLibrary | None:
        """Probe every known symbol of one library file, once per file (Probes.attach_library)."""
        return self.probes.attach_library(lib, forced=forced)

    def layer_summary(self) -> str:
        """Which layer is probed for which traced process, for the live view (Probes.layer_summary)."""
        return self.probes.layer_summary()

    def attached_json(self) -> str:
        """What was attached where, and what was not, for the sessions row (Probes.attached_json)."""
        return self.probes.attached_json()

    # ---- start ----------------------------------------------------------------------------

    def _compile(self) -> None:
        from ingero_mcp.collector.bccload import import_bcc
        from ingero_mcp.collector.bpfcache import load_bpf

        bcc = import_bcc()
        root = tracefs_dir()
        events = root / "events" if root else Path("/sys/kernel/tracing/events")
        cflags = [
            f"-DCUDA_RB_PAGES={CUDA_RB_PAGES}",
            f"-DSCHED_RB_PAGES={SCHED_RB_PAGES}",
            f"-DPROC_RB_PAGES={PROC_RB_PAGES}",
            f"-DAGG_ENTRIES={AGG_ENTRIES}",
            "-Wno-macro-redefined",
        ]
        exit_fmt = events / "sched" / "sched_process_exit" / "format"
        if exit_fmt.is_file() and "group_dead" in exit_fmt.read_text():
            cflags.append("-DHAVE_GROUP_DEAD")
        if (events / "oom" / "mark_victim" / "format").is_file():
            cflags.append("-DHAVE_OOM")
        if (events / "syscalls" / "sys_enter_exit_group" / "format").is_file():
            cflags.append("-DHAVE_EXIT_GROUP")
        if (events / "timer" / "hrtimer_expire_entry" / "format").is_file():
            cflags.append("-DHAVE_HRTIMER")
        rename_fmt = events / "task" / "task_rename" / "format"
        if rename_fmt.is_file() and "pid_t pid;" in rename_fmt.read_text():
            cflags.append("-DHAVE_RENAME_PID")
        # bpf_task_pt_regs (kernel >= 5.15, BTF): the syscall a thread left the CPU in (x86-64 registers)
        want_regs = os.uname().machine == "x86_64" and Path("/sys/kernel/btf/vmlinux").is_file()
        text = (collectors_dir() / "ingero.bpf.c").read_text() + "\n" + entry_functions_c()
        self.bpf_version = getattr(bcc, "__version__", "?")
        # a start after the first loads the compiled program from the cache (collector/bpfcache.py)
        cache = {} if self.opts.bpf_cache else {"cache_dir": None}
        t0 = time.monotonic()
        try:
            self.bpf, self.bpf_status = load_bpf(bcc, text, [*cflags, "-DHAVE_TASK_PT_REGS"] if want_regs else cflags,
                                                 say=self._say, **cache)
            if want_regs:
                cflags.append("-DHAVE_TASK_PT_REGS")
        except Exception:  # noqa: BLE001 - a kernel or BCC without the helper: syscall stays NULL
            if not want_regs:
                raise
            self.bpf, self.bpf_status = load_bpf(bcc, text, cflags, say=self._say, **cache)
        self._say(f"eBPF program {self.bpf_status} ({time.monotonic() - t0:.2f} s)")
        self.features = [f[2:] for f in cflags if f.startswith("-DHAVE_")]
        self.probes.link_uprobes, why_not = ((False, "INGERO_UPROBE_LINKS=0")
                                             if os.environ.get("INGERO_UPROBE_LINKS") == "0"
                                             else uprobelink.supported())
        if self.probes.link_uprobes:
            self.features.append("UPROBE_LINKS")
        else:
            self._say(f"uprobes as perf events ({why_not}): each detach waits its turn (~0.1 s)")
        self.bpf["config"][self.bpf["config"].Key(0)] = self.bpf["config"].Leaf(1 if self.trace_all else 0)
        # every tracepoint is attached now: interrupt entries may count (their exits are there)
        self.bpf["config"][self.bpf["config"].Key(1)] = self.bpf["config"].Leaf(1)
        self.probes.bpf = self.bpf
        self.targets.traced_map = self.bpf["traced"]
        self.kstacks = KernelStacks(self.bpf["kstacks"], bcc_symbolizer())
        self.drain.open(self.bpf)

    def _say(self, message: str) -> None:
        print(f"ingero-mcp trace: {message}", file=self.log, flush=True)

    def _discover(self) -> None:
        """Attach libraries mapped by the processes we trace (all processes without --pid): Probes.discover."""
        self.probes.discover()

    def start(self) -> None:
        """Compile, seed the traced set, attach, open the store, write the session row."""
        from ingero_mcp.store import TraceWriter, segment_dir

        db = self.opts.db
        if not db.parent.is_dir():
            raise FileNotFoundError(f"--db {db}: directory {db.parent} does not exist")
        # What the user named is checked before the seconds of loading and calibrating (and again after them)
        for pid in self.opts.pids:
            if not alive(pid):
                raise ProcessLookupError(f"no process {pid}")
        forced_libs = []  # --cuda-lib files, attached once the traced set is seeded
        for path in self.opts.cuda_libs:
            lib = resolve_library(path)
            if lib is None:
                raise FileNotFoundError(f"--cuda-lib {path}: not a readable libcudart.so*/libcuda.so* file")
            forced_libs.append(lib)
        if segment_dir(db).is_dir() and any(segment_dir(db).iterdir()):
            raise FileExistsError(
                f"{segment_dir(db)} exists: another collector is recording to {db}, or one was killed. If none is "
                f"running, fold what it left: python3 -c \"from ingero_mcp.store import fold_segments; "
                f"fold_segments('{db}')\" (or choose another --db)")
        self.offset_ns = clock_offset_ns()
        self.nvml = Nvml()
        self.sampler = SystemSampler(self.nvml)
        self.cgroups = CgroupSampler()
        self.host = host_info(self.nvml)
        self._compile()
        share = None if self.opts.max_overhead_pct is None else self.opts.max_overhead_pct / 100
        self.governor = Governor(self.probes.costs, share, self.probes.toggle_launch,
                                 windowed=self.opts.launch_probes == "entry", offset_ns=self.offset_ns, say=self._say,
                                 refresh=self.drain.read)
        self.probes.governor = self.drain.governor = self.governor
        self.probes.calibrate_sched()
        for pid in self.opts.pids:
            if not alive(pid):
                raise ProcessLookupError(f"no process {pid} (it exited while the collector started)")
        for pid in sorted(descendants(self.opts.pids)) if self.opts.pids else []:
            self.targets.trace(pid, target=True)
        for lib in forced_libs:
            self.attach_library(lib, forced=True)
        self._discover()
        self.started_ns = time.time_ns()
        self.cpu_at_start_s = _cpu_seconds()  # compile/load, attach and calibration
        self.writer = TraceWriter(self.opts.db, live=True)
        self._write_latest()
        self.writer.flush()
        probes = sum(len(rec.attached) for rec in self.libs.values())
        who = f"pids {', '.join(map(str, self.opts.pids))} and their children" if self.opts.pids else \
            "every process that uses libcudart/libcuda"
        self._say(f"recording to {self.opts.db} (session {self.writer.session_id}): {who}; "
                  f"{len(self.libs)} libraries, {probes} symbols attached; Ctrl-C to stop")
        if not self.libs:
            self._say("no libcudart/libcuda mapped yet; rescanning every second (calls made before a library is "
                      "found are missed: --cuda-lib PATH attaches it now)")

    # ---- loop -----------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask the loop to finish (signal handlers call this)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._wake.set()

    def _take_sample(self) -> None:
        snap = self.sampler.sample()
        gpu = self.nvml.processes(snap["ts_ns"])
        cgroups = self.cgroups.sample(snap["ts_ns"], self.targets.traced_alive())
        with self.drain.lock:
            self._snapshots.append(snap)
            if gpu["pid"]:
                self._gpu_rows.append(gpu)
            if cgroups["pid"]:
                self._cgroup_rows.append(cgroups)

    def _sample_loop(self) -> None:
        # Its own thread: an NVML call on a wedged GPU can block for seconds; flushes must not wait.
        while not self._sample_stop.wait(1.0):
            try:
                self._take_sample()
            except Exception as exc:  # noqa: BLE001 - one bad read must not end the snapshots
                self.sample_errors += 1
                self.last_sample_error = f"{type(exc).__name__}: {exc}"


    def _store_snapshots(self) -> None:
        with self.drain.lock:
            snaps, self._snapshots = self._snapshots, []
            gpu, self._gpu_rows = self._gpu_rows, []
            cgroups, self._cgroup_rows = self._cgroup_rows, []
        for rows in cgroups:
            self.writer.append("cgroup_samples", pa.table(rows, schema=_CGROUP_SCHEMA))
            self.stored["cgroup_samples"] = self.stored.get("cgroup_samples", 0) + len(rows["pid"])
        for rows in gpu:
            self.writer.append("gpu_processes", pa.table(rows, schema=_GPU_PROC_SCHEMA))
            self.stored["gpu_processes"] = self.stored.get("gpu_processes", 0) + len(rows["pid"])
        if snaps:
            self.snapshot = snaps[-1]
            self.writer.append("snapshots", {k: [s[k] for s in snaps] for k in snaps[0]})
            self.stored["snapshots"] += len(snaps)

    def _harvest(self, *, everything: bool = False) -> None:
        """Move finished (pid, second) buckets from the kernel map to host_aggregates."""
        table = self.drain.harvest(self.offset_ns, self.targets.is_traced, everything=everything)
        if table is None:
            return
        self.writer.append("host_aggregates", table)
        self.stored["host_aggregates"] += table.num_rows

    def _process_cuda(self, ev: np.ndarray) -> None:
        table = R.cuda_table(ev, self.offset_ns)
        pinned = self.targets.pinned.annotate(ev["pid"], ev["op"], ev["ret"], ev["ts"], ev["kind"], ev["host_ptr"],
                                              (ev["flags"] & R.F_HOSTPTR) != 0, ev["bytes"], self.targets.pins_seen)
        self.writer.append("cuda_calls", table.append_column("host_pinned", pinned))
        self.stored["cuda_calls"] += len(ev)
        self.op_count += np.bincount(ev["op"].astype(np.int64), minlength=len(OPS))
        pids = np.unique(ev["pid"]).tolist()
        ev = ev[(ev["flags"] & R.F_NORET) == 0]  # the live view's latencies: calls whose end was seen
        op = ev["op"].astype(np.int64)
        dur = ev["dur"].astype(np.int64)
        bins = np.clip((np.log2(np.maximum(dur, 1)) * 4).astype(np.int64), 0, HIST_BINS - 1)
        self.op_hist += np.bincount(op * HIST_BINS + bins, minlength=len(OPS) * HIST_BINS).reshape(len(OPS), HIST_BINS)
        np.maximum.at(self.op_max, op, dur)
        pre = ev["wait_ns"].astype(np.float64)
        for row, weights in enumerate((dur.astype(np.float64), pre + ev["sleep_ns"], pre)):
            self.op_sums[row] += np.bincount(op, weights=weights, minlength=len(OPS))
        self.targets.note_cuda_pids(pids)

    def _process_proc(self, ev: np.ndarray) -> None:
        rows = ev[ev["kind"] != R.P_TEXIT]  # thread exits only end threads rows
        if len(rows):
            self.writer.append("process_events", R.proc_table(rows, self.offset_ns))
        self.stored["process_events"] += len(ev)
        self.targets.on_proc_events(ev, self.offset_ns)

    def _store_pending(self) -> None:
        """Decode and append what the drain thread queued: process events first (so that new pids are
        known), then CUDA calls, then scheduler intervals."""
        taken = self.drain.take_pending()
        for name in ("proc", "cuda", "sched"):
            parts = taken[name]
            if not parts:
                continue
            ev = np.concatenate(parts) if len(parts) > 1 else parts[0]
            if name == "cuda":
                self._process_cuda(ev)
            elif name == "sched":
                self.writer.append("sched_intervals", R.sched_table(ev, self.offset_ns, self.kstacks.column(ev["kstack"])))
                self.stored["sched_intervals"] += len(ev)
                self._store_stacks()
                self.targets.on_intervals(ev, self.offset_ns)
            else:
                self._process_proc(ev)

    def _store_stacks(self) -> None:
        """The kernel stacks first seen in the intervals just stored."""
        rows = self.kstacks.take_rows()
        if rows is not None:
            self.writer.append("stacks", rows)
            self.stored["stacks"] = self.stored.get("stacks", 0) + rows.num_rows

    def _store_costs(self, *, final: bool = False) -> None:
        """probe_costs once known, the governor's gaps and tracing_cost rows as they are made."""
        probes = self.probes
        if (probes.costs_final or final) and not self._costs_written:
            costs = probes.costs if probes.costs_final else defaults("not measured: no libcuda was attached")
            rows = [c.row() for c in [*costs.values(), probes.sched_cost, probes.page_cost]]
            self.writer.append("probe_costs", {k: [r[k] for r in rows] for k in rows[0]})
            self._costs_written = True
        if self.governor is None:
            return
        if final:
            self.governor.finish()
        gaps, rows = self.governor.take()
        if gaps:
            self.writer.append("probe_gaps", {k: [g[k] for g in gaps] for k in gaps[0]})
        if rows:
            self.writer.append("tracing_cost", {k: [r[k] for r in rows] for k in rows[0]})

    def _flush(self) -> None:
        self._store_pending()
        self._store_costs()
        self._harvest()
        self._store_snapshots()
        self._write_latest()
        self.writer.flush()
        if self.on_flush:
            self.on_flush(self)

    def _check_targets(self) -> None:
        if self.trace_all:
            return
        if not self.targets.prune_exited():
            self.request_stop("every traced process exited")

    def run(self) -> int:
        """Record until stopped; returns 0."""
        start = time.monotonic()
        next_flush = start + self.opts.flush_interval_s
        next_scan = start + self.opts.rescan_interval_s
        self._drain_thread = threading.Thread(target=self.drain.loop, args=(self.opts.poll_interval_s,),
                                              name="ring-drain", daemon=True)
        self._drain_thread.start()
        self._sample_thread = threading.Thread(target=self._sample_loop, name="sampler", daemon=True)
        self._sample_thread.start()
        if self.governor is not None:
            self._governor_thread = threading.Thread(target=self.governor.run, args=(self._governor_stop,),
                                                     name="governor", daemon=True)
            self._governor_thread.start()
        try:
            self._loop(start, next_flush, next_scan)
        except Exception as exc:
            # Disk full, a store error...: stop the same clean way, keep what was recorded, then fail.
            self._say(f"error while recording: {type(exc).__name__}: {exc}; stopping")
            self.request_stop(f"error: {type(exc).__name__}: {exc}")
            self.finish()
            raise
        self.finish()
        return 0

    def _loop(self, start: float, next_flush: float, next_scan: float) -> None:
        end = math.inf if self.opts.duration_s is None else start + self.opts.duration_s
        while self._stop_reason is None:
            # asleep until the next flush, scan or --duration, or a stop request: few wake-ups (see DRAIN_FILL)
            self._wake.wait(max(0.0, min(next_flush, next_scan, end) - time.monotonic()))
            if self._stop_reason is not None:
                break
            now = time.monotonic()
            if now >= next_flush:
                self._flush()
                next_flush = now + self.opts.flush_interval_s
            if now >= next_scan:
                self._discover()
                self._check_targets()
                next_scan = now + self.opts.rescan_interval_s * (2 if self.trace_all else 1)
            if self.opts.duration_s is not None and now - start >= self.opts.duration_s:
                self.request_stop(f"--duration {self.opts.duration_s:g}s reached")

    # ---- stop -----------------------------------------------------------------------------

    def _detach(self) -> None:
        """Every probe and tracepoint at once (Probes.detach_all)."""
        self.probes.detach_all()

    def finish(self) -> None:
        """Detach, drain, write the final state, fold and close the store."""
        if self._finished:
            return
        self._finished = True
        self._say(f"stopping ({self._stop_reason}): detaching, draining, folding the store")
        self._governor_stop.set()
        if self._governor_thread is not None:
            self._governor_thread.join(timeout=10)
        # Detach while the drain thread still reads the rings: a job launching at ~1M/s filled the CUDA
        # ring within the detach when the reader had stopped before it (records lost).
        # Every probe stops firing when its detach begins; the detaches then wait out grace periods that
        # the kernel serialises (~4 s for all on the VM). The recording ends where the probes stopped, not
        # where the waiting ended: a later stop would add seconds without rows (a thread seemingly
        # running outside CUDA calls). A record already in flight can be a little later: then its end.
        detach_ns, t_detach = time.time_ns(), time.monotonic()
        self._detach()
        self.detach_s = time.monotonic() - t_detach
        self.drain.stop.set()
        if self._drain_thread is not None:
            self._drain_thread.join()
        self.drain.read()
        self.stopped_ns = max(detach_ns, self.drain.last_record_ktime + self.offset_ns)
        self._record_unfinished()
        self._flush_final()
        lost = self.lost()
        self.writer.close()
        self.drain.close()
        self.bpf.cleanup()
        self._say(f"stopped ({self._stop_reason}): {self.stored['cuda_calls']:,} CUDA calls, "
                  f"{self.stored['sched_intervals']:,} scheduler intervals, "
                  f"{self.stored['process_events']:,} process events; lost {sum(lost.values())}; "
                  f"store {self.opts.db} (report: ingero-mcp explain --db {self.opts.db})")

    def _record_unfinished(self) -> None:
        """Calls still in flight and threads still off-CPU when the recording stops, from the kernel's
        thread states: a hung cudaStreamSynchronize is exactly what a user wants to see. Such calls get
        duration = entry to stop and a NULL return_code; such intervals a NULL on_ns."""
        now = (self.stopped_ns or time.time_ns()) - self.offset_ns  # the stop, on the kernel's clock
        calls, intervals, states = unfinished_rows(self.bpf["tstate"], now, self.offset_ns, self.kstacks)
        self.thread_states_left = states
        self.unfinished = {"calls_in_flight": len(calls), "threads_off_cpu": len(intervals["pid"])}
        if calls:
            ev = np.array([(0, 0, *c) for c in calls], dtype=R.CUDA_DTYPE)
            table = R.cuda_table(ev, self.offset_ns)
            table = table.append_column("host_pinned", self.targets.pinned.annotate(
                ev["pid"], ev["op"], ev["ret"], ev["ts"], ev["kind"], ev["host_ptr"], (ev["flags"] & R.F_HOSTPTR) != 0,
                ev["bytes"], self.targets.pins_seen))
            table = table.set_column(table.schema.get_field_index("return_code"), "return_code",
                                     pa.nulls(len(calls), pa.int32()))
            self.writer.append("cuda_calls", table)
            self.stored["cuda_calls"] += len(calls)
        if intervals["pid"]:
            self.writer.append("sched_intervals", pa.table(intervals, schema=OPEN_INTERVAL_SCHEMA))
            self.stored["sched_intervals"] += len(intervals["pid"])
            self._store_stacks()

    def _flush_final(self) -> None:
        self._store_pending()
        self._store_costs(final=True)
        self._harvest(everything=True)
        self._sample_stop.set()
        if self._sample_thread is not None:
            self._sample_thread.join(timeout=10)
        self._take_sample()
        self._store_snapshots()
        self._write_latest()

    # ---- latest-state tables --------------------------------------------------------------

    def lost(self, c: np.ndarray | None = None) -> dict[str, int]:
        """Records lost per source so far (ring full, map full, call stack too deep)."""
        c = self.drain.counters() if c is None else c
        return {
            "cuda_calls": int(c[R.C_CUDA_DROP] + c[R.C_CUDA_DEPTH]),
            "sched_intervals": int(c[R.C_SCHED_DROP]),
            "process_events": int(c[R.C_PROC_DROP]),
            "sched_switch": int(c[R.C_AGG_DROP_SWITCH]),
            "mm_page_alloc": int(c[R.C_AGG_DROP_PAGE]),
        }

    def _stats_table(self, c: np.ndarray) -> dict[str, list[Any]]:
        lost = self.lost(c)
        unfinished: dict[str, int] = getattr(self, "unfinished", {})
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
            ("snapshots", self.sampler.samples, self.stored["snapshots"], 0, 0),
        ]
        self.counter_snapshot = c
        return {
            "source": [r[0] for r in rows],
            "events_seen": [r[1] for r in rows],
            "events_stored": [r[2] for r in rows],
            "events_lost": [r[3] for r in rows],
            "events_aggregated": [r[4] for r in rows],
        }

    def _coverage_table(self, c: np.ndarray) -> dict[str, list[Any]]:
        lost = self.lost(c)
        rows = [
            ("cuda_calls", lost["cuda_calls"] == 0,
             f"every call of traced processes to the attached symbols (see sessions.attached); lost {lost['cuda_calls']}; "
             "return_code NULL: still in flight when the recording stopped (duration up to the stop), or an entry-only "
             "launch (duration_ns NULL: its end is not seen, see sessions.attached entry_only); launches made while "
             "the governor had detached the launch probes are not rows (probe_gaps)"),
            ("sched_intervals", lost["sched_intervals"] == 0,
             f"every switch-out/switch-in of threads of traced processes; lost {lost['sched_intervals']}; "
             "on_ns NULL: still off-CPU when the recording stopped (off_cpu_ns up to the stop); kstack_id NULL: the "
             "kernel stack at switch-out was not taken (sessions.notes kernel_stacks.not_taken)"),
            ("stacks", True, "every distinct kernel stack that a kstack_id of sched_intervals names"),
            ("host_aggregates", lost["sched_switch"] + lost["mm_page_alloc"] == 0,
             "exact counts for every task on the host: sched_switch per (pid, tid, cpu, 1 s bucket), sum_duration_ns "
             "the on-CPU time of the slices that ended in the bucket (pid 0: that CPU's idle); mm_page_alloc per "
             "(pid, 1 s bucket), tid and cpu NULL"),
            ("threads", True, "threads of traced processes: /proc at attach, thread creations, renames, exits and "
             "scheduler intervals; comm the latest name"),
            ("process_events", lost["process_events"] == 0, "every fork/exec/exit/oom_kill on the host; 'thread' (new "
             "thread) and 'rename' (comm changed, old_comm the old name) for threads of traced processes"),
            ("snapshots", True, "one system snapshot per second"),
            ("cgroup_samples", self.cgroups.ctl is not None, "each traced process's cgroup (cpu controller) and its "
             "ancestors with a quota, once a second: cpu.max / cfs quota and cpu.stat's throttling counters; empty where "
             "no cgroup hierarchy has the cpu controller"),
            ("gpu_processes", True, "every compute process NVML lists on each GPU, once a second (also processes not "
             "traced); empty without NVML or a GPU"),
            ("processes", True, "every traced process (targets, their children, CUDA users); other processes appear in host_aggregates and process_events"),
        ]
        return {"table_name": [r[0] for r in rows], "complete": [r[1] for r in rows], "note": [r[2] for r in rows]}

    def _write_latest(self) -> None:
        versions = sorted({v for rec in self.libs.values() if rec.lib.api == "runtime"
                           for v in [runtime_version(rec.lib.path)] if v})
        c = self.drain.counters()
        flags = {
            "argv": self.argv, "db": str(self.opts.db), "duration_s": self.opts.duration_s, "pids": self.opts.pids,
            "cuda_libs": self.opts.cuda_libs, "apis": list(self.opts.apis), "layer": self.opts.layer,
            "launch_probes": self.opts.launch_probes, "max_overhead_pct": self.opts.max_overhead_pct,
            "quiet": self.opts.quiet, "trace_all": self.trace_all,
            "flush_interval_s": self.opts.flush_interval_s, "bucket_ns": BUCKET_NS, "kernel_features": self.features,
            "clock_offset_ns": self.offset_ns,
        }
        from ingero_mcp import __version__

        notes = {"stop_reason": self._stop_reason, "unreturned_calls": int(c[R.C_CUDA_ORPHAN]),
                 "thread_state_map_full": int(c[R.C_TSTATE_FULL]), "nvml": self.nvml.error or "ok",
                 "collector_cpu_s": round(_cpu_seconds(), 3),
                 "collector_cpu_recording_s": round(_cpu_seconds() - self.cpu_at_start_s, 3),
                 "bpf_program": getattr(self, "bpf_status", None),
                 "bpf_run_stats": bpf_run_stats(self.bpf.funcs),
                 "cuda_ring_full": int(c[R.C_CUDA_DROP]), "cuda_stack_too_deep": int(c[R.C_CUDA_DEPTH]),
                 "wakeups_seen": int(c[R.C_WAKEUP_SEEN]), "wakeups_from_interrupts": int(c[R.C_WAKE_IRQ]),
                 # switch-outs whose kernel stack was not taken (its slot in the stack map held another stack):
                 # their kstack_id is NULL; the interval itself is stored
                 "kernel_stacks": {"distinct": self.stored.get("stacks", 0),
                                   "not_taken": int(c[R.C_KSTACK_LOST]) + self.kstacks.unreadable},
                 "thread_states_left": getattr(self, "thread_states_left", None),
                 "detach_s": round(self.detach_s, 3),
                 "snapshot_errors": self.sample_errors, "last_snapshot_error": self.last_sample_error,
                 **getattr(self, "unfinished", {})}
        self.writer.replace("sessions", {
            "source": ["collector"],
            **{k: [v] for k, v in self.host.items()},
            "cuda_runtime_version": [", ".join(versions) or None],
            "collector_version": [f"ingero-mcp {__version__}, bcc {self.bpf_version}"],
            "collector_flags": [json.dumps(flags)],
            "attached": [self.attached_json()],
            "started_ns": [self.started_ns or time.time_ns()],
            "stopped_ns": [self.stopped_ns],
            "notes": [json.dumps(notes)],
        })
        self.writer.replace("collector_stats", self._stats_table(c))
        self.writer.replace("table_coverage", self._coverage_table(c))
        if self.targets.threads_dirty:
            self.writer.replace("threads", self.targets.threads_table())
            self.targets.threads_dirty = False
        if self.targets.procs_dirty:
            self.writer.replace("processes", self.targets.procs_table())
            self.targets.procs_dirty = False

    # ---- live view support ----------------------------------------------------------------

    def op_summary(self) -> list[tuple[str, int, float | None, float | None, int | None, float | None, float | None]]:
        """Per op seen so far: (op, calls, ~p50 ns, ~p99 ns, max ns, off-CPU share, preempted share); the
        latency columns None for entry-only ops (their end is not seen).

        Percentiles come from log histograms (4 bins per octave), for the live view only.
        """
        out: list[tuple[str, int, float | None, float | None, int | None, float | None, float | None]] = []
        for i in np.nonzero(self.op_count)[0].tolist():
            hist = self.op_hist[i]
            cum = np.cumsum(hist)
            total = cum[-1]
            if not total:
                out.append((OP_NAMES[i], int(self.op_count[i]), None, None, None, None, None))
                continue
            p50 = 2 ** ((np.searchsorted(cum, 0.50 * total) + 0.5) / 4)
            p99 = 2 ** ((np.searchsorted(cum, 0.99 * total) + 0.5) / 4)
            mx = int(self.op_max[i])
            total = self.op_sums[0, i] or 1.0
            out.append((OP_NAMES[i], int(self.op_count[i]), min(float(p50), mx), min(float(p99), mx), mx,
                        self.op_sums[1, i] / total, self.op_sums[2, i] / total))
        return sorted(out, key=lambda r: -r[1])


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


_CGROUP_SCHEMA = pa.schema([
    ("ts_ns", pa.int64()), ("pid", pa.int32()), ("cgroup", pa.string()), ("own", pa.bool_()), ("quota_us", pa.int64()),
    ("period_us", pa.int64()), ("usage_usec", pa.int64()), ("nr_periods", pa.int64()), ("nr_throttled", pa.int64()),
    ("throttled_usec", pa.int64()),
])
_GPU_PROC_SCHEMA = pa.schema([
    ("ts_ns", pa.int64()), ("gpu_id", pa.int32()), ("pid", pa.int32()), ("used_memory_bytes", pa.int64()),
    ("sm_util_percent", pa.float64()),
])


def install_signal_handlers(tracer: Tracer) -> None:
    """SIGINT and SIGTERM end the recording cleanly (second SIGINT: Python's default)."""

    def handler(signum: int, _frame: object) -> None:
        tracer.request_stop(signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
