"""What one probe hit costs on this machine, measured at start: the basis of the tracing-cost estimate.

A calibration process loads the probed library and calls a symbol in a loop (a NULL kernel, no
context: the call returns at once), timed with the probe attached to that process only and without
it, interleaved; the median difference per call is the added time of one hit, kernel trap and
eBPF program included (the calibration process is traced like a job, its records are dropped).
Launch symbols are measured entry-only, a synchronise symbol with entry + return probes.

The scheduler tracepoints stay attached for the whole session and run on every context switch of the
host; what tracing a thread adds to them (its state, one record per off-CPU interval) is measured the
same way: two threads of the calibration process, pinned to one CPU, pass a byte back and forth through
pipes, timed with the process traced and untraced; the added time over the switches it made is the
cost of one off-CPU interval of a traced thread.

The page-allocation tracepoint runs at every page any process allocates; what it costs a traced thread per page
is measured with it taken off and put back around the same helper faulting in fresh pages.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

# Used when a cost cannot be measured (no driver library, a failed calibration): the H200 floor the issue
# measured (entry-only 620-810 ns, entry + return 800-1,250 ns) rounded up, so the governor errs towards
# detaching. probe_costs.method says when a default stood in.
DEFAULT_COST_NS = {"entry": 900.0, "entry_return": 1400.0}
CALLS = 50_000  # calls per timed run at most
PROBED_RUN_NS = 40_000_000  # fewer calls where a hit is slow: a probed run takes about this long (start-up stays short)
MIN_CALLS = 2_000
SIZING_CALLS = 1_000  # one short probed run first, to size the timed runs
ROUNDS = 3
ROUND_TRIPS = 2_000  # ping-pong round trips per timed run: two off-CPU intervals each, ~10 us in Python
SCHED_ROUNDS = 5  # the added time is a few % of a round trip: more, shorter pairs than for the probes
SCHED_PROBE = "sched_interval"  # probe_costs.probe of the scheduler tracepoints' cost per traced off-CPU interval
PAGE_PROBE = "page_alloc"  # probe_costs.probe of the mm_page_alloc tracepoint's cost per page a traced thread allocates
PAGES = 4096  # pages faulted in per timed run (16 MiB)
PAGE_ROUNDS = 3

# (symbol, probe kind, how many NULL/zero arguments it takes): both return at once without a context.
CALIBRATION_CALLS: tuple[tuple[str, str, int], ...] = (
    ("cuLaunchKernel", "entry", 11),
    ("cuStreamSynchronize", "entry_return", 1),
)

_CHILD = r"""
import ctypes, mmap, os, sys, threading, time
lib = ctypes.CDLL(sys.argv[1]) if len(sys.argv) > 1 else None
os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})  # one CPU: every pipe wake-up is a context switch
ping_r, ping_w = os.pipe()
pong_r, pong_w = os.pipe()

def echo():
    while os.read(ping_r, 1) == b"x":
        os.write(pong_w, b"x")

def switches():
    total = 0
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as status:
            total += sum(int(line.split()[1]) for line in status if "ctxt_switches:" in line)
    return total

