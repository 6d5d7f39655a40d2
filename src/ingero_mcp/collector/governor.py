"""The overhead governor: counts probe hits per process, estimates what they added, and keeps the
estimate under --max-overhead by attaching the launch probes for only part of each period.

Periods are one second of the kernel's clock (bpf_ktime_get_ns = CLOCK_MONOTONIC); with a duty
d < 1 the launch probes are attached for the first d of every period and detached for the rest, so
any second of the analysis sees about the same share (probe_gaps holds the exact gaps). Hits are counted per
(period, pid) by the records' own timestamps, and a period is written one period after it ended
(when the drain has read all of it), so each tracing_cost row equals a count over cuda_calls.
Complete calls (syncs, copies, allocations: entry + return) are never detached: their durations
are the evidence. When they alone exceed the budget the governor says so and leaves them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ingero_mcp.collector.calibrate import ProbeCost

PERIOD_NS = 1_000_000_000
MIN_DUTY = 0.05  # the launch probes stay attached at least 5 % of each period (50 ms of every second)
SETTLE_NS = 300_000_000  # a gap's bounds are read from records drained this long after it closed
FIRST_LOOK_NS = 100_000_000  # the first look at the rate, this long after the governor began (then every quarter)


class Governor:
    """One per recording. `toggle(on)` attaches (True) or detaches (False) every launch probe."""

    def __init__(self, costs: dict[str, ProbeCost], max_share: float | None, toggle: Callable[[bool], None],
                 *, windowed: bool, offset_ns: int, say: Callable[[str], None],
                 refresh: Callable[[], object] | None = None) -> None:
        self.costs = costs
        self.refresh = refresh  # drains the rings, so a decision counts every hit so far (the reader polls rarely)
        self.max_share = max_share  # None: estimate only, never detach
        self.toggle = toggle
        self.windowed = windowed and max_share is not None  # entry-only launches can be windowed
        self.offset_ns = offset_ns
        self.say = say
        self.t0 = time.monotonic_ns() // PERIOD_NS * PERIOD_NS
        self.duty = 1.0
        self.attached = True
        self._lock = threading.Lock()
        self._hits: dict[tuple[int, int], list[int]] = {}  # (period, pid) -> [entry, entry_return]
        self._gap_ns: dict[int, int] = {}  # period -> ns of settled gaps in it
        self._open_gaps: list[dict[str, int | float]] = []  # detached (d0) / attached again (a0, a1), bounds unsettled
        self._written = -1  # last period whose rows were made
        self.gaps: list[dict[str, Any]] = []
        self.cost_rows: list[dict[str, Any]] = []
        self.total_added_ns = 0.0
        self.over_budget_pids: set[int] = set()
        self.last_share: dict[int, float] = {}

    # ---- counting (drain thread) --------------------------------------------------------------

    def count(self, ts: np.ndarray, pid: np.ndarray, entry_only: np.ndarray) -> None:
        """Count one drained batch of CUDA records (kernel timestamps) per period and pid."""
        if not len(ts):
            return
        ts = ts.astype(np.int64)
        period = (ts - self.t0) // PERIOD_NS
        key = (period << 33) | (pid.astype(np.int64) << 1) | entry_only.astype(np.int64)
        uniq, n = np.unique(key, return_counts=True)
        launches = ts[entry_only]
        with self._lock:
            for k, c in zip(uniq.tolist(), n.tolist(), strict=True):
                slot = self._hits.setdefault((k >> 33, (k >> 1) & 0xFFFFFFFF), [0, 0])
                slot[0 if k & 1 else 1] += c
            if len(launches):
                for gap in self._open_gaps:
                    before = launches[(launches >= gap["d0"]) & (launches < gap.get("a0", 1 << 62))]
                    if len(before):
                        gap["last"] = max(gap.get("last", 0), int(before.max()))
                    if "a0" in gap:
                        after = launches[launches >= gap["a0"]]
                        if len(after):
                            gap["first"] = min(gap.get("first", 1 << 62), int(after.min()))

    # ---- the schedule (governor thread) -------------------------------------------------------
    # Attaching takes ~10 ms and the probes fire from its end; detaching stops the eBPF program at once
    # but returns only after RCU grace periods (~200 ms). So each gap is bounded by the records
    # themselves: it starts at the last launch recorded after the detach began (or at that moment) and
    # ends at the first launch recorded after the attach began (or when the attach returned). No
    # launch is a row inside a gap, and none could have been one between a bound and the true switch.

    def _set(self, on: bool) -> None:
        if on == self.attached:
            return
        if on:
            a0 = time.monotonic_ns()
            with self._lock:  # before attaching: launches drained from now on are after the gap, not in it
                if self._open_gaps:
                    self._open_gaps[-1]["a0"] = a0
            self.toggle(True)
            a1 = time.monotonic_ns()
            self.attached = True
            with self._lock:
                if self._open_gaps:
                    self._open_gaps[-1]["a1"] = a1
        else:
            d0 = time.monotonic_ns()
            with self._lock:
                self._open_gaps.append({"d0": d0, "duty": self.duty})
            self.toggle(False)
            self.attached = False

    def _settle_gaps(self, now: int) -> None:
        """Fix the bounds of gaps whose attach ended long enough ago for every record to be drained."""
        with self._lock:
            keep = []
            for gap in self._open_gaps:
                if "a1" not in gap or gap["a1"] > now - SETTLE_NS:
                    keep.append(gap)
                    continue
                start = max(gap["d0"], gap.get("last", 0) + 1)
                end = min(gap["a1"], gap.get("first", 1 << 62))
                if end > start:
                    self.gaps.append({"probes": "launch", "start_ns": start + self.offset_ns,
                                      "end_ns": end + self.offset_ns, "duty": gap["duty"]})
                    p = (start - self.t0) // PERIOD_NS
                    while start < end:  # split over the periods it spans
                        stop = min(end, self.t0 + (p + 1) * PERIOD_NS)
                        self._gap_ns[p] = self._gap_ns.get(p, 0) + stop - start
                        start, p = stop, p + 1
            self._open_gaps = keep

    def run(self, stop: threading.Event) -> None:
        """Attach the launch probes for the first `duty` of every period, detach them for the rest, until
        `stop`; decide the duty every period."""
        # From the period under way, not the next one: its quarters still to come are looked at, so a job
        # launching flat out from the start is cut within a quarter second, not after up to a second unwatched
        # (2-core CI: 1.3M launches/s for 1.6 s filled the ring, 271k records lost).
        began = time.monotonic_ns()  # the first period's rate counts from here, where recording has just begun
        period = (began - self.t0) // PERIOD_NS
        quarter = PERIOD_NS // 4
        while not stop.is_set():
            start = self.t0 + period * PERIOD_NS
            self._set(True)
            if self.windowed and self.duty < 1.0:
                self._sleep_until(start + int(self.duty * PERIOD_NS), stop)
                if not stop.is_set():
                    self._set(False)
            elif self.windowed:
                # Fully attached: look every quarter, so that a burst of launches costs a quarter second at most,
                # and once soon after the start (a job launching flat out from the first instant fills the ring
                # within a second on a loaded machine: a hole no gap explains, only the lost count).
                looks = sorted(t for t in {start + q * quarter for q in (1, 2, 3)} | {began + FIRST_LOOK_NS}
                               if began < t < start + PERIOD_NS)
                for look in looks:
                    self._sleep_until(look, stop)
                    if stop.is_set():
                        break
                    if self.refresh is not None:
                        self.refresh()
                    self._choose(period, max(start, began), time.monotonic_ns())
                    if self.duty < 1.0:
                        self._set(False)
                        break
            self._sleep_until(start + PERIOD_NS, stop)
            if stop.is_set():
                break
            self._decide(period)
            period += 1
        self._set(True)  # leave them attached: the final drain and detach are the tracer's

    @staticmethod
    def _sleep_until(t: int, stop: threading.Event) -> None:
        wait = (t - time.monotonic_ns()) / 1e9
        if wait > 0:
            stop.wait(wait)

    # ---- estimates ---------------------------------------------------------------------------

    def _decide(self, period: int) -> None:
        """Write the rows of the period before `period` and choose the duty from them."""
        if self.refresh is not None:
            self.refresh()
        self._settle_gaps(time.monotonic_ns())
        # The period before (every record of it drained long ago), unless a gap not settled yet touches it: an
        # attach that took most of a second on a loaded machine once wrote a period as fully covered before its
        # gap was known, and the row's duty then contradicted probe_gaps.
        with self._lock:
            unsettled = min(((int(g["d0"]) - self.t0) // PERIOD_NS for g in self._open_gaps), default=period)
        self._rows_through(min(period - 1, unsettled - 1))
        if not self.windowed:
            return
        # The period just ended: drained just now, every record of it is counted.
        self._choose(period, self.t0 + period * PERIOD_NS, self.t0 + (period + 1) * PERIOD_NS)

    def _choose(self, period: int, start: int, end: int) -> None:
        """Set the duty from the hits of `period` between start and end (kernel clock)."""
        entry_cost = self.costs["entry"].cost_ns
        full_cost = self.costs["entry_return"].cost_ns
        with self._lock:
            now = {pid: list(v) for (p, pid), v in self._hits.items() if p == period}
            gap = self._gap_ns.get(period, 0) + sum(  # its gaps not settled yet: detached until re-attached (or now)
                max(0, min(int(g.get("a0", end)), end) - max(int(g["d0"]), start)) for g in self._open_gaps)
        span_s = (end - start) / 1e9
        covered_s = max(span_s - min(gap, end - start) / 1e9, 1e-3)
        duty = 1.0
        for pid, (entry, full) in now.items():
            launch_share = entry / covered_s * entry_cost / 1e9
            other_share = full / span_s * full_cost / 1e9
            self.last_share[pid] = launch_share + other_share
            assert self.max_share is not None
            room = self.max_share - other_share
            if room <= 0 and pid not in self.over_budget_pids:
                self.over_budget_pids.add(pid)
                self.say(f"pid {pid}: complete-call probes (syncs, copies, allocations) alone are estimated at "
                         f"{100 * other_share:.1f} % of its time, over --max-overhead; they stay attached")
            if launch_share > 0:
                duty = min(duty, max(MIN_DUTY, room / launch_share) if room > 0 else MIN_DUTY)
        self.duty = duty

    def _rows_through(self, last: int) -> list[dict[str, Any]]:
        """tracing_cost rows for every period up to `last` not yet written."""
        entry_cost = self.costs["entry"].cost_ns
        full_cost = self.costs["entry_return"].cost_ns
        out = []
        with self._lock:
            for (p, pid) in sorted(k for k in self._hits if self._written < k[0] <= last):
                entry, full = self._hits.pop((p, pid))
                added = entry * entry_cost + full * full_cost
                self.total_added_ns += added
                covered = 1.0 - min(self._gap_ns.get(p, 0), PERIOD_NS) / PERIOD_NS
                out.append({"pid": pid, "start_ns": self.t0 + p * PERIOD_NS + self.offset_ns,
                            "end_ns": self.t0 + (p + 1) * PERIOD_NS + self.offset_ns, "entry_hits": entry,
                            "entry_return_hits": full, "added_ns": round(added), "launch_duty": covered})
            for p in [p for p in self._gap_ns if p <= last]:
                del self._gap_ns[p]
            self._written = max(self._written, last)
            self.cost_rows += out
        return out

    def finish(self) -> None:
        """After the final drain (the probes attached again): settle every gap, write every remaining period."""
        self._settle_gaps(1 << 62)
        self._rows_through(1 << 40)

    def take(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The gap and tracing_cost rows made since the last call."""
        with self._lock:
            gaps, self.gaps = self.gaps, []
            rows, self.cost_rows = self.cost_rows, []
        return gaps, rows
