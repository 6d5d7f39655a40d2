"""The group natural15 (bench/gpu/zoo/device_zoo.sh natural15): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_15 into its CHECKS; the ways of reading findings it
shares with groups 8 to 14 are natural_shares'."""

from __future__ import annotations

from pathlib import Path

from natural_shares import CHURN, CPU_WAIT_SHARE, CUDA_MALLOCS_PER_S, HOST_ALLOCS_PER_S, HOST_SIDE, INPUT
from natural_shares import PAGE_FAULTS_PER_S
from natural_shares import SECOND, SHARE_SLACK, clocks_agree, feeder_shares, shares_agree
from natural_shares import gpu_busy_rules as _gpu_busy_rules, in_run as _in_run, people as _people
from natural_shares import said as _said, seconds as _seconds
from natural_shares import capped as _capped, own_lead as _own_lead

from ingero_mcp.analysis.models import CausalChain, Report

# Causes that need a quota, a GPU sharer, a network, a child started in the run, a signal, a timer that fires or a GPU
# that slowed down: none of these jobs has them (the collector runs on CPUs of its own; a GIL's timed wait is the
# lock's, not a sleep in the code).
NEVER = {"cpu-throttled", "gpu-shared", "network-wait", "slow-consumer", "spawning-processes", "stopped-by-signal",
         "timed-sleep", "gpu-slower"}
GIL = {"gil-or-lock", "waiting-on-thread"}  # a wait for the interpreter's lock, said as the lock or as its holder
CHURN_COST_SHARE = 0.10  # the steps that called cudaMalloc or cudaFree, their time beyond the same steps uncapped
OVERSUBSCRIBED_WAIT = 0.20  # the main thread off a CPU in the preparation (run-queue wait, barrier sleep), of the run
THIRD = 1 / 3


def _names_tid(c: CausalChain, tids: set[int]) -> bool:
    return any(tids & set(k.tids) for k in _people(c))





