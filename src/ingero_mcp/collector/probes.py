"""The probes of one recording: CUDA libraries found and attached, the layer probed per process, probe costs.

Each libcudart/libcuda file is attached once (uprobes at resolved file offsets, as uprobe_multi links where the
kernel has them); the launch probes are the governor's to detach and put back; the probe costs are measured
before the first libcuda gets its probes (calibrate.py does the measuring, this module the attaching around it).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingero_mcp.collector import uprobelink
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
    auto_layer,
    descendants,
    scan_cuda_libraries,
)
from ingero_mcp.collector.ops import AUTO_RUNTIME_OPS, OPS, Op, ops_for
from ingero_mcp.collector.targets import Targets

if TYPE_CHECKING:
    from ingero_mcp.collector.governor import Governor
    from ingero_mcp.collector.tracer import TraceOptions

PAGE_TRACEPOINT = b"kmem:mm_page_alloc"  # taken off and put back once at start, to measure its cost per page
ENDBR64 = b"\xf3\x0f\x1e\xfa"


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


class Probes:
    """The libraries attached, their uprobes, the launch probes' switch and the measured probe costs."""

    def __init__(self, opts: TraceOptions, targets: Targets, say: Callable[[str], None]) -> None:
        self.opts = opts
        self.targets = targets
        self.say = say
        self.bpf: Any = None  # the loaded program (Tracer._compile)
        self.link_uprobes = False  # uprobes as uprobe_multi links (uprobelink.py), decided in Tracer._compile
        self.governor: Governor | None = None  # told the measured costs (Tracer.start makes it)
        self.libs: dict[tuple[int, int], AttachedLibrary] = {}
        self.cuda_only_pids: set[int] = set()  # libcuda mapped without libcudart: static runtime?
        self.layers: dict[int, tuple[str, str]] = {}  # pid -> (layer probed for it, why), as of the last scan
        self.mixed_runtimes: dict[tuple[int, int], str] = {}  # libcudart -> note on processes not on its layer
        # the always-on cost (issue 10): probe costs, the launch probe sites the governor attaches and detaches
        self.costs: dict[str, ProbeCost] = defaults("not measured yet")
        self.costs_final = False
        self.sched_cost: ProbeCost = sched_unmeasured("not measured yet")
        self.page_cost: ProbeCost = page_unmeasured("not measured yet")
        self.calibration_pids: set[int] = set()
        self.launch_sites: list[tuple[str, bytes, int]] = []  # (fn_name, path, file offset)
        self.attach_lock = threading.RLock()
        self.launch_on = True  # the launch probes are attached (the governor's windows); under attach_lock
        self.uprobe_links: dict[bytes, int] = {}  # uprobe event name -> BPF link fd, where uprobes are links

    # ---- attaching ------------------------------------------------------------------------

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
            self.say(f"not attached {lib.path} ({lib.api} API left out by --api {','.join(self.opts.apis)})")
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
        self.say(f"attached {lib.path} ({lib.api}: {got}/{required} symbols, {len(rec.attached)} attached in all{eo})"
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
                with self.attach_lock:
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
        import bcc  # type: ignore[import-not-found]  # loaded by Tracer._compile

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

    def toggle_launch(self, on: bool) -> None:
        """Attach (True) or detach (False) every launch probe: the governor's windows."""
        with self.attach_lock:
            self.launch_on = on
            for fn_name, path, addr in self.launch_sites:
                ev = self.bpf._get_uprobe_evname(b"p", path, addr, -1)
                try:
                    if on and not self._uprobe_attached(ev):
                        self._uprobe(fn_name, path, addr)
                    elif not on and self._uprobe_attached(ev):
                        self._detach_uprobe(ev)
                except Exception as exc:  # noqa: BLE001 - say it; the gap rows stay true (detached is detached)
                    self.say(f"launch probe {fn_name} at {path.decode()}+{addr:#x}: {exc}")

    def detach_all(self) -> None:
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

        with self.attach_lock:
            probes = [("uprobe", ev) for ev in [*self.uprobe_links, *self.bpf.uprobe_fds]]
            probes += [("tracepoint", tp) for tp in list(self.bpf.tracepoint_fds)]
            if probes:
                with ThreadPoolExecutor(max_workers=min(64, len(probes)), thread_name_prefix="detach") as pool:
                    list(pool.map(detach, probes))

    # ---- what a probe hit costs -----------------------------------------------------------

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
            self.say(f"probe costs not measured ({exc}); the estimate uses defaults")
            return
        traced_map = self.targets.traced_map
        self.calibration_pids.add(cal.pid)
        traced_map[traced_map.Key(cal.pid)] = traced_map.Leaf(1)
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
            self.say(f"probe cost calibration failed ({type(exc).__name__}: {exc}); the estimate uses defaults")
            costs = defaults(f"calibration failed: {exc}")
        finally:
            cal.close()
            try:
                del traced_map[traced_map.Key(cal.pid)]
            except KeyError:
                pass
        self.costs = costs
        if self.governor is not None:
            self.governor.costs = costs
        self.say(f"probe cost here: entry-only {costs['entry'].cost_ns:.0f} ns, entry + return "
                 f"{costs['entry_return'].cost_ns:.0f} ns per call ({costs['entry'].method.split(':')[0]})")

    def calibrate_sched(self) -> None:
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
        traced_map = self.targets.traced_map
        key = traced_map.Key(cal.pid)

        def trace() -> None:
            traced_map[key] = traced_map.Leaf(1)

        def untrace() -> None:
            del traced_map[key]

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
            traced_map.pop(key, None)
        if PAGE_TRACEPOINT not in self.bpf.tracepoint_fds:  # never record without it
            self._page_tracepoint_on()
        for what, per, c in (("scheduler records", "off-CPU interval", self.sched_cost),
                             ("page allocations", "page allocated", self.page_cost)):
            cost = "not measured" if c.cost_ns is None else f"{c.cost_ns:.0f} ns"
            self.say(f"{what} cost here: {cost} per {per} by a traced thread ({c.method.split(':')[0].split(' (')[0]})")

    def _page_tracepoint_off(self) -> None:
        self.bpf.detach_tracepoint(PAGE_TRACEPOINT)

    def _page_tracepoint_on(self) -> None:
        self.bpf.attach_tracepoint(tp=PAGE_TRACEPOINT, fn_name=b"tracepoint__kmem__mm_page_alloc")

    # ---- discovery and layers -------------------------------------------------------------

    def discover(self) -> None:
        """Attach libraries mapped by the processes we trace (all processes without --pid)."""
        targets = self.targets
        if targets.trace_all:
            found = scan_cuda_libraries()
        else:
            found = scan_cuda_libraries(sorted(targets.live_targets))
        per_pid: dict[int, set[str]] = {}
        for lib in found:
            lib.pids.discard(os.getpid())  # never trace the collector itself
            lib.pids -= self.calibration_pids
            self.attach_library(lib)
            for pid in lib.pids:
                per_pid.setdefault(pid, set()).add(lib.api)
        if targets.trace_all:
            new = [pid for pid in per_pid if pid not in targets.procs or not targets.procs[pid]["traced"]]
            # a CUDA process found now may already have children (DataLoader workers): follow them too
            for pid in sorted(descendants(new)) if new else []:
                if pid not in targets.procs or not targets.procs[pid]["traced"]:
                    targets.trace(pid, target=False)
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
                    self.say(note)
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
                    self.say(note)
                continue
            rec.runtime_layer = f"{why} (pids {', '.join(map(str, silent[:16]))})"
            more = tuple(op for op in ops_for("runtime", "both") if op.name not in AUTO_RUNTIME_OPS)
            before = len(rec.attached)
            self._attach_ops(rec, more)
            self.say(f"runtime layer probed for pids {', '.join(map(str, silent[:16]))}: {lib.path} has no probed "
                     f"libcuda beneath it ({why}); --api auto attached {len(rec.attached) - before} more of its "
                     f"symbols, {len(rec.attached)} in all")
            for pid in silent:
                self.layers[pid] = (RUNTIME_LAYER, why)

    def layer_summary(self) -> str:
        """Which layer is probed for which traced process, for the live view: 'driver layer: pids 12, 14; ...'."""
        by_layer: dict[str, list[int]] = {}
        for pid, (layer, _why) in sorted(self.layers.items()):
            rec = self.targets.procs.get(pid)
            if rec is not None and rec["traced"]:
                by_layer.setdefault(layer, []).append(pid)
        return "; ".join(f"{layer} layer: pid{'s' if len(p) > 1 else ''} {', '.join(map(str, p[:12]))}"
                         + (f" +{len(p) - 12} more" if len(p) > 12 else "") for layer, p in by_layer.items())

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
            key = name.decode() if isinstance(name, bytes) else str(name)
            out[key] = {k: info[k] for k in ("tag", "run_cnt", "run_time_ns")}
    return out
