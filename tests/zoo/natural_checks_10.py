"""The group natural10 (bench/gpu/zoo/device_zoo.sh natural10): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_10 into its CHECKS. (The helpers below repeat
natural_checks_8's few that these need: test_zoo_natural imports this module.)"""

from __future__ import annotations

from pathlib import Path

from natural_shares import SHARE_SLACK, clocks_agree
from natural_shares import said as _said, seconds as _seconds, gpu_busy_rules as _gpu_busy_rules
from test_zoo import SECOND, _top

from ingero_mcp.analysis.models import CausalChain, Report

HOST_SIDE = {"launch-bound", "host-bound", "excess-sync"}
CHURN = {"allocator-churn", "driver-lock"}  # device memory allocated and released per step
# What one process with no workers, no thread of its own (PyTorch's autograd thread runs the step's own backward), no
# other process beside it, no disk IO, no lock, no sleep and a GPU of its own cannot be slowed by.
ALONE = {"waiting-on-workers", "waiting-on-process", "waiting-on-thread", "own-workers-cpu", "io-wait",
         "cpu-throttled", "cpu-contention", "gpu-shared", "network-wait", "slow-consumer", "spawning-processes",
         "stopped-by-signal", "timed-sleep", "gil-or-lock", "gpu-slower"}
# Where the truth says whether a cause was there at all: from these rates over the run it may be named.
PAGE_FAULTS_PER_S = 10_000.0  # the process's minor page faults a second (getrusage)
CUDA_MALLOCS_PER_S = 10.0  # the device allocator's cudaMalloc calls a second (segment.all.allocated)
MALLOC_GB_PER_S = 1.0  # device memory the allocator reserved anew a second (reserved_bytes.all.allocated)
CPU_WAIT_SHARE = 0.05  # the main thread's wait for a CPU (schedstat run delay), as a share of the run
THIRD = 1 / 3
NOT_A_TASK = ("kernel", "interrupt")  # culprit relations that name no process


