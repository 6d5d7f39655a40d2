"""The collector's always-on defaults, for real (eBPF on the stand-in CUDA libraries): launches probed
entry-only, one probe layer per logical call, probe costs measured at start, the overhead governor's
gaps and its per-process estimate, and a probe site that starts with endbr64.

Needs root, BCC, kernel headers and tracefs, like tests/collector/test_collector.py (which keeps the old mode:
both layers, entry + return everywhere, no governor).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from harness import STANDIN, Collector, Hog, StandIn, Workload, build_standin, mix_expected, record, require_ebpf

pytestmark = pytest.mark.ebpf

LAUNCHES = 3000
GOVERNED_S = 6


def _q(con: Any, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    return con.execute(sql, params or []).fetchall()


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> StandIn:
    """The stand-in libcudart.so.13 / libcuda.so.1 and the workload."""
    require_ebpf()
    return build_standin(tmp_path_factory.mktemp("standin"))


def _record(db: Path, workloads: list[Workload], *extra: str) -> Collector:
    return record(db, workloads, *extra, defaults=True, timeout=90)


@contextmanager
def _bpf_stats(value: str) -> Iterator[None]:
    """kernel.bpf_stats_enabled set to `value` for the block, then put back."""
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    was = stats.read_text().strip()
    stats.write_text(value)
    try:
        yield
    finally:
        stats.write_text(was)


@pytest.fixture(scope="module")
def plain(standin: StandIn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The defaults without the governor's windows: every call of a `mix` and LAUNCHES driver launches."""
    from ingero_mcp.store import open_store

    db = tmp_path_factory.mktemp("plain") / "plain.duckdb"
    mix = Workload(standin, "mix", "20", "0", "0", "0", "0")
    rate = Workload(standin, "rate", str(LAUNCHES), "driver")
    with _bpf_stats("1"):  # the kernel times every eBPF program run: the collector notes them (bpf_run_stats)
        collector = _record(db, [mix, rate], "--max-overhead", "off")
    con = open_store(db)
    yield {"con": con, "mix": mix.pid, "rate": rate.pid, "log": collector.output()}
    con.close()


def test_default_probes_one_layer_per_logical_call(plain: dict[str, Any]) -> None:
    """--api auto: every driver symbol, and of the runtime only the calls that do not enter the driver."""
    from ingero_mcp.collector.ops import AUTO_RUNTIME_OPS

    con = plain["con"]
    parent, _, _ = mix_expected(20, 0)
    want = {op: n for op, n in parent.items() if n and (not op.startswith("cuda") or op in AUTO_RUNTIME_OPS)}
    got = dict(_q(con, "SELECT op, count(*) FROM cuda_calls WHERE pid = ? GROUP BY op", [plain["mix"]]))
    assert got == want
    libraries = {Path(lib["path"]).name: lib
                 for lib in json.loads(_q(con, "SELECT attached FROM sessions")[0][0])["libraries"]}
    assert sorted(libraries["libcudart.so.13"]["attached"]) == sorted(AUTO_RUNTIME_OPS)
    assert libraries["libcuda.so.1"]["entry_only"] == ["cuLaunchKernel", "cuLaunchKernelEx"]
    flags = json.loads(_q(con, "SELECT collector_flags FROM sessions")[0][0])
    assert (flags["layer"], flags["launch_probes"], flags["max_overhead_pct"]) == ("auto", "entry", None)


def test_launches_are_entry_only_rows_with_their_arguments(plain: dict[str, Any]) -> None:
    """A launch is a row at its entry: no duration, no split, no return code (unknown, not 0); its
    stream (an argument on the stack) and kernel handle read at entry."""
    con = plain["con"]
    row = _q(con, "SELECT count(*), count(duration_ns), count(sleep_ns), count(cpu_wait_ns), count(return_code), "
                  "count(context_switches), count(kernel_handle), count(DISTINCT stream) FROM cuda_calls "
                  "WHERE pid = ? AND op = 'cuLaunchKernel'", [plain["rate"]])[0]
    assert row == (LAUNCHES, 0, 0, 0, 0, 0, LAUNCHES, 4)
    assert _q(con, "SELECT list_sort(list(DISTINCT stream)) FROM cuda_calls WHERE pid = ?",
              [plain["rate"]])[0][0] == [0, 1, 2, 3]
    # every other call is complete: entry + return
    incomplete = _q(con, "SELECT count(*) FROM cuda_calls "
                         "WHERE NOT contains(op, 'aunch') AND duration_ns IS NULL")[0][0]
    assert incomplete == 0
    assert _q(con, "SELECT count(*) FROM cuda_calls WHERE contains(op, 'aunch') AND duration_ns IS NOT NULL")[0][0] == 0


