"""The group natural20 (bench/gpu/zoo/device_zoo.sh natural20): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_20 into its CHECKS; the ways of reading findings it
shares with groups 8 to 19 are natural_shares'."""

from __future__ import annotations

import re
from pathlib import Path

from natural_shares import CHURN, CPU_WAIT_SHARE, CUDA_MALLOCS_PER_S, HOST_SIDE, INPUT, PAGE_FAULTS_PER_S
from natural_shares import SHARE_SLACK, clocks_agree, feeder_shares, shares_agree
from natural_shares import gpu_busy_rules as _gpu_busy_rules, in_run as _in_run, people as _people
from natural_shares import said as _said, seconds as _seconds
from natural_shares import capped as _capped
from test_zoo import SECOND

from ingero_mcp.analysis.models import CausalChain, Report

# Causes that need a quota, a GPU sharer (another process), a network, a slow reader, a signal, a timer that fires, a
# GPU that slowed down, a child process or worker processes: none of these jobs has them (the collector runs on CPUs
# of its own; CPython's GIL and threading.Lock wait with timeouts that are the lock's, not a sleep).
NEVER = {"cpu-throttled", "gpu-shared", "network-wait", "slow-consumer", "stopped-by-signal", "timed-sleep",
         "gpu-slower", "spawning-processes", "waiting-on-process", "waiting-on-workers", "own-workers-cpu"}
THREAD_WAIT = {"waiting-on-thread", "gil-or-lock"}  # a wait on a thread of the process, said as the thread or a lock
THIRD = 1 / 3
WAITED_SHARE = 0.10  # a wait this share of the run or more: it held the loop up
GPU_BOUND = 0.85  # the GPU busy this share of the run or more: the job is GPU-bound
KEPT_RATE = 0.9  # the step rate during the rotations at least this share of the rate outside them: nothing lost
LOCK_WORDS = re.compile(r"\block|mutex|futex|GIL\b", re.IGNORECASE)


def _by_rates(own: dict, waited: bool) -> tuple[set[str], set[str]]:
    """(absent, allowed): the causes the truth's rates rule out, and those they make true."""
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    absent = (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= set() if waited else {"own-threads-cpu", "cpu-contention"}
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set()) | (
        {"own-threads-cpu"} if waited else set())
    return absent, allowed


def _thread_shares(report: Report, truth: dict, tid: int) -> dict[str, float]:
    """A thread's time by part over the measured run (feeder_shares for a thread other than the feeder)."""
    return feeder_shares(report, {**truth, "feeder": {**truth["feeder"], "tid": tid}})


