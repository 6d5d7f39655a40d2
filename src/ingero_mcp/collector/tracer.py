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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa

from ingero_mcp.collector import records as R
from ingero_mcp.collector import uprobelink
from ingero_mcp.collector.cgroups import CgroupSampler
from ingero_mcp.collector.calibrate import (
    CALIBRATION_CALLS,
    Calibrator,
    ProbeCost,
    calibrated,
    defaults,
    describe_site,
    page_calibrated,
    page_unmeasured,
    sched_calibrated,
    sched_unmeasured,
)
from ingero_mcp.collector.discovery import (
    DRIVER_LAYER,
    RUNTIME_LAYER,
    CudaLibrary,
    alive,
    auto_layer,
    descendants,
    resolve_library,
    runtime_version,
    scan_cuda_libraries,
)
from ingero_mcp.collector.governor import Governor
from ingero_mcp.collector.kstacks import KernelStacks, bcc_symbolizer
from ingero_mcp.collector.ops import AUTO_RUNTIME_OPS, OP_NAMES, OPS, Op, entry_functions_c, ops_for
from ingero_mcp.collector.preflight import tracefs_dir
from ingero_mcp.collector.ringbuf import RingReader
from ingero_mcp.collector.sampler import Nvml, SystemSampler, host_info
from ingero_mcp.collector.targets import Targets

CUDA_RB_PAGES = 16384  # 64 MiB: ~760k call records, >2 s of headroom at 300k calls/s
SCHED_RB_PAGES = 4096  # 16 MiB
PROC_RB_PAGES = 256  # 1 MiB
# Keys (pid, tid, cpu, second) for sched_switch, (pid, second) for mm_page_alloc; up to ~3 seconds
# live before a harvest. A 16-CPU host with 4,000 threads running each second, each on ~2 CPUs:
# ~24k switch keys a second, ~72k live; drops are counted (collector_stats 'sched_switch' lost).
AGG_ENTRIES = 131072
BUCKET_NS = 1_000_000_000
PAGE_TRACEPOINT = b"kmem:mm_page_alloc"  # taken off and put back once at start, to measure its cost per page
DRAIN_NICE = -10  # the ring reader's nice value (its thread only)
# The reader sleeps so that, at the rate it last saw, the fullest ring is at most DRAIN_FILL full when it wakes
# (never less than MIN_POLL_S, never more than --poll-interval). Few wake-ups, because they may cost the job
# too: on the H200 the training loop's blocks ran +6.7 % with this reader and +19.5 % with a 20 ms one in the
# same call (bench/README.md; one call, not conclusive), and a process waking every 20 ms, no eBPF, slowed
# them by 18 % in one set and not at all in another.
DRAIN_FILL = 0.25
MIN_POLL_S = 0.01
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


@dataclass
class AttachedLibrary:
    """What was attached in one library file, and what could not be."""

    lib: CudaLibrary
    attached: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    optional_missing: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    forced: bool = False
    skipped: bool = False  # its API was left out by --api
    entry_only: list[str] = field(default_factory=list)  # attached without a return probe (launches)
    sites: dict[str, str] = field(default_factory=dict)  # symbol -> first instruction at the probe site (+ offset)
    runtime_layer: str | None = None  # --api auto: why this libcudart's own symbols are probed too (no libcuda beneath)
    offsets: dict[str, int] = field(default_factory=dict)  # symbol -> its file offset, for aliases found later

    @property
    def probes_driver(self) -> bool:
        """A libcuda whose symbols are probed (not left out by --api, some attached)."""
        return self.lib.api == "driver" and not self.skipped and bool(self.attached)

    def as_dict(self) -> dict[str, Any]:
        """JSON form for the sessions row."""
        return {
            "path": self.lib.path,
            "attach_path": self.lib.attach_path,
            "api": self.lib.api,
            "pids": sorted(self.lib.pids)[:64],
            "forced": self.forced,
            "skipped_by_api_option": self.skipped,
            "attached": self.attached,
            "not_attached": self.missing,
            "optional_not_present": self.optional_missing,
            "errors": self.errors,
            "entry_only": self.entry_only,
            "probe_sites": self.sites,
            "runtime_layer_because": self.runtime_layer,
        }