@pytest.mark.parametrize("defaults", [True, False], ids=["defaults-links", "legacy-perf-events"])
def test_uprobes_are_links_or_perf_events_as_the_harness_asks(standin: StandIn, tmp_path: Path, defaults: bool) -> None:
    """Kernels with uprobe_multi (6.6+) get uprobes as BPF links, not perf events (each perf event's detach waits
    its turn, ~0.1 s); INGERO_UPROBE_LINKS=0, as for the legacy tests, keeps perf events, the older kernels' path.
    Either way the probes fire and the session says which (kernel_features)."""
    from ingero_mcp.store import open_store

    work = Workload(standin, "rate", "100", "driver")
    collector = Collector(tmp_path / "t.duckdb", "--pid", str(work.pid), defaults=defaults)
    try:
        collector.wait_for("recording to", timeout=120)
        fds = Path(f"/proc/{collector.proc.pid}/fd")
        links = sum(1 for fd in fds.iterdir() if os.readlink(fd) == "anon_inode:bpf_link")
        work.go()
        assert work.wait()[0] == 0
        assert collector.wait(timeout=60) == 0, collector.output()
    finally:
        work.kill()
        collector.kill()
    assert (links >= 2) if defaults else (links == 0), links  # the launch probes at least, or none
    con = open_store(tmp_path / "t.duckdb")
    try:
        features = json.loads(_q(con, "SELECT collector_flags FROM sessions")[0][0])["kernel_features"]
        launches = _q(con, "SELECT count(*) FROM cuda_calls WHERE pid = ? AND contains(op, 'aunch')", [work.pid])[0][0]
    finally:
        con.close()
    assert ("UPROBE_LINKS" in features) == defaults, features
    assert launches == 100


