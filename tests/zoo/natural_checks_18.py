"""The group natural18 (bench/gpu/zoo/device_zoo.sh natural18): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_18 into its CHECKS; the ways of reading findings it
shares with groups 8 to 17 are natural_shares'."""

from __future__ import annotations

from pathlib import Path

from natural_shares import CHURN, CPU_WAIT_SHARE, CUDA_MALLOCS_PER_S, HOST_SIDE, INPUT, PAGE_FAULTS_PER_S
from natural_shares import SECOND, SHARE_SLACK, STARVED_SHARE, clocks_agree
from natural_shares import gpu_busy_rules as _gpu_busy_rules, in_run as _in_run, people as _people
from natural_shares import said as _said, seconds as _seconds
from natural_shares import capped as _capped, own_lead as _own_lead

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

# Causes that need a quota, a GPU sharer, a signal, a GPU that slowed down, or a child started in the run: none of these
# jobs has them (the collector runs on CPUs of its own; natural_http_metrics_push's child starts before the run).
NEVER = {"cpu-throttled", "gpu-shared", "stopped-by-signal", "gpu-slower", "spawning-processes"}
# The POSTs' wait for the collector's reply (a child process, over a loopback socket), said as a wait on that process,
# on the network, or on the consumer of what the job sends.
POST_WAIT = {"waiting-on-process", "network-wait", "slow-consumer"}
THREAD_WAIT = {"waiting-on-thread", "gil-or-lock"}  # a wait on a thread of the process, said as the thread or a lock
THIRD = 1 / 3
GPU_BOUND = 0.85  # the GPU busy this share of the run or more: the stream prefetcher's job is GPU-bound
WAITED_SHARE = 0.10  # in get() (asleep) this share of the run or more: the prefetch thread held the loop up


def _rates(own: dict) -> tuple[bool, bool, bool]:
    """(memory churn, page faults, a wait for a CPU) true of the main process over the run, from the truth's rates."""
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    return churn, faults, waited


def _by_rates(churn: bool, faults: bool, waited: bool) -> tuple[set[str], set[str]]:
    """(absent, allowed): the causes the rates rule out, and those they make true."""
    absent = (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= set() if waited else {"own-threads-cpu", "cpu-contention"}
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set())
    allowed |= {"own-threads-cpu"} if waited else set()
    return absent, allowed


