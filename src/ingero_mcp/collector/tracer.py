"""The collector: loads the eBPF program, attaches CUDA uprobes, drains the rings into the store.

Three threads. A drain thread reads the three ring buffers every ~20 ms (bulk mmap reads, no
per-event Python). A sampler thread takes a system snapshot each second (/proc, and NVML, whose
calls can block on a wedged GPU). The main thread, every second, converts what was drained into
Arrow batches, harvests the finished per-(pid, second) aggregate buckets, stores the snapshots,
rewrites the latest-state tables and flushes a store segment; every second or two it rescans /proc
for CUDA libraries and traced processes. SIGINT, SIGTERM, --duration and the exit of every traced
process all end the same way: probes detached, rings drained, everything written, the store folded
and closed.

The parts, each owning its state: targets.py (which processes and threads are traced), probes.py (the
libraries attached, launch probes, probe costs), drain.py (the rings and the kernel's aggregates), sink.py
(the store's rows). This module starts, runs and finishes one recording with them.
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

from ingero_mcp.collector import records as R
from ingero_mcp.collector import uprobelink
from ingero_mcp.collector.calibrate import ProbeCost
from ingero_mcp.collector.cgroups import CgroupSampler
from ingero_mcp.collector.discovery import CudaLibrary, alive, descendants, resolve_library, runtime_version
from ingero_mcp.collector.drain import (
    AGG_ENTRIES,
    BUCKET_NS,
    CUDA_RB_PAGES,
    DRAIN_FILL,
    MIN_POLL_S,
    PROC_RB_PAGES,
    SAMPLE_RB_PAGES,
    SCHED_RB_PAGES,
    Drain,
    FillSinceRead,
    drain_wait,
)
from ingero_mcp.collector.governor import Governor
from ingero_mcp.collector.kstacks import KernelStacks, bcc_symbolizer
from ingero_mcp.collector.ops import entry_functions_c
from ingero_mcp.collector.preflight import tracefs_dir
from ingero_mcp.collector.probes import ENDBR64, AttachedLibrary, Probes, bpf_prog_info, bpf_run_stats, probe_site
from ingero_mcp.collector.pyframes import PythonFrames
from ingero_mcp.collector.sampler import Nvml, SystemSampler, host_info
from ingero_mcp.collector.sink import OpRow, Sink, lost_counts
from ingero_mcp.collector.targets import Targets
from ingero_mcp.collector.ustacks import (
    DEFAULT_STACK_HZ,
    UserStacks,
    attach_sampler,
    detach_sampler,
    sample_cost_row,
)
from ingero_mcp.collector.usyms import UserSymbols

__all__ = [
    "AGG_ENTRIES", "CUDA_RB_PAGES", "DRAIN_FILL", "ENDBR64", "MIN_POLL_S", "PROC_RB_PAGES", "SAMPLE_RB_PAGES",
    "SCHED_RB_PAGES",
    "AttachedLibrary", "FillSinceRead", "TraceOptions", "Tracer", "bpf_prog_info", "bpf_run_stats",
    "clock_offset_ns", "collectors_dir", "drain_wait", "install_signal_handlers", "probe_site", "program_text",
]


def collectors_dir() -> Path:
    """`collectors/` in a source checkout, or the copy packed into the wheel."""
    repo = Path(__file__).resolve().parents[3] / "collectors"
    if (repo / "ingero.bpf.c").is_file():
        return repo
    return Path(str(resources.files("ingero_mcp") / "collectors"))


def program_text() -> str:
    """The eBPF program's C text: ingero.bpf.c with the Python walker's header in place of its #include line (text,
    not -I, so the compiled-program cache's key covers it), then the generated CUDA entry functions."""
    text = (collectors_dir() / "ingero.bpf.c").read_text().replace(
        '#include "pyframes.bpf.h"', (collectors_dir() / "pyframes.bpf.h").read_text(), 1)
    return text + "\n" + entry_functions_c()


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
    poll_interval_s: float = 0.25  # the longest the rings stay unread; sooner when they fill faster (Drain.loop)
    rescan_interval_s: float = 1.0
    bpf_cache: bool = True  # load the compiled eBPF program from ~/.cache/ingero-mcp/bpf (--no-bpf-cache)
    stack_hz: int = DEFAULT_STACK_HZ  # on-CPU samples of traced threads per second per CPU (--stack-hz; 0: none)
    # What stores a finished store's accounting when the segments are folded (`trace` passes the analysis's
    # store_derived; the collector itself knows nothing of the analysis); None: readers compute it.
    derive: Callable[[Any], object] | None = None
    # A finished copy of the recording so far, now and then, by a child process at nice 19, for readers that start
    # late (store/checkpoint.py; needs `derive`); --no-checkpoints
    checkpoints: bool = True


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
        self.sink = Sink(self.drain, self.targets)
        self.on_flush: Callable[[Tracer], None] | None = None
        self.started_ns = 0
        self.stopped_ns: int | None = None
        self.cpu_at_start_s = 0.0  # the collector's CPU seconds when recording began (start-up's share)
        self.detach_s = 0.0  # how long the stop's detach took
        self._wake = threading.Event()  # request_stop wakes the main loop
        self._drain_thread: threading.Thread | None = None
        self._sample_thread: threading.Thread | None = None
        self._sample_stop = threading.Event()
        self.sample_errors = 0
        self.last_sample_error: str | None = None
        self._finished = False
        self.governor: Governor | None = None
        self._governor_thread: threading.Thread | None = None
        self._governor_stop = threading.Event()

    # ---- the parts' state, under the names the live view and the benches read -------------

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

    @property
    def stored(self) -> dict[str, int]:
        """Rows stored so far, per table (Sink)."""
        return self.sink.stored

    @property
    def snapshot(self) -> dict[str, Any]:
        """The latest system snapshot stored (Sink)."""
        return self.sink.snapshot

    @property
    def counter_snapshot(self) -> np.ndarray:
        """The kernel's counters as of the last collector_stats rows (Sink)."""
        return self.sink.counter_snapshot

    def attach_library(self, lib: CudaLibrary, *, forced: bool = False) -> AttachedLibrary | None:
        """Probe every known symbol of one library file, once per file (Probes.attach_library)."""
        return self.probes.attach_library(lib, forced=forced)

    def layer_summary(self) -> str:
        """Which layer is probed for which traced process, for the live view (Probes.layer_summary)."""
        return self.probes.layer_summary()

    def attached_json(self) -> str:
        """What was attached where, and what was not, for the sessions row (Probes.attached_json)."""
        return self.probes.attached_json()

    def op_summary(self) -> list[OpRow]:
        """Per op seen so far: calls, ~p50, ~p99, max, off-CPU and preempted shares (OpStats.summary)."""
        return self.sink.ops.summary()

    def lost(self, c: np.ndarray | None = None) -> dict[str, int]:
        """Records lost per source so far (ring full, map full, call stack too deep)."""
        return lost_counts(self.drain.counters() if c is None else c)

    # ---- start ----------------------------------------------------------------------------

    def _compile(self) -> None:
        """Load the eBPF program (compiled, or from the cache) with the kernel's features; hand it to the parts."""
        from ingero_mcp.collector.bccload import import_bcc
        from ingero_mcp.collector.bpfcache import load_bpf

        bcc = import_bcc()
        root = tracefs_dir()
        events = root / "events" if root else Path("/sys/kernel/tracing/events")
        cflags = [
            f"-DCUDA_RB_PAGES={CUDA_RB_PAGES}",
            f"-DSCHED_RB_PAGES={SCHED_RB_PAGES}",
            f"-DPROC_RB_PAGES={PROC_RB_PAGES}",
            f"-DSAMPLE_RB_PAGES={SAMPLE_RB_PAGES}",
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
        text = program_text()
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
        self.ustacks = UserStacks(self.bpf["ustacks"], UserSymbols(), PythonFrames(self.bpf), self.opts.stack_hz)
        self.targets.on_traced = self.ustacks.add_process
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
        self.sampler_error = attach_sampler(self.bpf, self.opts.stack_hz)
        if self.sampler_error:
            self.ustacks.sample_hz = 0
            self._say(f"no on-CPU stack samples ({self.sampler_error}); stacks at switch-outs only")
        self.started_ns = time.time_ns()
        self.cpu_at_start_s = _cpu_seconds()  # compile/load, attach and calibration
        self.writer = TraceWriter(self.opts.db, live=True, derive=self.opts.derive,
                                  checkpoints=self.opts.checkpoints)
        self.sink.open(self.writer, self.offset_ns, self.kstacks, self.ustacks)
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
        self.sink.queue_samples(snap, gpu, cgroups)

    def _sample_loop(self) -> None:
        # Its own thread: an NVML call on a wedged GPU can block for seconds; flushes must not wait.
        while not self._sample_stop.wait(1.0):
            try:
                self._take_sample()
            except Exception as exc:  # noqa: BLE001 - one bad read must not end the snapshots
                self.sample_errors += 1
                self.last_sample_error = f"{type(exc).__name__}: {exc}"

    def _flush(self) -> None:
        self.sink.store_pending()
        self.sink.store_costs(self.probes, self.governor)
        self.sink.harvest()
        self.sink.store_snapshots()
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
        detach_sampler(self.bpf)

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
        self.writer.stop_checkpoints()  # its CPU counted in the session's notes, and no fold waits for one
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
        """Calls still in flight and threads still off-CPU at the stop, as rows (Sink.store_unfinished)."""
        now = (self.stopped_ns or time.time_ns()) - self.offset_ns  # the stop, on the kernel's clock
        self.sink.store_unfinished(self.bpf["tstate"], now)

    def _flush_final(self) -> None:
        self.sink.store_pending()
        self.sink.store_costs(self.probes, self.governor, final=True)
        if self.ustacks.sample_hz > 0:  # the sampler's cost per sample, known at the stop (analysis/cost.py)
            row = sample_cost_row(bpf_run_stats(self.bpf.funcs))
            self.sink.writer.append("probe_costs", {k: [v] for k, v in row.items()})
        self.sink.harvest(everything=True)
        self._sample_stop.set()
        if self._sample_thread is not None:
            self._sample_thread.join(timeout=10)
        self._take_sample()
        self.sink.store_snapshots()
        self._write_latest()

    # ---- latest-state tables --------------------------------------------------------------

    def _write_latest(self) -> None:
        """Replace the latest-state tables: the sessions row made here, the rest by the sink."""
        versions = sorted({v for rec in self.libs.values() if rec.lib.api == "runtime"
                           for v in [runtime_version(rec.lib.path)] if v})
        c = self.drain.counters()
        self.sink.write_latest(self._session(versions, c), c, self.sampler, self.cgroups)

    def _session(self, versions: list[str], c: np.ndarray) -> dict[str, list[Any]]:
        """The sessions row: the host, the flags, what was attached, and notes on how the recording went."""
        flags = {
            "argv": self.argv, "db": str(self.opts.db), "duration_s": self.opts.duration_s, "pids": self.opts.pids,
            "cuda_libs": self.opts.cuda_libs, "apis": list(self.opts.apis), "layer": self.opts.layer,
            "launch_probes": self.opts.launch_probes, "max_overhead_pct": self.opts.max_overhead_pct,
            "quiet": self.opts.quiet, "trace_all": self.trace_all,
            "flush_interval_s": self.opts.flush_interval_s, "bucket_ns": BUCKET_NS, "kernel_features": self.features,
            "clock_offset_ns": self.offset_ns, "stack_hz": self.opts.stack_hz,
        }
        from ingero_mcp import __version__

        checkpoints_cpu = self.writer.checkpoints_cpu_s  # the checkpoints' child processes: the collector's work
        notes = {"stop_reason": self._stop_reason, "unreturned_calls": int(c[R.C_CUDA_ORPHAN]),
                 "thread_state_map_full": int(c[R.C_TSTATE_FULL]), "nvml": self.nvml.error or "ok",
                 "collector_cpu_s": round(_cpu_seconds() + checkpoints_cpu, 3),
                 "collector_cpu_recording_s": round(_cpu_seconds() + checkpoints_cpu - self.cpu_at_start_s, 3),
                 "bpf_program": getattr(self, "bpf_status", None),
                 "bpf_run_stats": bpf_run_stats(self.bpf.funcs),
                 "cuda_ring_full": int(c[R.C_CUDA_DROP]), "cuda_stack_too_deep": int(c[R.C_CUDA_DEPTH]),
                 "wakeups_seen": int(c[R.C_WAKEUP_SEEN]), "wakeups_from_interrupts": int(c[R.C_WAKE_IRQ]),
                 # switch-outs whose kernel stack was not taken (its slot in the stack map held another stack):
                 # their kstack_id is NULL; the interval itself is stored
                 "kernel_stacks": {"distinct": self.kstacks.distinct,
                                   "not_taken": int(c[R.C_KSTACK_LOST]) + self.kstacks.unreadable},
                 # user stacks not stored (a hash collision in the stack map) or not symbolised: ustack_id NULL
                 "user_stacks": {"distinct": self.ustacks.distinct, "not_taken": int(c[R.C_USTACK_LOST])
                                 + self.ustacks.unreadable},
                 "stack_samples": {"hz": self.ustacks.sample_hz, "error": getattr(self, "sampler_error", None),
                                   "seen": int(c[R.C_SAMPLE_SEEN]), "ring_full": int(c[R.C_SAMPLE_DROP])},
                 "thread_states_left": self.sink.thread_states_left,
                 "detach_s": round(self.detach_s, 3),
                 "snapshot_errors": self.sample_errors, "last_snapshot_error": self.last_sample_error,
                 **self.sink.unfinished}
        return {
            "source": ["collector"],
            **{k: [v] for k, v in self.host.items()},
            "cuda_runtime_version": [", ".join(versions) or None],
            "collector_version": [f"ingero-mcp {__version__}, bcc {self.bpf_version}"],
            "collector_flags": [json.dumps(flags)],
            "attached": [self.attached_json()],
            "started_ns": [self.started_ns or time.time_ns()],
            "stopped_ns": [self.stopped_ns],
            "notes": [json.dumps(notes)],
        }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def install_signal_handlers(tracer: Tracer) -> None:
    """SIGINT and SIGTERM end the recording cleanly (second SIGINT: Python's default)."""

    def handler(signum: int, _frame: object) -> None:
        tracer.request_stop(signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