def check_two_thread_serving(report: Report, truth: dict, store: Path) -> None:
    """A naive two-model inference service: an MLP (batch 8) and a small conv net (batch 4) served under no_grad by two
    Python threads of one process (truth `servers`: serve_mlp, the feeder, and serve_cnn), each on a CUDA stream of its
    own, each request a dozen or two short kernels, a small pageable copy in and .cpu() of the result (a wait for its
    stream); request queues kept full by two generator threads (truth `generators`). One process on CPUs 2-3, no
    workers, no children, no IO, no sleep of its own in the servers. No HIGH or MEDIUM finding (in the measured run)
    says a cause it did not have: NEVER, IO; churn only at CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S,
    own-threads-cpu and cpu-contention only where a server waited for a CPU CPU_WAIT_SHARE of the run or more; an input
    wait (a wait on a thread) or a lock only with the GIL enabled or a server in get() off its CPU WAITED_SHARE of the
    run. No culprit outside the process. A lock or a wait on a thread names a server or a generator (its tid or name),
    not only PyTorch's own threads; a generator alone only where a server spent WAITED_SHARE of the run in get() off
    a CPU or the generators ran WAITED_SHARE of it (else they held nobody up). The findings that blame threads (a lock,
    a wait on a thread) explain no more than the servers' time off a CPU outside .cpu() (their GIL and queue waits);
    own-threads-cpu and cpu-contention no more than their wait for a CPU; host-bound and launch-bound no more than their
    CPU time and the GIL's wait; pageable copies and excess-sync no more than their time in the copy in and .cpu();
    each plus half a second (over the findings' longest window). With the GIL enabled and serve_mlp asleep outside get()
    and .cpu() (the GIL's wait, a floor) a third of the run or more, the report leads with a lock, a wait on a thread or
    (where a server waited for a CPU) own-threads-cpu, naming another thread of the process; with that wait WAITED_SHARE
    or more for both servers, HIGH or MEDIUM locks and waits on threads explain at least half the smaller server's GIL
    wait. GPU busy (both models' requests' GPU time queued, summed) under 40%: the lead is the host side, a lock or a
    wait on a thread or those the rates allow, nothing gpu-bound; 80% or more: those explain no more than the GPU's idle
    time plus half a second. Both servers' time on a CPU and waiting for one is their own clocks' (SHARE_SLACK); the
    feeder's time asleep (in and outside CUDA calls) is at least its GIL wait floor less SHARE_SLACK."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    srv = {s["model"]: s for s in truth["servers"]}
    gens = {g["tid"] for g in truth["generators"]}
    mine = {s["tid"] for s in srv.values()} | gens
    comm_tid = {x["comm"]: x["tid"] for x in truth["servers"] + truth["generators"]}
    top = _in_run(report, truth)
    wall = own["wall_s"]
    a, b = own["mlp"], own["cnn"]
    waited = any(x["cpu_wait_share"] is None or x["cpu_wait_share"] >= CPU_WAIT_SHARE for x in (a, b))
    absent, allowed = _by_rates(own, waited)
    absent |= NEVER | {"io-wait"}
    get_off = max(a["get_off_s"], b["get_off_s"])
    gil = bool(own["gil_enabled"])
    if not gil and get_off < WAITED_SHARE * wall:
        absent |= THREAD_WAIT | INPUT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    gens_held = get_off >= WAITED_SHARE * wall or (own["generator_cpu_share"] or 0.0) >= WAITED_SHARE

    def named(c: CausalChain) -> set[int]:
        """The tids a finding names, by tid or by a thread's name."""
        return {t for k in _people(c) for t in k.tids} | {comm_tid[k.comm] for k in _people(c) if k.comm in comm_tid}

    for c in top:
        if c.root_cause in THREAD_WAIT | INPUT:
            got = named(c) & mine
            assert got, (c.summary, c.culprits, sorted(mine))
            if not gens_held:
                assert got - gens, (c.summary, c.culprits, "a generator blamed, which held nobody up")
    off = sum(max(0.0, wall - (x["run_s"] or 0.0) - (x["cpu_wait_s"] or 0.0) - x["fetch_off_s"]) for x in (a, b))
    _capped(top, THREAD_WAIT | INPUT, off, own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, sum(x["cpu_wait_s"] or 0.0 for x in (a, b)), own)
    gil_lb = sum(x["gil_wait_lb_s"] or 0.0 for x in (a, b))
    _capped(top, {"host-bound", "launch-bound"}, sum(x["run_s"] or 0.0 for x in (a, b)) + gil_lb, own)
    _capped(top, {"pageable-copies", "excess-sync"}, sum(x["h2d_s"] + x["fetch_s"] for x in (a, b)), own)
    lead = THREAD_WAIT | INPUT | ({"own-threads-cpu"} if waited else set())
    if gil and (a["gil_wait_lb_share"] or 0.0) >= THIRD:
        assert top and top[0].root_cause in lead - absent, (_said(top), own)
        assert named(top[0]) & mine, (top[0].summary, top[0].culprits, sorted(mine))
    if gil and min(a["gil_wait_lb_share"] or 0.0, b["gil_wait_lb_share"] or 0.0) >= WAITED_SHARE:
        least = min(a["gil_wait_lb_s"], b["gil_wait_lb_s"])
        assert _seconds(top, THREAD_WAIT | INPUT) >= 0.5 * least, (_said(top), own)
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed)
    shares = clocks_agree(report, truth)
    asleep = shares["sleep_inside_ns"] + shares["sleep_outside_ns"]
    assert asleep >= (a["gil_wait_lb_share"] or 0.0) - SHARE_SLACK, (shares, own)
    shares_agree(_thread_shares(report, truth, b["tid"]),
                 {"main_cpu_share": b["cpu_share"], "main_cpu_wait_share": b["cpu_wait_share"]})