class Tracer:
    """One recording: from compiling the eBPF program to the folded store."""

    def __init__(self, opts: TraceOptions, *, log: TextIO | None = None, argv: list[str] | None = None) -> None:
        self.opts = opts
        self.log = log or sys.stderr
        self.argv = argv or []
        self.trace_all = not opts.pids
        self._stop_reason: str | None = None
        self.targets = Targets(self.trace_all)
        self.libs: dict[tuple[int, int], AttachedLibrary] = {}
        self.cuda_only_pids: set[int] = set()  # libcuda mapped without libcudart: static runtime?
        self.layers: dict[int, tuple[str, str]] = {}  # pid -> (layer probed for it, why), as of the last scan
        self.mixed_runtimes: dict[tuple[int, int], str] = {}  # libcudart -> note on processes not on its layer
        self.pending: dict[str, list[np.ndarray]] = {"cuda": [], "sched": [], "proc": []}
        self.stored: dict[str, int] = {"cuda_calls": 0, "sched_intervals": 0, "process_events": 0,
                                       "host_aggregates": 0, "snapshots": 0}
        self.aggregated = {1: 0, 2: 0}
        self.op_hist = np.zeros((len(OPS), HIST_BINS), np.int64)
        self.op_count = np.zeros(len(OPS), np.int64)
        self.op_max = np.zeros(len(OPS), np.int64)
        self.op_sums = np.zeros((3, len(OPS)), np.float64)  # duration, off-CPU, preempted (live view)
        self.on_flush: Callable[[Tracer], None] | None = None
        self.started_ns = 0
        self.stopped_ns: int | None = None
        self.last_record_ktime = 0  # the latest end of a CUDA call or off-CPU interval drained (kernel clock)
        self.cpu_at_start_s = 0.0  # the collector's CPU seconds when recording began (start-up's share)
        self.detach_s = 0.0  # how long the stop's detach took
        self.snapshot: dict[str, Any] = {}
        self._drain_lock = threading.Lock()
        self._drain_stop = threading.Event()
        self._filled = FillSinceRead()  # what the rings received between two of the reader's reads
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
        # the always-on cost (issue 10): probe costs, the launch probe sites the governor attaches and detaches
        self.costs: dict[str, ProbeCost] = defaults("not measured yet")
        self.costs_final = False
        self.sched_cost: ProbeCost = sched_unmeasured("not measured yet")
        self.page_cost: ProbeCost = page_unmeasured("not measured yet")
        self.traced_pages = 0  # page allocations of traced processes harvested so far
        self._costs_written = False
        self.calibration_pids: set[int] = set()
        self.calibration_rows = {"cuda": 0, "sched": 0, "proc": 0}
        self.launch_sites: list[tuple[str, bytes, int]] = []  # (fn_name, path, file offset)
        self._attach_lock = threading.RLock()
        self.launch_on = True  # the launch probes are attached (the governor's windows); under _attach_lock
        self.uprobe_links: dict[bytes, int] = {}  # uprobe event name -> BPF link fd, where uprobes are links
        self.link_uprobes = False  # uprobes as uprobe_multi links (uprobelink.py), decided in _compile
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
        self.link_uprobes, why_not = ((False, "INGERO_UPROBE_LINKS=0") if os.environ.get("INGERO_UPROBE_LINKS") == "0"
                                      else uprobelink.supported())
        if self.link_uprobes:
            self.features.append("UPROBE_LINKS")
        else:
            self._say(f"uprobes as perf events ({why_not}): each detach waits its turn (~0.1 s)")
        self.bpf["config"][self.bpf["config"].Key(0)] = self.bpf["config"].Leaf(1 if self.trace_all else 0)
        # every tracepoint is attached now: interrupt entries may count (their exits are there)
        self.bpf["config"][self.bpf["config"].Key(1)] = self.bpf["config"].Leaf(1)
        self.targets.traced_map = self.bpf["traced"]
        self.kstacks = KernelStacks(self.bpf["kstacks"], bcc_symbolizer())
        self.agg = self.bpf["agg"]
        self.counters = self.bpf["counters"]
        self.rings = {
            "cuda": RingReader(self.bpf["cuda_events"].map_fd, CUDA_RB_PAGES * 4096, R.CUDA_DTYPE),
            "sched": RingReader(self.bpf["sched_events"].map_fd, SCHED_RB_PAGES * 4096, R.SCHED_DTYPE),
            "proc": RingReader(self.bpf["proc_events"].map_fd, PROC_RB_PAGES * 4096, R.PROC_DTYPE),
        }

    def _say(self, message: str) -> None:
        print(f"ingero-mcp trace: {message}", file=self.log, flush=True)

    def attach_library(self, lib: CudaLibrary, *, forced: bool = False) -> AttachedLibrary | None:
        """Probe every known symbol of one library file (once per file): launches entry-only (by default),
        every other call entry + return; with --api auto a runtime library only for the calls that do not
        enter the driver's exported symbols (one layer per logical call)."""
        known = self.libs.get(lib.key)
        if known is not None:
            known.lib.pids |= lib.pids
            return None
        rec = AttachedLibrary(lib, forced=forced)
        self.libs[lib.key] = rec
        if lib.api not in self.opts.apis:
            rec.skipped = True
            self._say(f"not attached {lib.path} ({lib.api} API left out by --api {','.join(self.opts.apis)})")
            return rec
        if lib.api == "driver" and not self.costs_final:
            self._calibrate(lib)  # before its probes exist: the calibration process must trap on its own only
        ops = ops_for(lib.api, self.opts.layer)
        self._attach_ops(rec, ops)
        optional = {op.name for op in ops if op.optional}
        required = len([op for op in ops if not op.optional])
        got = len([n for n in rec.attached if n not in optional])
        missing = f"; not attached: {', '.join(rec.missing)}" if rec.missing else ""
        eo = f", {len(rec.entry_only)} launch symbols entry-only" if rec.entry_only else ""
        self._say(f"attached {lib.path} ({lib.api}: {got}/{required} symbols, {len(rec.attached)} attached in all{eo})"
                  f"{missing}")
        return rec

    def _attach_ops(self, rec: AttachedLibrary, ops: tuple[Op, ...]) -> None:
        """Probe `ops` in one library file: launches entry-only (by default), every other call entry + return."""
        offsets = {site: name for name, site in rec.offsets.items()}
        for op in ops:
            try:
                path, offset = self.bpf._check_path_symbol(rec.lib.attach_path.encode(), op.name.encode(), None, -1)
            except Exception as exc:  # noqa: BLE001 - BCC raises bare Exception for a missing symbol
                (rec.optional_missing if op.optional else rec.missing).append(op.name)
                if "could not determine address" not in str(exc):
                    rec.errors[op.name] = str(exc)
                continue
            if offset in offsets:
                # Two exported names at one address would fire twice per call: attach the first only.
                rec.errors[op.name] = f"alias of {offsets[offset]} (same address): not attached twice"
                continue
            offsets[offset] = op.name
            rec.offsets[op.name] = offset
            skip, rec.sites[op.name] = probe_site(path, offset)
            addr = offset + skip
            entry_only = op.launch and self.opts.launch_probes == "entry"
            try:
                with self._attach_lock:
                    if entry_only:
                        self.launch_sites.append((op.entry_only_fn_name, path, addr))
                        if self.launch_on:
                            self._uprobe(op.entry_only_fn_name, path, addr)
                    else:
                        ev = self._uprobe(op.fn_name, path, addr)
                        try:
                            self._uprobe("on_return", path, addr, ret=True)
                        except Exception:
                            self._detach_uprobe(ev)
                            raise
            except Exception as exc:  # noqa: BLE001 - one symbol failing must not stop the others
                rec.errors[op.name] = str(exc)
                rec.missing.append(op.name)
                continue
            rec.attached.append(op.name)
            if entry_only:
                rec.entry_only.append(op.name)

    def _uprobe(self, fn_name: str, path: bytes, addr: int, *, ret: bool = False, pid: int = -1) -> bytes:
        """Attach one eBPF function at a file offset (resolved once: BCC would re-read the ELF each time)."""
        import bcc  # type: ignore[import-not-found]  # loaded by _compile

        ev = self.bpf._get_uprobe_evname(b"r" if ret else b"p", path, addr, pid)
        what = f"cannot attach {'uretprobe' if ret else 'uprobe'} {fn_name} at {path.decode()}+{addr:#x}"
        if self.link_uprobes:
            fn = self.bpf.load_func(fn_name.encode(), bcc.BPF.KPROBE, attach_type=uprobelink.BPF_TRACE_UPROBE_MULTI)
            try:
                self.uprobe_links[ev] = uprobelink.link_uprobe(fn.fd, path, addr, ret=ret, pid=pid)
            except OSError as exc:
                raise OSError(f"{what}: {exc.strerror}") from exc
            return ev
        fn = self.bpf.load_func(fn_name.encode(), bcc.BPF.KPROBE)
        fd = bcc.lib.bpf_attach_uprobe(fn.fd, 1 if ret else 0, ev, path, addr, pid)
        if fd < 0:
            raise OSError(what)
        self.bpf._add_uprobe_fd(ev, fd)
        return ev

    def _uprobe_attached(self, ev: bytes) -> bool:
        return ev in self.uprobe_links or ev in self.bpf.uprobe_fds

    def _detach_uprobe(self, ev: bytes) -> None:
        """Detach what _uprobe attached: close its link, or BCC's perf event and tracefs event."""
        fd = self.uprobe_links.pop(ev, None)
        if fd is not None:
            os.close(fd)
        else:
            self.bpf.detach_uprobe_event(ev)

    def _toggle_launch(self, on: bool) -> None:
        """Attach (True) or detach (False) every launch probe: the governor's windows."""
        with self._attach_lock:
            self.launch_on = on
            for fn_name, path, addr in self.launch_sites:
                ev = self.bpf._get_uprobe_evname(b"p", path, addr, -1)
                try:
                    if on and not self._uprobe_attached(ev):
                        self._uprobe(fn_name, path, addr)
                    elif not on and self._uprobe_attached(ev):
                        self._detach_uprobe(ev)
                except Exception as exc:  # noqa: BLE001 - say it; the gap rows stay true (detached is detached)
                    self._say(f"launch probe {fn_name} at {path.decode()}+{addr:#x}: {exc}")

    def _calibrate(self, lib: CudaLibrary) -> None:
        """Measure what one entry-only and one entry + return hit cost here (calibrate.py), before attaching."""
        self.costs_final = True
        if not self.opts.calibrate:
            self.costs = defaults("--no-calibrate")
            return
        try:
            cal = Calibrator(lib.attach_path)
        except Exception as exc:  # noqa: BLE001 - the estimate falls back to the defaults, and says so
            self.costs = defaults(f"calibration could not start: {exc}")
            self._say(f"probe costs not measured ({exc}); the estimate uses defaults")
            return
        self.calibration_pids.add(cal.pid)
        self.traced_map[self.traced_map.Key(cal.pid)] = self.traced_map.Leaf(1)
        costs = defaults("not measured")
        try:
            for symbol, probe, nargs in CALIBRATION_CALLS:
                op = next(o for o in OPS if o.name == symbol)
                path, offset = self.bpf._check_path_symbol(lib.attach_path.encode(), symbol.encode(), None, -1)
                skip, site = probe_site(path, offset)
                evs: list[bytes] = []

                def attach(op: Op = op, path: bytes = path, addr: int = offset + skip, probe: str = probe,
                           evs: list[bytes] = evs) -> None:
                    fn = op.entry_only_fn_name if probe == "entry" else op.fn_name
                    evs.append(self._uprobe(fn, path, addr, pid=cal.pid))
                    if probe == "entry_return":
                        evs.append(self._uprobe("on_return", path, addr, ret=True, pid=cal.pid))

                def detach(evs: list[bytes] = evs) -> None:
                    while evs:
                        self._detach_uprobe(evs.pop())

                cost, calls = cal.measure(symbol, nargs, attach, detach)
                costs[probe] = calibrated(probe, cost, calls, symbol, os.path.basename(lib.path), site)
        except Exception as exc:  # noqa: BLE001
            self._say(f"probe cost calibration failed ({type(exc).__name__}: {exc}); the estimate uses defaults")
            costs = defaults(f"calibration failed: {exc}")
        finally:
            cal.close()
            try:
                del self.traced_map[self.traced_map.Key(cal.pid)]
            except KeyError:
                pass
        self.costs = costs
        if self.governor is not None:
            self.governor.costs = costs
        self._say(f"probe cost here: entry-only {costs['entry'].cost_ns:.0f} ns, entry + return "
                  f"{costs['entry_return'].cost_ns:.0f} ns per call ({costs['entry'].method.split(':')[0]})")

    def _calibrate_sched(self) -> None:
        """Measure what the scheduler tracepoints add to one off-CPU interval of a traced thread, and what the
        page-allocation tracepoint adds to each page it allocates (calibrate.py): tracing a thread costs it at every
        switch and page, beside its CUDA probes' hits."""
        if not self.opts.calibrate:
            self.sched_cost, self.page_cost = sched_unmeasured("--no-calibrate"), page_unmeasured("--no-calibrate")
            return
        try:
            cal = Calibrator()
        except Exception as exc:  # noqa: BLE001 - the estimate then says unknown
            why = f"calibration could not start: {exc}"
            self.sched_cost, self.page_cost = sched_unmeasured(why), page_unmeasured(why)
            return
        self.calibration_pids.add(cal.pid)
        key = self.traced_map.Key(cal.pid)

        def trace() -> None:
            self.traced_map[key] = self.traced_map.Leaf(1)

        def untrace() -> None:
            del self.traced_map[key]

        try:
            self.sched_cost = sched_calibrated(cal.measure_sched(trace, untrace))
        except Exception as exc:  # noqa: BLE001
            self.sched_cost = sched_unmeasured(f"calibration failed: {type(exc).__name__}: {exc}")
        try:
            trace()
            self.page_cost = page_calibrated(cal.measure_pages(self._page_tracepoint_off, self._page_tracepoint_on))
        except Exception as exc:  # noqa: BLE001
            self.page_cost = page_unmeasured(f"calibration failed: {type(exc).__name__}: {exc}")
        finally:
            cal.close()
            self.traced_map.pop(key, None)
        if PAGE_TRACEPOINT not in self.bpf.tracepoint_fds:  # never record without it
            self._page_tracepoint_on()
        for what, per, c in (("scheduler records", "off-CPU interval", self.sched_cost),
                             ("page allocations", "page allocated", self.page_cost)):
            self._say(f"{what} cost here: {'not measured' if c.cost_ns is None else f'{c.cost_ns:.0f} ns'} per {per} "
                      f"by a traced thread ({c.method.split(':')[0].split(' (')[0]})")

    def _page_tracepoint_off(self) -> None:
        self.bpf.detach_tracepoint(PAGE_TRACEPOINT)

    def _page_tracepoint_on(self) -> None:
        self.bpf.attach_tracepoint(tp=PAGE_TRACEPOINT, fn_name=b"tracepoint__kmem__mm_page_alloc")

    def _discover(self) -> None:
        """Attach libraries mapped by the processes we trace (all processes without --pid)."""
        if self.trace_all:
            found = scan_cuda_libraries()
        else:
            found = scan_cuda_libraries(sorted(self.targets.live_targets))
        per_pid: dict[int, set[str]] = {}
        for lib in found:
            lib.pids.discard(os.getpid())  # never trace the collector itself
            lib.pids -= self.calibration_pids
            self.attach_library(lib)
            for pid in lib.pids:
                per_pid.setdefault(pid, set()).add(lib.api)
        if self.trace_all:
            new = [pid for pid in per_pid if pid not in self.procs or not self.procs[pid]["traced"]]
            # a CUDA process found now may already have children (DataLoader workers): follow them too
            for pid in sorted(descendants(new)) if new else []:
                if pid not in self.procs or not self.procs[pid]["traced"]:
                    self.targets.trace(pid, target=False)
        for pid, apis in per_pid.items():
            if apis == {"driver"}:
                self.cuda_only_pids.add(pid)
            else:
                self.cuda_only_pids.discard(pid)
        self._runtime_layers(found)

    def _runtime_layers(self, found: list[CudaLibrary]) -> None:
        """--api auto never records silence: a libcudart whose processes have no probed libcuda beneath them (a runtime
        that loads none, a driver not found or not attached) gets the rest of its symbols, and says so. One whose file
        other processes use through a probed libcuda stays on the driver layer (probing it would count their calls
        twice), and that is said too. Each scanned process's layer is kept for the live view and the session."""
        def probed(lib: CudaLibrary) -> bool:
            rec = self.libs.get(lib.key)
            return rec is None or rec.probes_driver  # one not attached yet is attached at the next scan

        runtimes: dict[int, list[CudaLibrary]] = {}
        driven: set[int] = set()
        for lib in found:
            for pid in lib.pids:
                if lib.api == "runtime":
                    runtimes.setdefault(pid, []).append(lib)
                elif self.libs[lib.key].probes_driver:
                    driven.add(pid)
        if self.opts.layer != "auto":
            chosen = "both" if len(self.opts.apis) == 2 else self.opts.apis[0]
            for pid in {*runtimes, *driven}:
                self.layers[pid] = (chosen, f"--api {chosen}")
            return
        for pid in {*runtimes, *driven}:
            self.layers[pid] = auto_layer(pid, runtimes.get(pid, []), pid in driven, probed)
        for lib in found:
            rec = self.libs[lib.key]
            if lib.api != "runtime" or rec.skipped:
                continue
            if rec.runtime_layer is not None:  # probed whole already: who else maps it now gets both layers
                for pid in lib.pids:
                    self.layers[pid] = (RUNTIME_LAYER, rec.runtime_layer) if self.layers[pid][0] != DRIVER_LAYER else (
                        "both", f"{lib.path}'s own symbols are probed for other processes too (--api auto: "
                        f"{rec.runtime_layer})")
                both = sorted(pid for pid in lib.pids if self.layers[pid][0] == "both")
                note = (f"pids {both[:16]} map {lib.path}, whose own symbols are probed, through a probed libcuda "
                        "too: their calls are recorded on both layers, as with --api both")
                if both and self.mixed_runtimes.get(lib.key) != note:
                    self.mixed_runtimes[lib.key] = note
                    self._say(note)
                continue
            silent = sorted(pid for pid in lib.pids if self.layers[pid][0] == RUNTIME_LAYER)
            if not silent:
                continue
            why = self.layers[silent[0]][1]
            others = sorted(pid for pid in lib.pids if self.layers[pid][0] == DRIVER_LAYER)
            if others:
                note = (f"pids {silent[:16]} map {lib.path} with no probed libcuda beneath it ({why}), but pids "
                        f"{others[:16]} use the same file through a probed libcuda: it stays on the driver layer (its "
                        "runtime symbols would count their calls twice); --api both records both layers")
                if self.mixed_runtimes.get(lib.key) != note:
                    self.mixed_runtimes[lib.key] = note
                    self._say(note)
                continue
            rec.runtime_layer = f"{why} (pids {', '.join(map(str, silent[:16]))})"
            more = tuple(op for op in ops_for("runtime", "both") if op.name not in AUTO_RUNTIME_OPS)
            before = len(rec.attached)
            self._attach_ops(rec, more)
            self._say(f"runtime layer probed for pids {', '.join(map(str, silent[:16]))}: {lib.path} has no probed "
                      f"libcuda beneath it ({why}); --api auto attached {len(rec.attached) - before} more of its "
                      f"symbols, {len(rec.attached)} in all")
            for pid in silent:
                self.layers[pid] = (RUNTIME_LAYER, why)

    def layer_summary(self) -> str:
        """Which layer is probed for which traced process, for the live view: 'driver layer: pids 12, 14; ...'."""
        by_layer: dict[str, list[int]] = {}
        for pid, (layer, _why) in sorted(self.layers.items()):
            rec = self.procs.get(pid)
            if rec is not None and rec["traced"]:
                by_layer.setdefault(layer, []).append(pid)
        return "; ".join(f"{layer} layer: pid{'s' if len(p) > 1 else ''} {', '.join(map(str, p[:12]))}"
                         + (f" +{len(p) - 12} more" if len(p) > 12 else "") for layer, p in by_layer.items())

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
        self.governor = Governor(self.costs, share, self._toggle_launch, windowed=self.opts.launch_probes == "entry",
                                 offset_ns=self.offset_ns, say=self._say, refresh=self._drain)
        self._calibrate_sched()
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

    def _drain(self) -> float:
        """Read every ring; returns the largest share of a ring that this read emptied."""
        fill = 0.0
        with self._drain_lock:
            for name, ring in self.rings.items():
                batch = ring.read()
                share = len(batch) * ring.record / ring.size
                fill = max(fill, share)
                self._filled.add(name, share)
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

    def _drain_loop(self) -> None:
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
        while not self._drain_stop.wait(wait):
            self._drain()
            with self._drain_lock:
                fill = self._filled.take()  # the governor's reads meanwhile included: the rings' rate, not this read's
            now = time.monotonic()
            wait, last = drain_wait(fill, now - last, self.opts.poll_interval_s), now

    def _take_sample(self) -> None:
        snap = self.sampler.sample()
        gpu = self.nvml.processes(snap["ts_ns"])
        cgroups = self.cgroups.sample(snap["ts_ns"], self.targets.traced_alive())
        with self._drain_lock:
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
        with self._drain_lock:
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

    def _take_pending(self) -> dict[str, list[np.ndarray]]:
        with self._drain_lock:
            taken = self.pending
            self.pending = {"cuda": [], "sched": [], "proc": []}
        return taken

    def _counters(self) -> np.ndarray:
        out = np.zeros(R.N_COUNTERS, np.int64)
        for i in range(R.N_COUNTERS):
            out[i] = sum(self.counters[self.counters.Key(i)])
        return out

    def _harvest(self, *, everything: bool = False) -> None:
        """Move finished (pid, second) buckets from the kernel map to host_aggregates."""
        cutoff = (time.monotonic_ns() // BUCKET_NS) - 1
        rows: dict[str, list[Any]] = {k: [] for k in ("bucket_start_ns", "pid", "tid", "cpu", "comm", "source", "op", "count",
                                                      "sum_bytes", "sum_duration_ns")}
        done = []
        for key, val in self.agg.items_lookup_batch():
            if not everything and key.sec >= cutoff:
                continue
            done.append(key)
            source, op = R.AGG_KINDS.get(key.kind, ("?", "?"))
            rows["bucket_start_ns"].append(key.sec * BUCKET_NS + self.offset_ns)
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
            if key.kind == 2 and self.targets.is_traced(key.pid):
                self.traced_pages += val.count  # the live view's page-allocation estimate (explain: host_aggregates)
        if not done:
            return
        keys = (self.agg.Key * len(done))(*done)
        try:
            self.agg.items_delete_batch(keys)
        except Exception:  # noqa: BLE001 - kernels without batch ops
            for key in done:
                del self.agg[key]
        table = pa.table({**rows, "bucket_ns": [BUCKET_NS] * len(done), "stored": [0] * len(done)},
                         schema=_AGG_SCHEMA)
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
        taken = self._take_pending()
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
        if (self.costs_final or final) and not self._costs_written:
            costs = self.costs if self.costs_final else defaults("not measured: no libcuda was attached")
            rows = [c.row() for c in [*costs.values(), self.sched_cost, self.page_cost]]
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
        self._drain_thread = threading.Thread(target=self._drain_loop, name="ring-drain", daemon=True)
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
        """Every probe and tracepoint at once. A probe stops firing when its detach begins, then the detach
        waits out grace periods, which the kernel serialises for perf events (~4 s for all on the VM; ~0.6 s with
        the uprobes as links, the tracepoints' perf events left). One after another, the
        CUDA probes went quiet seconds before the scheduler's, and the trace's end looked like a thread
        running outside CUDA calls; begun together, they all stop at the same moment."""
        def detach(probe: tuple[str, Any]) -> None:
            kind, name = probe
            try:
                if kind == "uprobe":
                    self._detach_uprobe(name)
                else:
                    self.bpf.detach_tracepoint(name)
            except Exception:  # noqa: BLE001 - keep detaching the rest
                pass

        with self._attach_lock:
            probes = [("uprobe", ev) for ev in [*self.uprobe_links, *self.bpf.uprobe_fds]]
            probes += [("tracepoint", tp) for tp in list(self.bpf.tracepoint_fds)]
            if probes:
                with ThreadPoolExecutor(max_workers=min(64, len(probes)), thread_name_prefix="detach") as pool:
                    list(pool.map(detach, probes))

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
        self._drain_stop.set()
        if self._drain_thread is not None:
            self._drain_thread.join()
        self._drain()
        self.stopped_ns = max(detach_ns, self.last_record_ktime + self.offset_ns)
        self._record_unfinished()
        self._flush_final()
        lost = self.lost()
        self.writer.close()
        for ring in self.rings.values():
            ring.close()
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
        calls: list[tuple[int, ...]] = []
        intervals: dict[str, list[Any]] = {f.name: [] for f in _OPEN_INTERVAL_SCHEMA}
        states = 0
        for key, st in self.bpf["tstate"].items():
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
                row = {
                    "pid": st.tgid, "tid": key.value, "off_ns": st.off_ts + self.offset_ns, "off_cpu_ns": now - st.off_ts,
                    "prev_state": R.STATES[st.off_state] if st.off_state < len(R.STATES) else None,
                    "preemptor_pid": None if new else st.preemptor_pid,
                    "preemptor_tid": None if new else st.preemptor_tid,
                    "preemptor_comm": None if new else bytes(st.preemptor_comm).rstrip(b"\0").decode("utf-8", "replace"),
                    "cpu": st.cpu,
                    "wakeup_ns": st.wake_ts + self.offset_ns if (woke or new) else None,
                    "sleep_ns": off_blk, "cpu_wait_ns": off_pre,
                    "waker_pid": st.waker_pid if (woke or new) else None,
                    "waker_tid": st.waker_tid if (woke or new) else None,
                    "waker_comm": bytes(st.waker_comm).rstrip(b"\0").decode("utf-8", "replace") if (woke or new) else None,
                    "waker_context": R.WAKER_CONTEXTS[st.waker_ctx] if (woke or new) and st.waker_ctx < 4 else None,
                    "syscall": R.syscall_names(np.array([st.syscall]))[0].as_py(),
                    "kstack_id": None if new else self.kstacks.one(st.kstack),
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
            self.writer.append("sched_intervals", pa.table(intervals, schema=_OPEN_INTERVAL_SCHEMA))
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
        c = self._counters() if c is None else c
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
        rows = [
            ("cuda_calls", int(c[R.C_CUDA_SEEN] + c[R.C_CUDA_DEPTH]) + unfinished.get("calls_in_flight", 0)
             - self.calibration_rows["cuda"], self.stored["cuda_calls"], lost["cuda_calls"], 0),
            ("sched_intervals", int(c[R.C_SCHED_SEEN]) + unfinished.get("threads_off_cpu", 0) - self.calibration_rows["sched"],
             self.stored["sched_intervals"], lost["sched_intervals"], 0),
            ("process_events", int(c[R.C_PROC_SEEN]) - self.calibration_rows["proc"], self.stored["process_events"],
             lost["process_events"], 0),
            ("sched_switch", int(c[R.C_SWITCH_TOTAL]), 0, lost["sched_switch"], self.aggregated.get(1, 0)),
            ("mm_page_alloc", int(c[R.C_PAGE_TOTAL]), 0, lost["mm_page_alloc"], self.aggregated.get(2, 0)),
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

    def attached_json(self) -> str:
        """What was attached where, and what was not, for the sessions row."""
        libs = [rec.as_dict() for rec in self.libs.values()]
        static = sorted(self.cuda_only_pids)
        notes = []
        if static:
            notes.append(f"pids {static[:16]} map libcuda but no libcudart: driver-only users (a monitoring tool, "
                         "a runtime linked statically or loaded from elsewhere): only their driver API calls are "
                         "recorded, a static runtime is invisible to uprobes")
        if not any(rec.lib.api == "runtime" and not rec.skipped for rec in self.libs.values()):
            notes.append("no libcudart attached: runtime API calls not recorded")
        if not any(rec.lib.api == "driver" and not rec.skipped for rec in self.libs.values()):
            notes.append("no libcuda attached: driver API calls not recorded")
        for rec in self.libs.values():
            if rec.runtime_layer is not None:
                notes.append(f"--api auto probes the runtime layer of {rec.lib.path}: no probed libcuda beneath it "
                             f"({rec.runtime_layer})")
        notes += self.mixed_runtimes.values()
        layers = {str(pid): {"layer": layer, "why": why} for pid, (layer, why) in sorted(self.layers.items())[:256]}
        return json.dumps({"libraries": libs, "static_cudart_pids": static, "layers": layers, "notes": notes})

    def _write_latest(self) -> None:
        versions = sorted({v for rec in self.libs.values() if rec.lib.api == "runtime"
                           for v in [runtime_version(rec.lib.path)] if v})
        c = self._counters()
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


ENDBR64 = b"\xf3\x0f\x1e\xfa"


def probe_site(path: bytes, offset: int) -> tuple[int, str]:
    """(bytes to skip, description) of a probe site: a leading endbr64 is skipped (the kernel single-steps an
    instruction it cannot emulate, ~3x the cost of an emulated `push`); the probe then sits on the next one.
    The arguments and stack are the same there: endbr64 changes neither."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            head = f.read(16)
    except OSError:
        return 0, "unread"
    if head[:4] == ENDBR64:
        return 4, f"endbr64 skipped, probe on {describe_site(head[4:])}"
    return 0, describe_site(head)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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


def bpf_prog_info(fdinfo: Path) -> dict | None:
    """An eBPF program's id, tag, runs and run time (ns) from a /proc/PID/fdinfo/FD file; None if that fd is not
    a program. Runs and time count only while kernel.bpf_stats_enabled=1 (off by default: the kernel then times
    every run)."""
    try:
        lines = fdinfo.read_text().splitlines()
    except OSError:
        return None
    info = {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}
    if "prog_tag" not in info:
        return None
    return {"id": info.get("prog_id"), "tag": info["prog_tag"], "run_cnt": int(info.get("run_cnt") or 0),
            "run_time_ns": int(info.get("run_time_ns") or 0)}


def bpf_run_stats(funcs: dict) -> dict[str, dict] | None:
    """Each loaded eBPF program's tag, runs and run time as the kernel measured them, by name (the tag is what
    bpftool and /proc/PID/fdinfo show); None unless kernel.bpf_stats_enabled=1. The programs' own kernel-side
    CPU, not the uprobe traps around them."""
    try:
        if Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip() != "1":
            return None
    except OSError:
        return None
    out: dict[str, dict] = {}
    for name, fn in funcs.items():
        info = bpf_prog_info(Path(f"/proc/self/fdinfo/{fn.fd}"))
        if info and info["run_cnt"]:
            out[name.decode() if isinstance(name, bytes) else str(name)] = {k: info[k] for k in ("tag", "run_cnt", "run_time_ns")}
    return out


_AGG_SCHEMA = pa.schema([
    ("bucket_start_ns", pa.int64()), ("pid", pa.int32()), ("tid", pa.int32()), ("cpu", pa.int32()),
    ("comm", pa.string()), ("source", pa.string()),
    ("op", pa.string()), ("count", pa.int64()), ("sum_bytes", pa.int64()), ("sum_duration_ns", pa.int64()),
    ("bucket_ns", pa.int64()),
    ("stored", pa.int64()),
])
_OPEN_INTERVAL_SCHEMA = pa.schema([
    ("pid", pa.int32()), ("tid", pa.int32()), ("off_ns", pa.int64()), ("off_cpu_ns", pa.int64()),
    ("prev_state", pa.string()), ("preemptor_pid", pa.int32()), ("preemptor_tid", pa.int32()),
    ("preemptor_comm", pa.string()), ("cpu", pa.int32()), ("wakeup_ns", pa.int64()), ("sleep_ns", pa.int64()),
    ("cpu_wait_ns", pa.int64()), ("waker_pid", pa.int32()), ("waker_tid", pa.int32()), ("waker_comm", pa.string()),
    ("waker_context", pa.string()), ("syscall", pa.string()), ("kstack_id", pa.int64()),
])
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