def check_http_metrics_push(report: Report, truth: dict, store: Path) -> None:
    """The zoo's MLP (batches on the GPU, fused AdamW, loss.item() each step) that POSTs a small JSON of metrics after
    every step with urllib to a local http.server collector (truth `collector`: metricsd, a child process the job
    started before the run, on a CPU of its own) and waits for each reply; the GPU idles meanwhile (.item() ended the
    step). One process on CPUs 2-3, no thread of its own but PyTorch's autograd thread, no workers, no lock, no timed
    sleep, no file IO but the collector's small appends. No HIGH or MEDIUM finding (in the measured run) says a cause it
    did not have: NEVER, a wait on workers or a thread (the autograd thread's backward is the step's own work; the
    reply comes from a process), a lock, IO, pageable copies (.item()'s 4 bytes cost their round trip), a timed sleep;
    the workers' CPUs only where the collector waited for a CPU STARVED_SHARE of the run; churn only at
    CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S; own-threads-cpu and cpu-contention only where the main
    thread waited for a CPU CPU_WAIT_SHARE of the run or more. Every culprit is the job's process or the collector. A
    wait on a process or a slow consumer names the collector (its pid, or a process other than the job's said its
    child); a network wait names no other task. The POSTs' wait (POST_WAIT) explains no more than the POSTs' time;
    excess-sync no more than .item() and the POSTs (the GPU idles across both); launch-bound no more than queueing the
    steps; host-bound no more than the main thread's CPU time; own-threads-cpu and cpu-contention no more than its wait
    for a CPU; each plus half a second (over the findings' longest window). With the POSTs' time off the main thread's
    CPU a tenth of the run or more, a finding (any severity) of POST_WAIT on the collector (or the network) explains at
    least half of it. With the POSTs a third of the run or more, the report leads with them, said of the job's process
    or the collector: a POST_WAIT where their time off a CPU is at least their CPU time less SHARE_SLACK, host-bound
    where their CPU time is at least their time off it less SHARE_SLACK. GPU busy (a step's kernels measured queued)
    under 40%: the lead is the host side or the POSTs, nothing gpu-bound; 80% or more: those explain no more than the
    GPU's idle time plus half a second. The main thread's sleep outside CUDA calls and wait for a CPU are at least the
    POSTs' time off its CPU less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    col = truth["collector"]
    cpid, ctids = col["pid"], set(col["tids"])
    assert not own["collector_shares_job_cpus"], "the collector shared the job's CPUs: not the job checked here"
    top = _in_run(report, truth)
    churn, faults, waited = _rates(own)
    starved = (own["collector_cpu_wait_s"] or 0.0) >= STARVED_SHARE * own["wall_s"]

    def on_collector(k: Culprit) -> bool:
        child = k.pid not in (None, pid) and k.relation == "child process"
        return k.pid == cpid or bool(ctids & set(k.tids)) or child

    absent, allowed = _by_rates(churn, faults, waited)
    absent |= NEVER | (INPUT - {"waiting-on-process"}) | {"gil-or-lock", "io-wait", "pageable-copies", "timed-sleep"}
    absent |= set() if starved else {"own-workers-cpu"}
    allowed |= {"own-workers-cpu"} if starved else set()
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or on_collector(k) for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in POST_WAIT - {"network-wait"} or c.root_cause == "own-workers-cpu":
            assert any(on_collector(k) for k in _people(c)), (c.summary, c.culprits, cpid)
        if c.root_cause == "network-wait":
            assert all(k.pid == pid or on_collector(k) for k in _people(c)), (c.summary, c.culprits)
    _capped(top, POST_WAIT | {"own-workers-cpu"}, own["post_s"], own)
    _capped(top, {"excess-sync"}, own["item_s"] + own["post_s"], own)
    _capped(top, {"launch-bound"}, own["issue_s"], own)
    _capped(top, {"host-bound"}, own["main_run_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    if own["post_off_cpu_share"] >= 0.1:
        lo, hi = truth["baseline_ns"]
        shown = [c for c in report.chains if c.origin == "ingero-mcp" and c.root_cause in POST_WAIT
                 and (c.root_cause == "network-wait" or any(on_collector(k) for k in _people(c)))
                 and (c.window is None or min(c.window.end_ns, hi) - max(c.window.start_ns, lo) > SECOND // 2)]
        assert _seconds(shown) >= 0.5 * own["post_off_cpu_s"], (_said(shown), own)
    if own["post_share"] >= THIRD:
        off, cpu = own["post_off_cpu_share"], own["post_cpu_share"]
        lead = (POST_WAIT if off >= cpu - SHARE_SLACK else set()) | ({"host-bound"} if cpu >= off - SHARE_SLACK
                                                                       else set())
        assert top and top[0].root_cause in lead - absent, (_said(top), sorted(lead), own)
        assert pid in top[0].pids or any(k.pid == pid or on_collector(k) for k in _people(top[0])), \
            (top[0].summary, top[0].pids, top[0].culprits)
    _gpu_busy_rules(top, own, HOST_SIDE | POST_WAIT | allowed, HOST_SIDE | POST_WAIT | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= own["post_off_cpu_share"] - SHARE_SLACK, (shares, own)


def check_foreach_off_optimizer(report: Report, truth: dict, store: Path) -> None:
    """A 250-block residual MLP of 1,004 small parameter tensors (batch 512 on the GPU, fp32) trained with
    AdamW(foreach=False) and clip_grad_norm_(foreach=False): ~10,000 small kernels a step queued one tensor at a time by
    the main thread's Python loop, ~2,000 for clipping, loss.item() each step (the script synchronises after the
    backward, the clipping and the step to time each). One process on CPUs 2-3, no thread of its own but PyTorch's
    autograd thread, no workers, no children, no copies but .item()'s, no IO, no lock, no sleep. No HIGH or MEDIUM
    finding (in the measured run) says a cause it did not have: NEVER, a network, a slow consumer, a timed sleep, an
    input wait (a wait on a thread: the autograd thread's backward is the step's own work), workers, IO, a lock,
    pageable copies; churn only at CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S; own-threads-cpu and
    cpu-contention only where the main thread waited for a CPU CPU_WAIT_SHARE of the run or more. No culprit outside
    its process. Host-bound explains no more than the main thread's CPU time; launch-bound no more than its CPU time and
    wait for a CPU (all but its sleep); excess-sync no more than its sleep (the synchronisations and .item() are where
    it sleeps; the backward's wait on the autograd thread too); own-threads-cpu and cpu-contention no more than its wait
    for a CPU; each plus half a second (over the findings' longest window). With the optimiser's step and the clipping a
    third of the run or more, the GPU busy under 40% and the main thread on a CPU half the run or more (the per-tensor
    loop is its own work), the report leads with launch-bound or host-bound, said of the job's process, and those two
    explain at least half the GPU's idle time. GPU busy (a segment's kernels measured queued, times the segments) under
    40%: the lead is the host side, nothing gpu-bound; 80% or more: the host side explains no more than the GPU's idle
    time plus half a second. Its time on a CPU and waiting for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    top = _in_run(report, truth)
    churn, faults, waited = _rates(own)
    absent, allowed = _by_rates(churn, faults, waited)
    absent |= NEVER | INPUT | {"network-wait", "slow-consumer", "timed-sleep", "own-workers-cpu", "io-wait",
                               "gil-or-lock", "pageable-copies"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    _capped(top, {"host-bound"}, own["main_run_s"], own)
    _capped(top, {"launch-bound"}, own["main_run_s"] + (own["main_cpu_wait_s"] or 0.0), own)
    _capped(top, {"excess-sync"}, own["main_asleep_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if own["opt_clip_share"] >= THIRD and busy < 0.4 and own["main_cpu_share"] >= 0.5:
        loop = {"launch-bound", "host-bound"}
        _own_lead(top, loop, pid, own)
        assert _seconds(top, loop) >= 0.5 * (1 - busy) * own["wall_s"], (_said(top), own)
    _gpu_busy_rules(top, own, HOST_SIDE | allowed, HOST_SIDE | allowed)
    clocks_agree(report, truth)


def check_stream_prefetcher_thread(report: Report, truth: dict, store: Path) -> None:
    """A control: a ResNet-style conv net (batch 256 of 3x128x128, bf16, tens of ms of GPU work a step) fed by a thread
    of its own process (truth `prefetcher`: h2d_prefetch) that gathers batches from pinned memory into pinned staging
    buffers and copies them to the GPU on its own CUDA stream, handing (images, labels, event) over through a
    queue.Queue(maxsize=3); the main thread waits on the event on the GPU (wait_event), not on the host, and reads the
    loss every 10 steps. One process on CPUs 2-3, no workers, no children, no IO, no pageable copies, no sleep of its
    own. No HIGH or MEDIUM finding (in the measured run) says a cause it did not have: NEVER, a network, a slow
    consumer, a timed sleep (the prefetcher's put() times out only to see the end; the main thread's get() has no
    timeout), a wait on workers or a process, workers, IO, pageable copies; churn only at CUDA_MALLOCS_PER_S, page
    faults only at PAGE_FAULTS_PER_S; own-threads-cpu and cpu-contention only where the main thread or the prefetcher
    waited for a CPU CPU_WAIT_SHARE of the run or more; a wait on a thread or a lock only where the main thread slept in
    get() WAITED_SHARE of the run or more, naming the prefetcher (its tid or name), not only the autograd thread. No
    culprit outside the process. The findings that blame the prefetcher (those, or any naming it) explain no more than
    the main thread's time in get() off its CPU plus half a second (over their longest window). The job measured itself
    GPU-bound (busy GPU_BOUND of the run or more): no HIGH or MEDIUM finding but gpu-bound and the churn or page faults
    the rates make true: no wait on the prefetcher, no host-side cause (HOST_SIDE, an input wait, a lock, the threads'
    CPUs). Blocked in get() a third of the run or more (the premise wrong): the report leads with the wait on the
    prefetcher, naming it. GPU busy under 40% (the premise wrong): the lead is the host side or the wait on the
    prefetcher, nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second. The
    main thread's sleep outside CUDA calls and wait for a CPU are at least its time in get() off its CPU less
    SHARE_SLACK, and its time inside CUDA calls at least half its .item() share less SHARE_SLACK; its time on a CPU and
    waiting for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    ptid, pcomm = truth["prefetcher"]["tid"], truth["prefetcher"]["comm"] or "h2d_prefetch"
    top = _in_run(report, truth)
    churn, faults, main_waited = _rates(own)
    waited = main_waited or (own["prefetch_cpu_wait_share"] or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _by_rates(churn, faults, waited)
    absent |= NEVER | {"network-wait", "slow-consumer", "timed-sleep", "waiting-on-workers", "waiting-on-process",
                       "own-workers-cpu", "io-wait", "pageable-copies"}
    get_off = max(0.0, own["get_s"] - own["get_cpu_s"])
    if get_off < WAITED_SHARE * own["wall_s"]:
        absent |= THREAD_WAIT
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= GPU_BOUND:
        absent |= HOST_SIDE | INPUT | THREAD_WAIT | {"own-threads-cpu", "cpu-contention"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]

    def on_prefetcher(c: CausalChain) -> bool:
        return any(ptid in k.tids or k.comm == pcomm for k in _people(c))

    for c in top:
        if c.root_cause in THREAD_WAIT:
            assert on_prefetcher(c), (c.summary, c.culprits, ptid)
    blamed = [c for c in top if c.root_cause in THREAD_WAIT or on_prefetcher(c)]
    _capped(blamed, {c.root_cause for c in blamed}, get_off, own)
    if busy >= GPU_BOUND:
        assert all(c.root_cause in {"gpu-bound"} | (CHURN if churn else set()) | ({"page-faults"} if faults else set())
                   for c in top), (_said(top), own)
    if own["get_share"] >= THIRD:
        assert top and top[0].root_cause in THREAD_WAIT | ({"own-threads-cpu"} if waited else set()), (_said(top), own)
        assert on_prefetcher(top[0]), (top[0].summary, top[0].culprits, ptid)
    _gpu_busy_rules(top, own, HOST_SIDE | THREAD_WAIT | allowed, HOST_SIDE | THREAD_WAIT | allowed)
    shares = clocks_agree(report, truth)
    floor = own["get_share"] - own["get_cpu_share"] - SHARE_SLACK
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= floor, (shares, own)
    inside = shares["sleep_inside_ns"] + shares["run_inside_ns"]
    assert inside >= 0.5 * own["item_share"] - SHARE_SLACK, (shares, own)


CHECKS_18 = {"natural_http_metrics_push": check_http_metrics_push,
             "natural_foreach_off_optimizer": check_foreach_off_optimizer,
             "natural_stream_prefetcher_thread": check_stream_prefetcher_thread}