def test_a_paced_feeder_is_recorded_whole_at_its_pace(standin: StandIn, tmp_path: Path) -> None:
    """`workload pace` (the GPU bench's stand-in for a job's record load, bench/gpu/same_process.py's feeder)
    launches 20,000 a second in bursts of 20 a millisecond apart: every launch is a row, and the rows keep its
    pace as it kept it. On a loaded machine the feeder is preempted and catches up with bursts back to back, so
    how many bursts stay paced is the machine's business; the store's is to show the same number the feeder saw."""
    from ingero_mcp.store import open_store

    per_burst = 20
    feeder = Workload(standin, "pace", str(per_burst * 1000), "0.3")
    _record(tmp_path / "pace.duckdb", [feeder], "--max-overhead", "off")
    fields = feeder.out.split()
    calls, wall_ns, paced = int(fields[1]), int(fields[3]), int(fields[5])
    assert calls > 0 and calls % per_burst == 0 and paced > 0, feeder.out  # whole bursts, some of them paced
    con = open_store(tmp_path / "pace.duckdb")
    try:
        rows, span_ns = _q(con, "SELECT count(*), max(ts_ns) - min(ts_ns) FROM cuda_calls "
                                "WHERE pid = ? AND op = 'cuLaunchKernel'", [feeder.pid])[0]
        # a burst is per_burst consecutive launches; its start is its first launch's row
        stored_paced = _q(con, """
            WITH b AS (SELECT (row_number() OVER (ORDER BY ts_ns) - 1) // $2 AS burst, ts_ns FROM cuda_calls
                       WHERE pid = $1 AND op = 'cuLaunchKernel'),
                 s AS (SELECT burst, min(ts_ns) AS start_ns FROM b GROUP BY burst)
            SELECT count(*) FROM (SELECT start_ns - lag(start_ns) OVER (ORDER BY burst) AS apart FROM s)
            WHERE apart >= 500000""", [feeder.pid, per_burst])[0][0]
    finally:
        con.close()
    assert rows == calls  # every launch a row
    assert span_ns <= wall_ns
    # the feeder timed each burst's start just before its first launch; the probe timed the launch: a preemption
    # between the two can move one start across the 0.5 ms line, so a few may differ
    assert abs(stored_paced - paced) <= max(3, paced // 50), (stored_paced, paced, calls // per_burst)


def test_probe_costs_measured_and_the_estimate_is_recomputable(plain: dict[str, Any]) -> None:
    """probe_costs: both probe kinds and the scheduler records calibrated here; tracing_cost: hits equal the rows
    of each period, added_ns equals hits x cost; the calibration process left no rows."""
    con = plain["con"]
    costs = dict(_q(con, "SELECT probe, cost_ns FROM probe_costs"))
    methods = [m for (m,) in _q(con, "SELECT method FROM probe_costs WHERE probe <> 'stack_sample'")]
    assert set(costs) == {"entry", "entry_return", "sched_interval", "page_alloc", "stack_sample"}, costs
    assert all(m.startswith("calibrated") for m in methods), methods
    # a probe's trap (~1 µs) stands well above the noise; a context switch's or a page's few hundred ns can measure
    # 0 on a loaded machine (the calibration keeps a median difference, floored at 0): never negative
    assert costs["entry"] > 0 and costs["entry_return"] > 0 and all(c >= 0 for c in costs.values()), costs
    mismatched = _q(con, """
        SELECT t.pid, t.start_ns, t.entry_hits, t.entry_return_hits,
               count(c.ts_ns) FILTER (WHERE c.duration_ns IS NULL),
               count(c.ts_ns) FILTER (WHERE c.duration_ns IS NOT NULL)
        FROM tracing_cost t LEFT JOIN cuda_calls c ON c.pid = t.pid AND c.ts_ns >= t.start_ns AND c.ts_ns < t.end_ns
        GROUP BY ALL HAVING t.entry_hits <> count(c.ts_ns) FILTER (WHERE c.duration_ns IS NULL)
                         OR t.entry_return_hits <> count(c.ts_ns) FILTER (WHERE c.duration_ns IS NOT NULL)""")
    assert mismatched == []
    hits = dict(_q(con, "SELECT pid, sum(entry_hits) FROM tracing_cost GROUP BY pid"))
    assert hits[plain["rate"]] == LAUNCHES
    bad = _q(con, "SELECT added_ns, round(entry_hits * ? + entry_return_hits * ?) FROM tracing_cost "
                  "WHERE abs(added_ns - (entry_hits * ? + entry_return_hits * ?)) > 1",
             [costs["entry"], costs["entry_return"]] * 2)
    assert bad == []
    pids = {p for (p,) in _q(con, "SELECT DISTINCT pid FROM cuda_calls")}
    assert pids == {plain["mix"], plain["rate"]}, "the calibration process's calls must not be rows"
    assert "probe cost here" in plain["log"]
    assert f"scheduler records cost here: {costs['sched_interval']:.0f} ns per off-CPU interval" in plain["log"]
    assert f"page allocations cost here: {costs['page_alloc']:.0f} ns per page allocated" in plain["log"]
    traced = {p for (p,) in _q(con, "SELECT pid FROM processes WHERE traced")}
    assert traced <= {plain["mix"], plain["rate"]} | {p for (p,) in _q(con, "SELECT pid FROM processes WHERE ppid = ?",
                                                                        [plain["mix"]])}, \
        "the calibration processes are not traced processes: their pages are not the job's"
    assert _q(con, "SELECT count(*) FROM sched_intervals WHERE pid NOT IN (?, ?)",
              [plain["mix"], plain["rate"]]) == [(0,)], "the ping-pong's intervals must not be rows"


def test_the_cost_report_names_what_the_estimate_leaves_out(plain: dict[str, Any]) -> None:
    """The collector's own CPU time and each process's off-CPU intervals (the scheduler tracepoints' hits) are
    reported beside the estimate, each recomputed by its SQL."""
    from ingero_mcp.analysis.cost import cost_lines
    from ingero_mcp.analysis.info import trace_info

    con = plain["con"]
    t = trace_info(con).tracing
    assert t is not None and t.collector_cpu_s is not None and t.collector_cpu_s > 0
    assert _q(con, t.sql["collector_cpu_s"])[0] == pytest.approx((t.collector_cpu_s, t.collector_cpu_recording_s),
                                                                 abs=1e-3)
    assert t.collector_cpu_recording_s is not None and 0 < t.collector_cpu_recording_s < t.collector_cpu_s
    for p in t.processes:
        assert p.off_cpu_intervals == _q(con, "SELECT count(*) FROM sched_intervals WHERE pid = ?", [p.pid])[0][0]
        assert _q(con, p.sql)[0][7] == p.off_cpu_intervals
    assert any(p.off_cpu_intervals > 0 for p in t.processes)  # the mix workload sleeps in its syncs
    lines = cost_lines(t)
    assert f"the collector itself used {t.collector_cpu_s:.1f} s of CPU " \
        f"({t.collector_cpu_recording_s:.1f} s of it after start-up" in lines[0] and "not an upper bound" in lines[0]
    # the scheduler records' estimate: every traced interval x the cost the collector measured at start
    cost = _q(con, "SELECT cost_ns FROM probe_costs WHERE probe = 'sched_interval'")[0][0]
    intervals = _q(con, "SELECT count(*) FROM sched_intervals")[0][0]
    assert t.sched_added_ns == round(intervals * cost) and intervals > 0
    # the page allocations' estimate: every page of a traced process x the cost measured at start
    page_cost = _q(con, "SELECT cost_ns FROM probe_costs WHERE probe = 'page_alloc'")[0][0]
    pages = _q(con, "SELECT sum(count) FROM host_aggregates WHERE op = 'mm_page_alloc' AND pid IN "
                    "(SELECT pid FROM processes WHERE traced)")[0][0]
    assert pages > 0 and t.page_allocs == pages and t.page_added_ns == round(pages * page_cost)
    assert _q(con, t.sql["tracepoints"])[0] == (intervals, t.sched_added_ns, pages, t.page_added_ns, t.samples,
                                                t.sample_added_ns or 0, t.total_share)
    assert f"{t.sched_added_ns / 1e9:.3f} s by the scheduler records ({intervals:,} off-CPU intervals" in lines[0]
    assert f"{t.page_added_ns / 1e9:.3f} s by the page-allocation tracepoint ({pages:,} pages" in lines[0]


def test_without_calibration_the_scheduler_records_share_is_unknown(standin: StandIn, tmp_path: Path) -> None:
    """--no-calibrate: the probes' defaults stand in, stored as such, but the scheduler records' cost is NULL and the
    report says their share is unknown (never 0)."""
    from ingero_mcp.analysis.cost import cost_lines
    from ingero_mcp.analysis.info import trace_info
    from ingero_mcp.store import open_store

    db = tmp_path / "nocal.duckdb"
    log = _record(db, [Workload(standin, "mix", "20", "0", "0", "0", "0")], "--no-calibrate").output()
    assert "cost here" not in log
    con = open_store(db)
    try:
        rows = _q(con, "SELECT probe, cost_ns, method FROM probe_costs WHERE probe <> 'stack_sample' ORDER BY probe")
        assert [(p, c) for p, c, _ in rows] == [("entry", 900.0), ("entry_return", 1400.0), ("page_alloc", None),
                                                ("sched_interval", None)]
        assert rows[2][2] == "not measured (--no-calibrate)"
        t = trace_info(con).tracing
        assert t is not None and t.off_cpu_intervals > 0 and (t.sched_added_ns, t.total_share) == (None, None)
        assert f"the scheduler records' share unknown ({t.off_cpu_intervals:,} off-CPU intervals" in cost_lines(t)[0]
    finally:
        con.close()


def test_the_live_view_adds_the_scheduler_records_and_pages_to_the_estimate(standin: StandIn, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --quiet the live view's cost line gives the CUDA probes' estimate, the scheduler records' (intervals
    stored so far x the cost measured at start) and the page allocations' (traced processes' pages so far x theirs),
    as explain does."""
    import re

    from ingero_mcp.store import open_store

    monkeypatch.setenv("COLUMNS", "1000")  # one line per row of the view, as on a wide terminal
    db = tmp_path / "live.duckdb"
    # seconds of sleeping syncs and two children allocating 16 MiB each: pages harvested while the view still draws
    log = record(db, [Workload(standin, "mix", "30", "0", "20000000", "2", "16")], defaults=True, timeout=90,
                 quiet=False).output()
    got = re.findall(r"tracing cost \(estimated\): [\d.]+ s added by the CUDA probes so far, "
                     r"\+([\d.]+) s by the scheduler records \(([\d,]+) off-CPU intervals x (\d+) ns\), "
                     r"\+([\d.]+) s by the page-allocation tracepoint \(([\d,]+) pages x (\d+) ns\)", log)
    assert got, log[-2000:]
    added_s, intervals, per_interval, page_s, pages, per_page = got[-1]
    con = open_store(db)
    try:
        cost = _q(con, "SELECT cost_ns FROM probe_costs WHERE probe = 'sched_interval'")[0][0]
        stored = _q(con, "SELECT count(*) FROM sched_intervals")[0][0]
        page_cost = _q(con, "SELECT cost_ns FROM probe_costs WHERE probe = 'page_alloc'")[0][0]
        stored_pages = _q(con, "SELECT sum(count) FROM host_aggregates WHERE op = 'mm_page_alloc' AND pid IN "
                               "(SELECT pid FROM processes WHERE traced)")[0][0]
    finally:
        con.close()
    assert int(per_interval) == round(cost)
    assert 0 < int(intervals.replace(",", "")) <= stored  # the view lags the last flush at most
    assert float(added_s) == pytest.approx(int(intervals.replace(",", "")) * cost / 1e9, abs=0.006)
    assert int(per_page) == round(page_cost)
    assert 0 < int(pages.replace(",", "")) <= stored_pages
    assert float(page_s) == pytest.approx(int(pages.replace(",", "")) * page_cost / 1e9, abs=0.006)


def test_the_kernels_own_timing_of_each_program_is_noted(plain: dict[str, Any]) -> None:
    """With kernel.bpf_stats_enabled=1 the session notes each program's runs and run time as the kernel
    measured them: the launch probe ran once per recorded launch (and the calibration's calls), the scheduler
    tracepoint at least once per recorded interval."""
    con = plain["con"]
    notes = json.loads(_q(con, "SELECT notes FROM sessions")[0][0])
    stats = notes["bpf_run_stats"]
    launches = _q(con, "SELECT count(*) FROM cuda_calls WHERE op = 'cuLaunchKernel' AND duration_ns IS NULL")[0][0]
    assert launches >= LAUNCHES
    assert stats["o_cuLaunchKernel"]["run_cnt"] >= launches
    assert stats["o_cuLaunchKernel"]["run_time_ns"] > 0
    assert stats["tracepoint__sched__sched_switch"]["run_cnt"] >= _q(con, "SELECT count(*) FROM sched_intervals")[0][0]
    assert all(len(v["tag"]) == 16 and int(v["tag"], 16) >= 0 for v in stats.values())


def test_explain_gives_the_programs_kernel_time_when_measured(plain: dict[str, Any], governed: dict[str, Any]) -> None:
    """The cost report adds the programs' kernel-measured time (recomputed by its SQL) where the session measured
    it, and says nothing of it where it did not (unknown, not zero)."""
    from ingero_mcp.analysis.cost import cost_lines
    from ingero_mcp.analysis.info import trace_info

    t = trace_info(plain["con"]).tracing
    assert t is not None and t.bpf_programs
    assert [(p.program, p.runs, p.run_time_ns) for p in t.bpf_programs] == _q(plain["con"], t.sql["bpf_programs"])
    notes = json.loads(_q(plain["con"], "SELECT notes FROM sessions")[0][0])["bpf_run_stats"]
    assert sum(p.run_time_ns for p in t.bpf_programs) == sum(v["run_time_ns"] for v in notes.values())
    total = sum(p.run_time_ns for p in t.bpf_programs) / 1e9
    assert f"its eBPF programs ran {total:.3f} s in the kernel" in cost_lines(t)[0]
    g = trace_info(governed["con"]).tracing
    assert g is not None and g.bpf_programs is None
    assert "eBPF programs ran" not in cost_lines(g)[0]


@pytest.fixture(scope="module")
def governed(standin: StandIn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """GOVERNED_S seconds of back-to-back driver launches under --max-overhead 1, the workload marking the wall
    clock every 1024 launches."""
    from ingero_mcp.store import open_store

    folder = tmp_path_factory.mktemp("gov")
    marks = folder / "marks"
    rate = Workload(standin, "rate", "0", "driver", str(GOVERNED_S), cpu=1, env={"WL_MARKS": str(marks)})
    with _bpf_stats("0"):  # the default: nothing measured, nothing noted
        collector = _record(folder / "gov.duckdb", [rate], "--max-overhead", "1")
    con = open_store(folder / "gov.duckdb")
    yield {"con": con, "rate": rate.pid, "log": collector.output(),
           "marks": [int(x) for x in marks.read_text().split()]}
    con.close()


def test_governor_detaches_the_launch_probes_over_budget(governed: dict[str, Any]) -> None:
    """Far over 1 %: the launch probes are detached for part of each second after the first ones, the gaps are
    rows, and no launch row lies inside a gap. Every launch outside a gap is a row or counted lost: between two of
    the workload's marks (its wall clock, read every 1024 launches) that no gap touches lie 1024 rows, however long
    the machine's load made that stretch, less at most what collector_stats counts lost."""
    import numpy as np

    from ingero_mcp.collector.governor import MIN_DUTY

    con, pid, marks = governed["con"], governed["rate"], governed["marks"]
    gaps = _q(con, "SELECT start_ns, end_ns, duty FROM probe_gaps WHERE probes = 'launch' ORDER BY start_ns")
    assert len(gaps) >= GOVERNED_S - 3, gaps
    assert all(end > start and MIN_DUTY <= duty < 1 for start, end, duty in gaps), gaps
    inside = _q(con, "SELECT count(*) FROM cuda_calls c JOIN probe_gaps g "
                     "ON c.ts_ns >= g.start_ns AND c.ts_ns < g.end_ns")
    assert inside == [(0,)]
    launches = np.sort(con.execute("SELECT ts_ns FROM cuda_calls WHERE pid = ? AND op = 'cuLaunchKernel'",
                                   [pid]).fetchnumpy()["ts_ns"])
    starts = np.array([s for s, _e, _d in gaps], dtype=np.int64)
    ends = np.array([e for _s, e, _d in gaps], dtype=np.int64)
    lo, hi = np.array(marks[:-1], dtype=np.int64), np.array(marks[1:], dtype=np.int64)
    # a stretch is clear when no gap comes near it (the marks' clock and the probes' agree within a µs: 10 µs spare)
    slack = 10_000
    clear = np.searchsorted(ends, lo - slack, side="right") >= np.searchsorted(starts, hi + slack, side="left")
    rows = np.searchsorted(launches, hi, side="right") - np.searchsorted(launches, lo, side="right")
    short = [(int(a), int(b), int(n)) for a, b, n in zip(lo[clear], hi[clear], rows[clear], strict=True) if n != 1024]
    # A launch outside every gap that is not a row must be counted lost (the ring was full: a 2-core machine under
    # load can fall that far behind before the first look cuts the probes); nothing is missing silently.
    lost = _q(con, "SELECT coalesce(sum(events_lost), 0) FROM collector_stats WHERE source = 'cuda_calls'")[0][0]
    missing = sum(1024 - n for _a, _b, n in short)
    assert clear.sum() >= 10 and all(n < 1024 for _a, _b, n in short), short[:5]
    assert missing <= lost, f"launches missing where no probe gap says so and not counted lost: {short[:5]} {lost}"
    # the windows reopen: launches are rows again after every gap the workload made 1024 launches after (a whole
    # stretch between marks; a gap that ends inside the last stretch may have none after it)
    never_reopened = [int(e) for e in ends if e + slack <= marks[-2] and np.searchsorted(launches, e) == len(launches)]
    assert never_reopened == [], never_reopened


def test_governor_cuts_every_period_after_one_over_budget(governed: dict[str, Any]) -> None:
    """The governor's decision, from its own rows: a period whose launches, at full coverage, cost over the budget
    is followed by a period with a gap (while the workload still launches), however fast the machine ran it."""
    con, pid = governed["con"], governed["rate"]
    costs = dict(_q(con, "SELECT probe, cost_ns FROM probe_costs"))
    rows = _q(con, "SELECT start_ns, entry_hits, entry_return_hits, launch_duty FROM tracing_cost "
                   "WHERE pid = ? ORDER BY start_ns", [pid])
    over = 0
    for (start, entry, full, duty), (next_start, _e, _f, next_duty) in zip(rows[:-2], rows[1:-1], strict=True):
        share = (entry * costs["entry"] / max(duty, 1e-3) + full * costs["entry_return"]) / 1e9
        if next_start - start == 1_000_000_000 and share > 0.015:  # clearly over --max-overhead 1
            over += 1
            assert next_duty < 1, (start, share, next_duty)
    assert over >= 1, rows


def test_governor_duty_matches_its_gaps(governed: dict[str, Any]) -> None:
    """tracing_cost.launch_duty is 1 minus the share of its period inside probe_gaps, and the cut periods
    are the ones the estimate says were over budget."""
    con = governed["con"]
    rows = _q(con, """
        SELECT t.start_ns, t.launch_duty,
               1 - coalesce((SELECT sum(least(g.end_ns, t.end_ns) - greatest(g.start_ns, t.start_ns))
                             FROM probe_gaps g WHERE g.end_ns > t.start_ns AND g.start_ns < t.end_ns), 0) / 1e9
        FROM tracing_cost t WHERE t.pid = ? ORDER BY t.start_ns""", [governed["rate"]])
    assert rows and all(abs(duty - covered) < 1e-6 for _, duty, covered in rows), rows
    assert min(duty for _, duty, _ in rows) < 0.5
    share = _q(con, "SELECT max(t.added_ns / (t.end_ns - t.start_ns) / t.launch_duty) FROM tracing_cost t")[0][0]
    assert share > 0.01, "the full-coverage estimate must have been over the 1 % budget for the governor to act"


@pytest.fixture(scope="module")
def cet_standin(tmp_path_factory: pytest.TempPathFactory) -> StandIn:
    """The stand-ins built with -fcf-protection=full: every exported function starts with endbr64."""
    require_ebpf()
    out = tmp_path_factory.mktemp("cet")
    subprocess.run(["sh", str(STANDIN / "build.sh"), str(out)], check=True, capture_output=True, text=True,
                   env={"PATH": "/usr/bin:/bin", "CC": "gcc -fcf-protection=full"})
    return StandIn(out, out / "site-packages" / "nvidia" / "cu13" / "lib", out / "workload")


def test_probe_past_endbr64_reads_the_same_arguments(cet_standin: StandIn, tmp_path: Path) -> None:
    """At a site starting with endbr64 (which the kernel would single-step) the probe goes on the next
    instruction: the session says so, and the arguments read there are the call's."""
    from ingero_mcp.collector.tracer import ENDBR64
    from ingero_mcp.store import open_store

    lib = cet_standin.cuda.read_bytes()
    assert ENDBR64 in lib  # the build did emit endbr64
    db = tmp_path / "cet.duckdb"
    rate = Workload(cet_standin, "rate", "200", "driver")
    _record(db, [rate], "--max-overhead", "off")
    con = open_store(db)
    libraries = {Path(lib["path"]).name: lib
                 for lib in json.loads(_q(con, "SELECT attached FROM sessions")[0][0])["libraries"]}
    sites = libraries["libcuda.so.1"]["probe_sites"]
    assert sites["cuLaunchKernel"].startswith("endbr64 skipped"), sites
    assert _q(con, "SELECT count(*), list_sort(list(DISTINCT stream)) FROM cuda_calls "
                   "WHERE op = 'cuLaunchKernel'")[0] == (200, [0, 1, 2, 3])
    assert "endbr64" in _q(con, "SELECT site FROM probe_costs WHERE probe = 'entry'")[0][0]
    con.close()


def test_a_stop_while_traced_processes_run_keeps_the_session_whole(standin: StandIn, tmp_path: Path) -> None:
    """Ctrl-C while the job goes on (the usual way to stop): one process hung in a sync (its thread is off-CPU
    at the stop), another launching on a CPU it shares with a hog (preempted all the time, so scheduler rows
    are pending at the stop). Everything up to the stop is stored: the session's stop, the estimate's last
    periods, the governor's gaps, the open interval."""
    import signal
    import time

    from ingero_mcp.store import open_store

    db = tmp_path / "stop.duckdb"
    hung = Workload(standin, "mix", "1", "0", str(30 * 10**9), "0", "0")
    rate = Workload(standin, "rate", "0", "driver", "30", cpu=1)
    hog = Hog(standin, 1)
    collector = Collector(db, "--pid", str(hung.pid), "--pid", str(rate.pid), "--max-overhead", "1", defaults=True)
    try:
        collector.wait_for("recording to", timeout=120)
        hung.go()
        rate.go()
        time.sleep(3.5)
        sigint_ns = time.time_ns()
        collector.proc.send_signal(signal.SIGINT)
        assert collector.wait(timeout=90) == 0, collector.output()
    finally:
        hog.stop()
        for w in (hung, rate):
            w.kill()
        collector.kill()
    con = open_store(db)
    try:
        stopped = _q(con, "SELECT stopped_ns FROM sessions")[0][0]
        assert stopped is not None and stopped > sigint_ns
        last_call, = _q(con, "SELECT max(ts_ns) FROM cuda_calls WHERE pid = ?", [rate.pid])[0]
        # launches until the stop are rows, unless the governor had detached the launch probes (--max-overhead 1):
        # then the final gap starts where the rows end and says so up to the stop
        final_gap = _q(con, "SELECT start_ns, end_ns FROM probe_gaps WHERE probes = 'launch' "
                            "ORDER BY end_ns DESC LIMIT 1")
        seen_until = last_call
        if final_gap and final_gap[0][1] > last_call:
            assert final_gap[0][0] - last_call < 100_000_000, "the launch rows end where the governor detached"
            seen_until = final_gap[0][1]
        assert seen_until > sigint_ns - 500_000_000, "launches (or the governor's gap) until the stop are stored"
        last = _q(con, "SELECT max(end_ns) FROM tracing_cost WHERE pid = ?", [rate.pid])[0][0]
        assert last is not None and last >= last_call, "the estimate's last periods were lost"
        # the recording ends where the probes stopped firing, not seconds later when the detaches returned
        detach_s = json.loads(_q(con, "SELECT notes FROM sessions")[0][0]).get("detach_s")
        assert stopped - seen_until < 300_000_000, \
            f"stop {(stopped - seen_until) / 1e9:.2f} s after the last call or gap; detach {detach_s} s"
        assert _q(con, "SELECT count(*) FROM probe_gaps")[0][0] >= 1
        assert _q(con, "SELECT count(*) FROM sched_intervals WHERE pid = ? AND on_ns IS NOT NULL", [rate.pid])[0][0] > 0
        assert _q(con, "SELECT count(*) FROM sched_intervals WHERE tid = ? AND on_ns IS NULL", [hung.pid])[0][0] == 1
        assert _q(con, "SELECT sum(events_lost) FROM collector_stats")[0][0] == 0
    finally:
        con.close()