def _alone(report: Report, truth: dict, churn: bool | None = None) -> tuple[list[CausalChain], set[str]]:
    """What every job of this group owes: no HIGH or MEDIUM finding names a cause it did not have (ALONE;
    allocator churn or the driver's lock only at CUDA_MALLOCS_PER_S cudaMalloc calls a second (or where `churn` says
    so), page faults only at
    PAGE_FAULTS_PER_S, own-threads-cpu only where the main thread waited for a CPU CPU_WAIT_SHARE of the run or more,
    and then naming its own threads), no culprit outside its process. Returns the findings and the causes allowed by
    the truth's rates (churn, faults, a wait for a CPU)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    top = _top(report)
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S if churn is None else churn
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    absent = ALONE | (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= set() if waited else {"own-threads-cpu"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in c.culprits if k.relation not in NOT_A_TASK), \
        [(c.summary, c.culprits) for c in top]
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set())
    return top, allowed | ({"own-threads-cpu"} if waited else set())


def check_empty_cache_per_step(report: Report, truth: dict, store: Path) -> None:
    """A GPT-style LM on a 16k-token budget of sequences of a bucketed random length (128-2048) from a corpus on the
    GPU, loss.item() and torch.cuda.empty_cache() after every step (the allocator gives its unused segments back with
    cudaFree; the next step cudaMallocs them again); one process on CPUs 2-3, no thread of its own. No HIGH or MEDIUM
    finding names a cause it did not have (_alone), nor pageable copies (it copies nothing to the GPU; .item()'s 4
    bytes cost their round trip), no culprit outside its process. Allocator churn and the driver's lock are true where
    cudaMalloc ran CUDA_MALLOCS_PER_S times a second or more, or the allocator reserved MALLOC_GB_PER_S or more a
    second (its segments mapped anew, where expandable segments spare the cudaMalloc calls), and explain no more than
    what the churn cost (the run's time beyond the same steps without empty_cache(), measured before the run; at least
    the time in empty_cache()), plus a tenth of the run and half a second. That cost a fifth of the run or more (and
    the churn there): a HIGH or MEDIUM churn finding explaining at least a third of it; a third or more: the report
    leads with it. Excess-sync explains no more than .item() and empty_cache() took, plus half a second; launch-bound
    and host-bound together no more than the main thread's time queueing the steps (its cudaMalloc calls included),
    plus half a second. GPU busy (each step's kernels measured queued at its length, its blocks cached) under 40%: the
    report leads with the host side (HOST_SIDE, or the churn, faults or a wait for a CPU where true), nothing
    gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second. The main thread's time
    inside CUDA calls is at least half its share in .item() and empty_cache() (a stream synchronise, cudaFree calls);
    its time on a CPU and waiting for one, its own clocks' (SHARE_SLACK)."""
    own = truth["self"]
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S or (own["malloc_gb_per_s"] or 0.0) >= MALLOC_GB_PER_S
    top, allowed = _alone(report, truth, churn)
    assert not any(c.root_cause == "pageable-copies" for c in top), (_said(top), own)
    wall = own["wall_s"]
    cost = max(own["lost_s"], own["empty_cache_s"])
    assert _seconds(top, CHURN) <= cost + 0.1 * wall + 0.5, (_said(top), own)
    if churn and cost >= 0.2 * wall:
        assert _seconds(top, CHURN) >= THIRD * cost, (_said(top), own)
        if cost >= THIRD * wall:
            assert top and top[0].root_cause in CHURN, (_said(top), own)
    assert _seconds(top, {"excess-sync"}) <= own["item_s"] + own["empty_cache_s"] + 0.5, (_said(top), own)
    assert _seconds(top, {"launch-bound", "host-bound"}) <= own["issue_s"] + 0.5, (_said(top), own)
    _gpu_busy_rules(top, own, HOST_SIDE | allowed, HOST_SIDE | allowed)
    shares = clocks_agree(report, truth)
    inside = shares["run_inside_ns"] + shares["sleep_inside_ns"]
    assert inside >= 0.5 * (own["item_share"] + own["empty_cache_share"]), (shares, own)


def check_gc_token_corpus(report: Report, truth: dict, store: Path) -> None:
    """A byte-level GPT trained from 2.5 million documents held as Python lists (built at set-up, the garbage collector
    on), its batches packed in Python by the main thread (torch.tensor, a 131 KB pageable copy), loss.item() and a
    record per step kept in a list (with 64 small lists of document ids): the collector's collections, each measured
    by gc.callbacks (truth `gc_pauses_ns`: those of 10 ms or more), pause the main thread on the CPU, outside any CUDA
    call, wherever an allocation set them off (mostly in the packing). One process on CPUs 2-3, no thread of its own.
    No HIGH or MEDIUM finding names a cause it did not have (_alone), no culprit outside its process; pageable copies
    explain no more than the copies took, excess-sync no more than .item() and the copies (each a synchronise), plus
    half a second. A finding whose window lies within a collection of 100 ms or more (half a second either side) says
    host-bound: the main thread's own work. With the collections a third of the run or more, the report leads with
    host-bound, whose findings explain at least half of them; with a third or more packing and making batches, it
    leads with host-bound (or with faults, churn or a wait for a CPU, where true: _alone); with full collections (the
    oldest generation, walking the corpus) of a tenth of the run and a second or more, host-bound findings explain at
    least half of those. GPU busy (a step's kernels measured queued) under 40%: the report leads with the host side
    (HOST_SIDE), nothing gpu-bound; 80% or more: the host side, copies, faults and churn explain no more than the GPU's
    idle time plus half a second. The main thread's time running outside CUDA calls is at least its CPU time in
    collections, and at least its CPU time packing and making batches (which holds most collections), each less
    SHARE_SLACK; its time on a CPU and waiting for one, its own clocks' (SHARE_SLACK)."""
    own = truth["self"]
    top, allowed = _alone(report, truth)
    wall = own["wall_s"]
    assert _seconds(top, {"pageable-copies"}) <= own["copy_s"] + 0.5, (_said(top), own)
    assert _seconds(top, {"excess-sync"}) <= own["item_s"] + own["copy_s"] + 0.5, (_said(top), own)
    half = SECOND // 2
    long = [(a, b) for a, b in truth["gc_pauses_ns"] if b - a >= SECOND // 10]
    for c in top:
        if c.window and any(a - half <= c.window.start_ns and c.window.end_ns <= b + half for a, b in long):
            assert c.root_cause == "host-bound", (c.summary, long)
    if own["gc_share"] >= THIRD:
        assert top and top[0].root_cause == "host-bound", (_said(top), own)
        assert _seconds(top, {"host-bound"}) >= 0.5 * own["gc_s"], (_said(top), own)
    if own["make_share"] >= THIRD:
        assert top and top[0].root_cause in {"host-bound"} | allowed, (_said(top), own)
    if own["gc_full_s"] >= max(1.0, 0.1 * wall):
        assert _seconds(top, {"host-bound"}) >= 0.5 * own["gc_full_s"], (_said(top), own)
    _gpu_busy_rules(top, own, HOST_SIDE | allowed, HOST_SIDE | {"pageable-copies"} | allowed)
    shares = clocks_agree(report, truth)
    assert shares["run_outside_ns"] >= max(own["gc_cpu_s"], own["make_cpu_s"]) / wall - SHARE_SLACK, (shares, own)


def check_pageable_h2d_batches(report: Report, truth: dict, store: Path) -> None:
    """A small conv net trained from 201 MB float32 batches held in RAM (a pool of 4, ordinary pageable CPU tensors),
    each copied to the GPU with .to("cuda") (synchronous, staged by the driver), loss.item() each step; one process on
    CPUs 2-3, no thread of its own. No HIGH or MEDIUM finding names a cause it did not have (_alone), no culprit outside
    its process; launch-bound only where a step's kernels (GPU time queued) take under twice the host's time queueing
    them. Pageable copies explain no more than the main thread's time in the copies plus half a second; excess-sync no
    more than its time in .item() plus half a second (the copies' own synchronise is the copy). With a fifth of the run
    or more in the copies, a HIGH or MEDIUM pageable-copies finding, explaining at least half of what copying from
    pinned memory would have saved (a batch's copy alone, pageable against pinned, before the run); a third or more:
    the report leads with it. GPU busy (a step's kernels, measured queued from a batch on the GPU) under 40%: the report
    leads with the host side (HOST_SIDE or pageable copies), nothing gpu-bound; 80% or more: those, faults and churn
    explain no more than the GPU's idle time plus half a second. The main thread's time inside CUDA calls is at least
    its share in the copies less SHARE_SLACK (the staging memcpy and the wait for the DMA are inside cudaMemcpyAsync
    and its synchronise); its time on a CPU and waiting for one, its own clocks' (SHARE_SLACK)."""
    own = truth["self"]
    steps = max(own["steps"], 1)
    top, allowed = _alone(report, truth)
    if own["gpu_step_ms"] is not None and own["gpu_step_ms"] >= 2 * own["issue_s"] / steps * 1e3:
        assert not any(c.root_cause == "launch-bound" for c in top), (_said(top), own)
    wall = own["wall_s"]
    assert _seconds(top, {"pageable-copies"}) <= own["copy_s"] + 0.5, (_said(top), own)
    assert _seconds(top, {"excess-sync"}) <= own["item_s"] + 0.5, (_said(top), own)
    if own["copy_share"] >= 0.2:
        named = [c for c in top if c.root_cause == "pageable-copies"]
        assert named, (_said(top), own)
        assert _seconds(named, {"pageable-copies"}) >= 0.5 * max(own["pinned_would_save_s"] or 0.0, 0.0), \
            (_said(top), own)
        if own["copy_share"] >= THIRD:
            assert top[0].root_cause == "pageable-copies", (_said(top), own)
    lead = HOST_SIDE | {"pageable-copies"} | allowed
    _gpu_busy_rules(top, own, lead, lead)
    shares = clocks_agree(report, truth)
    inside = shares["run_inside_ns"] + shares["sleep_inside_ns"]
    assert inside >= own["copy_share"] - SHARE_SLACK, (shares, own, wall)


CHECKS_10 = {"natural_empty_cache_per_step": check_empty_cache_per_step,
             "natural_gc_token_corpus": check_gc_token_corpus,
             "natural_pageable_h2d_batches": check_pageable_h2d_batches}