threading.Thread(target=echo, daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    name, nargs, n = line.split()
    rng = range(int(n))
    if name == "pages":  # fault in fresh anonymous pages, one allocation each (no huge pages)
        size = int(n) * mmap.PAGESIZE
        m = mmap.mmap(-1, size)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            m.madvise(mmap.MADV_NOHUGEPAGE)
        t0 = time.perf_counter_ns()
        for off in range(0, size, mmap.PAGESIZE):
            m[off] = 1
        print(time.perf_counter_ns() - t0, flush=True)
        m.close()
        continue
    if name == "pingpong":
        before = switches()
        t0 = time.perf_counter_ns()
        for _ in rng:
            os.write(ping_w, b"x")
            os.read(pong_r, 1)
        print(time.perf_counter_ns() - t0, switches() - before, flush=True)
        continue
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int
    args = (None,) * int(nargs)
    t0 = time.perf_counter_ns()
    for _ in rng:
        fn(*args)
    print(time.perf_counter_ns() - t0, flush=True)
"""


@dataclass
class ProbeCost:
    """The added time of one hit of one probe kind, and how it was found."""

    probe: str  # 'entry', 'entry_return' or 'sched_interval'
    cost_ns: float | None  # None: not measured (unknown, not zero)
    method: str
    site: str | None = None

    def row(self) -> dict[str, Any]:
        """probe_costs columns (less session_id)."""
        return {"probe": self.probe, "cost_ns": self.cost_ns, "method": self.method, "site": self.site}


def calibrated(probe: str, cost_ns: float, calls: int, symbol: str, library: str, site: str | None) -> ProbeCost:
    """A cost measured by Calibrator.measure (`calls` per timed run), saying how."""
    return ProbeCost(probe, cost_ns, f"calibrated: {symbol} in {library}, {ROUNDS} x {calls:,} calls with and without "
                     "the probe, median", site)


def sched_calibrated(cost_ns: float) -> ProbeCost:
    """The scheduler tracepoints' cost per traced off-CPU interval, measured by Calibrator.measure_sched."""
    return ProbeCost(SCHED_PROBE, cost_ns, "calibrated: two threads passing a byte through pipes on one CPU, "
                     f"{SCHED_ROUNDS} x {ROUND_TRIPS} round trips traced and untraced, median added time per context "
                     "switch")


def page_calibrated(cost_ns: float) -> ProbeCost:
    """The mm_page_alloc tracepoint's cost per page allocated by a traced thread (Calibrator.measure_pages)."""
    return ProbeCost(PAGE_PROBE, cost_ns, f"calibrated: a process faulting in {PAGES:,} fresh pages, {PAGE_ROUNDS} x "
                     "with the page-allocation tracepoint detached and attached, median added time per page")


def page_unmeasured(why: str) -> ProbeCost:
    """No number for the page-allocation tracepoint's cost: the estimate says unknown, never zero."""
    return ProbeCost(PAGE_PROBE, None, f"not measured ({why})")


def sched_unmeasured(why: str) -> ProbeCost:
    """No number for the scheduler tracepoints' cost: the estimate says unknown, never zero."""
    return ProbeCost(SCHED_PROBE, None, f"not measured ({why})")


def defaults(why: str) -> dict[str, ProbeCost]:
    """The stand-in costs, saying why they stand in."""
    return {k: ProbeCost(k, v, f"default ({why})") for k, v in DEFAULT_COST_NS.items()}


def describe_site(head: bytes) -> str:
    """A short name for the first instruction at a probe site (what the kernel must emulate or single-step)."""
    if head[:4] == b"\xf3\x0f\x1e\xfa":
        return "endbr64 (f3 0f 1e fa)"
    if head[:1] == b"\x55":
        return "push %rbp (55)"
    if len(head) >= 2 and head[0] == 0x41 and 0x50 <= head[1] <= 0x57:
        return f"push %r{8 + head[1] - 0x50} ({head[:2].hex(' ')})"
    if head[:1] and 0x50 <= head[0] <= 0x57:
        return f"push ({head[:1].hex()})"
    return f"({head[:6].hex(' ')})"


class Calibrator:
    """Runs the calibration process (against one library, or none for the scheduler's cost); `attach`/`detach`
    are the tracer's, for that pid."""

    def __init__(self, lib_path: str | None = None) -> None:
        self.lib_path = lib_path
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, *([lib_path] if lib_path else [])],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.close()
            raise RuntimeError(f"calibration process could not {f'load {lib_path}' if lib_path else 'start'}: "
                               f"{err.strip()[-300:] or line!r}")

    @property
    def pid(self) -> int:
        """The calibration process (traced while it runs; its records are dropped)."""
        return self.proc.pid

    def run(self, symbol: str, nargs: int, calls: int) -> int:
        """Wall ns of `calls` calls of `symbol`."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{symbol} {nargs} {calls}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def measure(self, symbol: str, nargs: int, attach: Any, detach: Any, *, calls: int = CALLS,
                rounds: int = ROUNDS) -> tuple[float, int]:
        """Median added ns per call over `rounds` interleaved pairs of runs without and with the probe, and the calls
        per run: at most `calls`, fewer where a probed call is slow (a uretprobe took 15 us on one VM), so that a
        probed run lasts about PROBED_RUN_NS."""
        self.run(symbol, nargs, calls // 10)  # warm: page in the library's path, the loop's code
        attach()
        try:
            sized = self.run(symbol, nargs, SIZING_CALLS)
        finally:
            detach()
        calls = max(MIN_CALLS, min(calls, PROBED_RUN_NS * SIZING_CALLS // max(sized, 1)))
        diffs = []
        for _ in range(rounds):
            bare = self.run(symbol, nargs, calls)
            attach()
            try:
                probed = self.run(symbol, nargs, calls)
            finally:
                detach()
            diffs.append((probed - bare) / calls)
        return max(0.0, statistics.median(diffs)), calls

    def pingpong(self, round_trips: int) -> tuple[int, int]:
        """Wall ns of `round_trips` ping-pong round trips, and the context switches its threads made meanwhile."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"pingpong 0 {round_trips}\n")
        self.proc.stdin.flush()
        ns, switches = self.proc.stdout.readline().split()
        return int(ns), int(switches)

    def measure_sched(self, trace: Any, untrace: Any, *, round_trips: int = ROUND_TRIPS,
                      rounds: int = SCHED_ROUNDS) -> float:
        """Median added ns per context switch with the process traced (`trace`/`untrace` put it in and out of the
        traced set), over `rounds` interleaved pairs of ping-pong runs."""
        self.pingpong(round_trips // 10)  # warm
        per_switch = []
        for _ in range(rounds):
            bare, _ = self.pingpong(round_trips)
            trace()
            try:
                traced, switches = self.pingpong(round_trips)
            finally:
                untrace()
            if switches <= 0:
                raise RuntimeError("the ping-pong made no context switch")
            per_switch.append((traced - bare) / switches)
        return max(0.0, statistics.median(per_switch))

    def pages(self, pages: int) -> int:
        """Wall ns of faulting in `pages` fresh anonymous pages."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"pages 0 {pages}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def measure_pages(self, detach: Any, attach: Any, *, pages: int = PAGES, rounds: int = PAGE_ROUNDS) -> float:
        """Median added ns per page allocated with the page-allocation tracepoint attached (`detach`/`attach` take it
        off and put it back), over `rounds` interleaved pairs of runs; it is attached again at the end."""
        self.pages(pages // 4)  # warm
        per_page = []
        for _ in range(rounds):
            detach()
            try:
                bare = self.pages(pages)
            finally:
                attach()
            probed = self.pages(pages)
            per_page.append((probed - bare) / pages)
        return max(0.0, statistics.median(per_page))

    def close(self) -> None:
        """End the calibration process."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - never let a stuck helper block the start
            self.proc.kill()
            self.proc.wait()