def check_locked_sample_cache(report: Report, truth: dict, store: Path) -> None:
    """A conv net fed by a ThreadPoolExecutor of its own process (cache_pool_0..3, truth `pool`), one batch of 64
    prefetched, all on CPUs 2-5: each sample read through an LRU cache of decoded images behind ONE threading.Lock held
    over the lookup-or-load, a miss (about two in three) inflated with zlib under it, so the pool's threads decode one
    at a time and queue on the lock; the main thread waits in f.result(), stacks, copies the batch (pageable, ~12 MB)
    and trains. No workers, no children, no file IO, no sleep. No HIGH or MEDIUM finding (in the measured run) says a
    cause it did not have: NEVER, IO; churn only at CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S (the
    decoded copies are large numpy arrays), own-threads-cpu and cpu-contention only where the main thread or the pool
    waited for a CPU CPU_WAIT_SHARE of the run (of the pool's thread time) or more; a wait on a thread or a lock only
    where the main thread was in f.result() off its CPU WAITED_SHARE of the run or more. No culprit outside the process.
    A wait on a thread or a lock names a pool thread (its tid or name), not only the autograd thread. Those explain no
    more than the main thread's time in f.result() off its CPU; pageable copies and excess-sync no more than stacking
    and copying and .item(); host-bound no more than the main thread's CPU time; own-threads-cpu and cpu-contention no
    more than its wait for a CPU; each plus half a second. In f.result() a third of the run or more: the report leads
    with the wait on the pool (a wait on a thread, a lock, or own-threads-cpu where true), naming a pool thread, and
    those explain at least half the main thread's time in f.result() off its CPU; and with the pool's threads waiting
    for the cache lock half their time or more, some finding (any severity, in the run) says the lock: gil-or-lock
    naming a pool thread, or a finding on the pool whose summary or explanation speaks of a lock. Under a tenth, no
    input wait. GPU busy (a step's kernels measured queued from a batch on the GPU) 85% or more: no input wait, lock or
    host-side finding; under 40%: the lead is the host side or the wait on the pool, nothing gpu-bound; 80% or more:
    those explain no more than the GPU's idle time plus half a second. The main thread's sleep outside CUDA calls and
    wait for a CPU are at least its time in f.result() off its CPU less SHARE_SLACK; its time on a CPU and waiting for
    one, its own clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    pool, comms = set(truth["pool"]["tids"]), set(truth["pool"]["comms"])
    top = _in_run(report, truth)
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE or (
        own["pool_cpu_wait_share"] or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _by_rates(own, waited)
    absent |= NEVER | {"io-wait"}
    wait_off = own["wait_off_cpu_s"]
    if wait_off < WAITED_SHARE * own["wall_s"]:
        absent |= THREAD_WAIT | INPUT
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= GPU_BOUND:
        absent |= HOST_SIDE | INPUT | THREAD_WAIT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]

    def on_pool(c: CausalChain) -> bool:
        return any(pool & set(k.tids) or k.comm in comms or (k.comm or "").startswith("cache_pool")
                   for k in _people(c))

    for c in top:
        if c.root_cause in THREAD_WAIT | INPUT:
            assert on_pool(c), (c.summary, c.culprits, sorted(pool))
    _capped(top, THREAD_WAIT | INPUT, wait_off, own)
    _capped(top, {"pageable-copies", "excess-sync"}, own["stack_copy_s"] + own["item_s"], own)
    _capped(top, {"host-bound"}, own["main_run_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    lead = THREAD_WAIT | INPUT | ({"own-threads-cpu"} if waited else set())
    if own["wait_share"] >= THIRD:
        assert top and top[0].root_cause in lead - absent and on_pool(top[0]), (_said(top), own)
        assert _seconds([c for c in top if c.root_cause in lead and on_pool(c)]) >= 0.5 * wait_off, (_said(top), own)
        if (own["lock_wait_share_of_pool"] or 0.0) >= 0.5:
            lo, hi = truth["baseline_ns"]
            seen = [c for c in report.chains if c.origin == "ingero-mcp" and on_pool(c) and (
                c.root_cause == "gil-or-lock" or LOCK_WORDS.search(f"{c.summary} {c.explanation}")) and (
                c.window is None or min(c.window.end_ns, hi) - max(c.window.start_ns, lo) > SECOND // 2)]
            assert seen, (_said(report.chains), own)
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed)
    shares = clocks_agree(report, truth)
    floor = wait_off / own["wall_s"] - SHARE_SLACK
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= floor, (shares, own)


def check_healthy_log_rotation(report: Report, truth: dict, store: Path) -> None:
    """A control: a GPU-bound MLP (three 4096x4096 layers, batch 8192, fp32: tens of ms of GPU work a step) that copies
    4,096 per-sample losses to the host each step (.cpu(): its one wait for the GPU) and writes them as text to its log;
    every ~3 s it rotates the log and a thread of its process (truth `rotator`: log_rotate, pinned to the job's second
    CPU) gzips the rotated file at level 9, ~0.5-1 s of CPU each time (truth `gzips_ns`). One process on CPUs 2-3, no
    workers, no children, no lock of its own, no sleep. No HIGH or MEDIUM finding (in the measured run) says a cause it
    did not have: NEVER, an input wait (the autograd thread's backward is the step's own work; a wait on a thread only
    where the rate fell, below), pageable copies beyond
    the .cpu() calls' time; churn only at CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S; own-threads-cpu and
    cpu-contention only where the main thread waited for a CPU CPU_WAIT_SHARE of the run or more; io-wait no more than
    the main thread's time writing and rotating the log (the page cache, no fsync). No culprit outside the process.
    The job measured itself GPU-bound (busy GPU_BOUND or more) and its step rate during the compressions at least
    KEPT_RATE of the rate outside them: no HIGH or MEDIUM finding but gpu-bound and the churn or page faults the rates
    make true; none names the rotator (its tid or name), none says a host-side cause, a lock, a wait on a thread or the
    threads' CPUs. Where the rate did fall during the compressions (the rotator took the CPU or the GIL the main thread
    needed), what is true is a lock (the GIL), a wait on a thread or own-threads-cpu (where the main thread waited for a
    CPU) naming the rotator: those, and any finding naming the rotator, explain no more than the steps lost during the
    compressions (`lost_in_gzip_s`) plus half a second; with that loss a tenth of the run or more, the report shows it:
    a finding naming the rotator (any severity) for at least half the loss, or a recurrent phase whose episodes overlap
    half the compressions or more. GPU busy under 40% (the premise wrong): the lead is the host side or the above,
    nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second. The main thread's
    time inside CUDA calls is at least half its .cpu() share less SHARE_SLACK; its time on a CPU and waiting for one,
    its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    rtid, rcomm = truth["rotator"]["tid"], truth["rotator"]["comm"] or "log_rotate"
    top = _in_run(report, truth)
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    absent, allowed = _by_rates(own, waited)
    kept = own["in_over_outside"] is None or own["in_over_outside"] >= KEPT_RATE
    absent |= NEVER | (INPUT if kept else INPUT - {"waiting-on-thread"})
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]

    def on_rotator(c: CausalChain) -> bool:
        return any(rtid in k.tids or k.comm == rcomm for k in _people(c))

    _capped(top, {"io-wait"}, own["log_s"] + own["rotate_s"], own)
    _capped(top, {"pageable-copies"}, own["fetch_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    _capped(top, {"host-bound"}, own["main_run_s"], own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= GPU_BOUND and kept:
        ok = {"gpu-bound"} | allowed - {"own-threads-cpu"}
        assert all(c.root_cause in ok for c in top), (_said(top), own)
        assert not any(on_rotator(c) for c in top), [(c.summary, c.culprits) for c in top]
    blamed = [c for c in top if c.root_cause in THREAD_WAIT or on_rotator(c)]
    for c in top:
        if c.root_cause in THREAD_WAIT:
            assert on_rotator(c), (c.summary, c.culprits, rtid)
    _capped(blamed, {c.root_cause for c in blamed}, own["lost_in_gzip_s"], own)
    if own["lost_in_gzip_s"] >= 0.1 * own["wall_s"]:
        lo, hi = truth["baseline_ns"]
        shown = [c for c in report.chains if c.origin == "ingero-mcp" and on_rotator(c)
                 and (c.window is None or min(c.window.end_ns, hi) - max(c.window.start_ns, lo) > SECOND // 2)]
        assert report.accounting is not None
        rec = [p for p in report.accounting.phases if p.kind == "recurrent"]
        seen = max([sum(any(w.start_ns < e and s < w.end_ns for w in p.episodes) for s, e in truth["gzips_ns"])
                    for p in rec] or [0])
        assert _seconds(shown) >= 0.5 * own["lost_in_gzip_s"] or 2 * seen >= len(truth["gzips_ns"]), \
            (_said(shown), rec, own)
    lead = THREAD_WAIT | ({"own-threads-cpu"} if waited else set())
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed)
    shares = clocks_agree(report, truth)
    inside = shares["sleep_inside_ns"] + shares["run_inside_ns"]
    assert inside >= 0.5 * own["fetch_share"] - SHARE_SLACK, (shares, own)


CHECKS_20 = {"natural_two_thread_serving": check_two_thread_serving,
             "natural_locked_sample_cache": check_locked_sample_cache,
             "natural_healthy_log_rotation": check_healthy_log_rotation}