def _common(top: list[CausalChain], absent: set[str], pid: int, own: dict) -> None:
    """No finding says a cause in `absent`; every culprit is of the job's process; cpu-contention names none of its
    own threads (that is own-threads-cpu)."""
    assert not any(c.root_cause in absent for c in top), (_said(top), sorted(absent & {c.root_cause for c in top}),
                                                          own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause == "cpu-contention":
            assert not _people(c), (c.summary, c.culprits)


def check_gil_stats_thread(report: Report, truth: dict, store: Path) -> None:
    """A small text classifier (a few hundred short steps a second, loss.item() each, batches drawn on the GPU) whose
    process runs, from its mark `thread` on, a "live dataset stats" thread (truth `stats_thread`: ds_stats) counting
    tokens, bigrams and characters in pure Python the whole time: ~5 s alone, then ~15 s with it, on CPUs 2-3. With
    CPython's GIL enabled (truth `self.gil_enabled`) the two threads run bytecode in turn and every torch op that
    releases the GIL must take it back from the stats thread: a wait on a lock its thread holds. No HIGH or MEDIUM
    finding (in the measured run) says a cause it did not have: NEVER (the GIL's timed wait is the lock's, not a
    sleep), workers, another process, IO, pageable copies (.item()'s 4 bytes cost their round trip); churn only at
    CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S (the counters grow), own-threads-cpu and cpu-contention
    only where the main thread waited for a CPU CPU_WAIT_SHARE of the run or of the stretch with the thread, a lock or a
    wait on a thread only with the GIL enabled. No culprit outside its process; cpu-contention names none of its own
    threads. A lock or a wait on a thread names the stats thread (its tid or name), not only PyTorch's autograd thread
    (whose backward is the step's own work); a finding that names the stats thread has no window starting over a
    second before the thread started (it did not exist). The findings that blame the stats thread (a lock, a wait on a
    thread, any naming it) explain no more than the main thread was off a CPU in the stretch with it (schedstat) plus
    half a second; own-threads-cpu no more than the main thread's wait for a CPU; the host side (HOST_SIDE) no more
    than the main thread's CPU time and .item() (revised after the first score: and its sleep in the stretch alone,
    where it waited on PyTorch's autograd thread's backward, the step's own host work); each plus half a second.
    With the GIL enabled and the stretch with the thread slower than its steps at the rate alone by a second and a
    tenth of the run or more (`lost_s`), a HIGH or
    MEDIUM lock, wait on a thread (or own-threads-cpu where allowed) names the stats thread and those explain at least
    half the smaller of that loss and the main thread's extra time off a CPU with the thread (against alone); with the
    loss a third of the run or more and more than the main thread's CPU time, the report leads with one of them, naming
    the stats thread. GPU busy (a step's kernels measured queued) under 40% in both stretches: nothing gpu-bound; under
    40% over the run: the lead is the host side or those allowed above; 80% or more: the host side explains no more than
    the GPU's idle time plus half a second. The main thread's time on a CPU and waiting for one, over the run and in
    each stretch, is its own clocks' (SHARE_SLACK); with the thread, its sleep outside CUDA calls and wait for a CPU are
    at least its extra share off a CPU against alone, less SHARE_SLACK (the GIL is taken back outside CUDA calls)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    stid, scomm = truth["stats_thread"]["tid"], truth["stats_thread"]["comm"]
    split, (lo, hi) = truth["marks_ns"]["thread"], truth["baseline_ns"]
    top = _in_run(report, truth)
    gil = bool(own["gil_enabled"])
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    waited = max(own["main_cpu_wait_share"], own["main_cpu_wait_share_with"]) >= CPU_WAIT_SHARE
    absent = NEVER | {"waiting-on-workers", "waiting-on-process", "own-workers-cpu", "io-wait", "pageable-copies"}
    absent |= (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= (set() if waited else {"own-threads-cpu", "cpu-contention"}) | (set() if gil else GIL)
    _common(top, absent, pid, own)

    def on_stats(c: CausalChain) -> bool:
        return any(stid in k.tids or k.comm == scomm for k in _people(c))

    for c in top:
        if c.root_cause in GIL:
            assert on_stats(c), (c.summary, c.culprits, stid)
        if on_stats(c) and c.window is not None:
            assert c.window.start_ns >= split - SECOND, (c.summary, c.window, split)
    blamed = [c for c in top if c.root_cause in GIL or on_stats(c)]
    off_with = own["wall_with_s"] - own["main_run_s_with"]
    assert _seconds(blamed) <= off_with + 0.5, (_said(blamed), own)
    assert _seconds(top, {"own-threads-cpu"}) <= own["main_cpu_wait_s"] + 0.5, (_said(top), own)
    # the host side counts the main thread's waits on PyTorch's autograd thread (its backward: the step's own host
    # work, as natural_rnn_unrolled taught), which the stretch alone spent asleep: revised after the first score
    host_cap = own["main_run_s"] + own["main_sleep_s_alone"] + own["item_s"] + 0.5
    assert _seconds(top, HOST_SIDE) <= host_cap, (_said(top), own)
    said_of = GIL | ({"own-threads-cpu"} if waited else set())
    lost = max(own["lost_s"] or 0.0, 0.0)
    if gil and lost >= max(1.0, 0.1 * own["wall_s"]):
        named = [c for c in top if c.root_cause in said_of and on_stats(c)]
        assert named, (_said(top), stid, own)
        floor = min(lost, max(own["main_extra_off_cpu_s_with"], 0.0))
        assert _seconds(named) >= 0.5 * floor, (_said(named), own)
        if lost >= THIRD * own["wall_s"] and lost > own["main_run_s"]:
            _own_lead(top, said_of, pid, own)
            assert on_stats(top[0]), (top[0].summary, top[0].culprits, stid)
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set())
    allowed |= {"own-threads-cpu"} if waited else set()
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if max(own["gpu_busy_share_alone"], own["gpu_busy_share_with"]) < 0.4:
        assert not any(c.root_cause == "gpu-bound" for c in top), _said(top)
    if busy < 0.4:
        lead = HOST_SIDE | allowed | (GIL if gil else set())
        assert top and top[0].root_cause in lead, (_said(top), sorted(lead), own)
    elif busy >= 0.8:
        assert _seconds(top, HOST_SIDE | allowed) <= (1 - busy) * own["wall_s"] + 0.5, (_said(top), own)
    clocks_agree(report, truth)
    for part, (a, z) in (("alone", (lo, split)), ("with", (split, hi))):
        shares_agree(feeder_shares(report, {**truth, "baseline_ns": [a, z]}),
                     {"main_cpu_share": own[f"main_cpu_share_{part}"],
                      "main_cpu_wait_share": own[f"main_cpu_wait_share_{part}"]})
    shares = feeder_shares(report, {**truth, "baseline_ns": [split, hi]})
    stalled = shares["sleep_outside_ns"] + shares["cpu_wait_ns"]
    assert stalled >= own["main_extra_off_cpu_share_with"] - SHARE_SLACK, (shares, own)


def check_alloc_fraction_limit(report: Report, truth: dict, store: Path) -> None:
    """A GPT-style LM on batches of a random shape (batch 4-16, length 128-1024: 32 shapes), bf16 autocast, loss.item()
    each step, in a process capped with torch.cuda.set_per_process_memory_fraction at 1.2x the largest batch's peak
    (truth `self.cap_bytes`): where no cached block fits and a new segment would pass the cap, the caching allocator
    frees cached segments (cudaFree, which waits for the GPU) and allocates again (cudaMalloc), retrying after freeing
    them all; a batch that still does not fit is caught (OutOfMemoryError) and skipped. One process on CPUs 2-3, batches
    on the GPU, no other thread of its own but PyTorch's. No HIGH or MEDIUM finding (in the measured run) says a cause
    it did not have: NEVER, an input wait (a wait on a thread: the autograd thread's backward is the step's own work),
    workers, IO, a lock (the allocator's lock is taken by its own threads in turn), pageable copies (.item()'s 4 bytes
    cost their round trip); churn (allocator-churn, driver-lock) only where its cudaMalloc calls reached
    CUDA_MALLOCS_PER_S or the steps that called cudaMalloc or cudaFree took CHURN_COST_SHARE of the run beyond the same
    steps uncapped (`churn_extra_share`: if the cap cost nothing, the reading is a healthy one), page faults only at
    PAGE_FAULTS_PER_S, own-threads-cpu and cpu-contention only where the main thread waited for a CPU CPU_WAIT_SHARE of
    the run or more. No culprit outside its process; cpu-contention names none of its own threads. Churn explains no
    more than the steps that called cudaMalloc or cudaFree and the skipped ones took; excess-sync no more than .item()
    and those steps (cudaFree's wait for the GPU); launch-bound and host-bound no more than the main thread's CPU time;
    each plus half a second (over the findings' windows). With those steps CHURN_COST_SHARE of the run or more beyond
    uncapped, a HIGH or MEDIUM churn finding says it and churn explains at least a third of that extra time; with the
    run a third or more slower than the same steps uncapped (`lost_share`) and those steps at least half of that, the
    report leads with churn, said of the job's process. GPU busy (each step's kernels measured queued at its shape)
    under 40%: the lead is the host side or those allowed above, nothing gpu-bound; 80% or more: the host side and churn
    explain no more than the GPU's idle time plus half a second. The main thread's time inside CUDA calls is at least
    its .item() share (a copy and a wait for the GPU), less SHARE_SLACK; its time on a CPU and waiting for one, its own
    clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    top = _in_run(report, truth)
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S or own["churn_extra_share"] >= CHURN_COST_SHARE
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    absent = NEVER | INPUT | {"own-workers-cpu", "io-wait", "gil-or-lock", "pageable-copies"}
    absent |= (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= set() if waited else {"own-threads-cpu", "cpu-contention"}
    _common(top, absent, pid, own)
    allocating = own["churn_steps_s"] + own["skipped_s"]
    _capped(top, CHURN, allocating, own)
    _capped(top, {"excess-sync"}, own["item_s"] + allocating, own)
    _capped(top, {"launch-bound", "host-bound"}, own["main_run_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    if own["churn_extra_share"] >= CHURN_COST_SHARE:
        named = [c for c in top if c.root_cause in CHURN]
        assert named, (_said(top), own)
        assert _seconds(named) >= THIRD * own["churn_extra_s"], (_said(named), own)
        if own["lost_share"] >= THIRD and own["churn_extra_s"] >= 0.5 * own["lost_s"]:
            _own_lead(top, CHURN, pid, own)
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set())
    allowed |= {"own-threads-cpu"} if waited else set()
    _gpu_busy_rules(top, own, HOST_SIDE | allowed, HOST_SIDE | allowed)
    shares = clocks_agree(report, truth)
    inside = shares["run_inside_ns"] + shares["sleep_inside_ns"]
    assert inside >= own["item_share"] - SHARE_SLACK, (shares, own)


def check_omp_threads_oversubscribed(report: Report, truth: dict, store: Path) -> None:
    """A small conv net fed batches prepared in the main thread with torch CPU ops (index_select, an antialiased resize,
    flips, jitter, a blur, normalisation) under torch.set_num_threads(8) on a job pinned to 2 CPUs (truth `intra_op`:
    PyTorch's OpenMP threads, on the same CPUs), each batch pinned (pin_memory) and copied, a synchronise after the
    copy, loss.item() each step. One process, no workers, no IO, no sleep of its own. No HIGH or MEDIUM finding (in the
    measured run) says a cause it did not have: NEVER, workers, another process, IO, a lock (the main thread's waits in
    the preparation are OpenMP's barriers, on its own threads), pageable copies (the batches are pinned; .item()'s 4
    bytes cost their round trip); churn only at CUDA_MALLOCS_PER_S cudaMalloc or HOST_ALLOCS_PER_S cudaHostAlloc calls a
    second, page faults only at PAGE_FAULTS_PER_S, own-threads-cpu and cpu-contention only where the main thread waited
    for a CPU CPU_WAIT_SHARE of the run or more, a wait on a thread only with more than one intra-op thread, naming one
    of them (the autograd thread's backward is the step's own work). No culprit outside its process; cpu-contention
    names none of its own threads, and where the OpenMP threads ran at least as long as its other threads but the main
    one, own-threads-cpu names an OpenMP thread. What the OpenMP threads can have cost (own-threads-cpu, cpu-contention,
    a wait on a thread) is at most the main thread's wait for a CPU, its sleep in the preparation and the copies
    (pin_memory's copy is parallel too); excess-sync no more than the copies (with their synchronise) and .item();
    launch-bound no more than the queueing; host-bound no more than the main thread's CPU time; each plus half a second
    (over the findings' windows). With the preparation a third of the run or more, the report leads with it, said of the
    job's process: host-bound (the main thread's own work), own-threads-cpu or a wait on a thread (naming an OpenMP
    thread) where allowed, or page faults where true. With more intra-op threads than CPUs and the main thread off a CPU
    in the preparation (waiting for one, or asleep at the barriers) OVERSUBSCRIBED_WAIT of the run or more, a HIGH or
    MEDIUM own-threads-cpu or wait on a thread names an OpenMP thread, and those explain at least a third of that time.
    GPU busy (a step's copy and kernels measured queued) under 40%: the lead is the host side or those allowed above,
    nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second. The main thread's
    time running outside CUDA calls is at least its CPU time in the preparation, its sleep outside them and wait for a
    CPU at least its wait and sleep there, its time outside them at least the preparation's share, and its time inside
    them at least its .item() share, less SHARE_SLACK each (the preparation calls nothing of CUDA); its time on a CPU
    and waiting for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    intra = set(truth["intra_op"]["tids"])
    top = _in_run(report, truth)
    wall = own["wall_s"]
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S or (own["host_allocs_per_s"] or 0.0) >= HOST_ALLOCS_PER_S
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    pool = own["intra_op_threads"] > 1 and bool(intra)
    absent = NEVER | {"waiting-on-workers", "waiting-on-process", "own-workers-cpu", "io-wait", "gil-or-lock",
                      "pageable-copies"}
    absent |= (set() if faults else {"page-faults"}) | (set() if churn else CHURN)
    absent |= (set() if waited else {"own-threads-cpu", "cpu-contention"}) | (set() if pool else {"waiting-on-thread"})
    _common(top, absent, pid, own)
    intra_led = (own["intra_op_run_s"] or 0.0) >= (own["other_threads_run_s"] or 0.0)
    for c in top:
        if c.root_cause == "waiting-on-thread" or (c.root_cause == "own-threads-cpu" and intra_led):
            assert _names_tid(c, intra), (c.summary, c.culprits, sorted(intra))
    threads_cost = (own["main_cpu_wait_s"] or 0.0) + own["prep_sleep_s"] + own["copy_s"]  # pin_memory's copy: OpenMP
    _capped(top, {"own-threads-cpu", "cpu-contention", "waiting-on-thread"}, threads_cost, own)
    _capped(top, {"excess-sync"}, own["copy_s"] + own["item_s"], own)
    _capped(top, {"launch-bound"}, own["issue_s"], own)
    _capped(top, {"host-bound"}, own["main_run_s"] or wall, own)
    mine = {"host-bound", "own-threads-cpu", "waiting-on-thread"} - absent
    if own["prep_share"] >= THIRD:
        _own_lead(top, mine | ({"page-faults"} if faults else set()), pid, own)
    prep_off_cpu = own["prep_wait_s"] + own["prep_sleep_s"]
    if own["intra_op_threads"] > own["job_cpus"] and prep_off_cpu >= OVERSUBSCRIBED_WAIT * wall:
        named = [c for c in top if c.root_cause in ("own-threads-cpu", "waiting-on-thread") and _names_tid(c, intra)]
        assert named, (_said(top), sorted(intra), own)
        assert _seconds(named) >= THIRD * prep_off_cpu, (_said(named), own)
    allowed = mine | (CHURN if churn else set()) | ({"page-faults"} if faults else set())
    _gpu_busy_rules(top, own, HOST_SIDE | allowed, HOST_SIDE | allowed)
    shares = clocks_agree(report, truth)
    assert shares["run_outside_ns"] >= own["prep_run_share"] - SHARE_SLACK, (shares, own)
    stalled = shares["sleep_outside_ns"] + shares["cpu_wait_ns"]
    assert stalled >= own["prep_wait_share"] + own["prep_sleep_share"] - SHARE_SLACK, (shares, own)
    outside = shares["run_outside_ns"] + shares["sleep_outside_ns"] + shares["cpu_wait_ns"]
    assert outside >= own["prep_share"] - SHARE_SLACK, (shares, own)
    inside = shares["run_inside_ns"] + shares["sleep_inside_ns"]
    assert inside >= own["item_share"] - SHARE_SLACK, (shares, own)


CHECKS_15 = {"natural_gil_stats_thread": check_gil_stats_thread,
             "natural_alloc_fraction_limit": check_alloc_fraction_limit,
             "natural_omp_threads_oversubscribed": check_omp_threads_oversubscribed}
