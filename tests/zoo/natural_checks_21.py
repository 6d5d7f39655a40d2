"""The group natural21 (bench/gpu/zoo/device_zoo.sh natural21): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_21 into its CHECKS; the ways of reading findings it
shares with groups 8 to 20 are natural_shares'."""

from __future__ import annotations

import re
from pathlib import Path

from natural_shares import CHURN, CPU_WAIT_SHARE, CUDA_MALLOCS_PER_S, HOST_SIDE, INPUT, PAGE_FAULTS_PER_S
from natural_shares import capped as _capped, clocks_agree, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import people as _people, said as _said, seconds as _seconds
from test_zoo import SECOND

from ingero_mcp.analysis.models import CausalChain, Report

# Causes that need a quota, a GPU sharer (another process), a network, a slow reader or a signal: none of these jobs
# has them (the collector runs on CPUs of its own).
NEVER = {"cpu-throttled", "gpu-shared", "network-wait", "slow-consumer", "stopped-by-signal"}
# What the two jobs without a compile in their run cannot have had either: a timer of their own, GPU work per step
# that changed (fixed shapes, the same step), child processes or workers (none started; the idle inductor compile
# workers of the control take no part), first launches (all warmed up before the run).
STEADY = {"timed-sleep", "gpu-slower", "spawning-processes", "waiting-on-process", "waiting-on-workers",
          "own-workers-cpu", "cold-start"}
THREAD_WAIT = {"waiting-on-thread", "gil-or-lock"}  # a wait on a thread of the process, said as the thread or a lock
# What a compile of the model in the run may truly be said as: the main thread's own running (Dynamo's tracing,
# inductor's lowering and code generation: host-bound), its wait for the compile workers or the compilers they run
# (child processes: waiting on a process or on workers, processes spawned; or on the pool's reader thread that
# completes the futures, or the futures' lock), the first launches of the new kernels (cold-start), the compile
# workers taking the job's own CPUs (own-workers-cpu, where the main thread waited for a CPU).
COMPILE = {"host-bound", "cold-start", "waiting-on-process", "waiting-on-workers", "spawning-processes",
           "waiting-on-thread", "gil-or-lock"}
COMPILE_WORDS = re.compile(r"compil|dynamo|inductor|triton|recompil|graph break|torch\.compile", re.IGNORECASE)
THIRD = 1 / 3
WAITED_SHARE = 0.10  # a share of the run this large or more held the loop up
GPU_BOUND = 0.85  # the GPU busy this share of the run or more: the job is GPU-bound
SNAPSHOT = {"host-bound", "io-wait", "pageable-copies", "excess-sync", "page-faults"}  # what a snapshot may be said as


def _by_rates(own: dict, waited: bool) -> tuple[set[str], set[str]]:
    """(absent, allowed): the causes the truth's rates rule out, and those they make true."""
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    absent = (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= set() if waited else {"own-threads-cpu", "cpu-contention", "own-workers-cpu"}
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set()) | (
        {"own-threads-cpu"} if waited else set())
    return absent, allowed


def _waited(own: dict) -> bool:
    """The main thread waited for a CPU CPU_WAIT_SHARE of the run or more (or the kernel kept no schedstat)."""
    return own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE


def _overlaps_run(c: CausalChain, truth: dict) -> bool:
    lo, hi = truth["baseline_ns"]
    return c.window is None or min(c.window.end_ns, hi) - max(c.window.start_ns, lo) > SECOND // 2


def check_compile_dynamic_shapes(report: Report, truth: dict, store: Path) -> None:
    """A small text classifier (embeddings, two MLP blocks, masked mean; batch 32) under torch.compile(dynamic=False),
    trained on batches padded to their longest sample rounded up to 32: each new length recompiles forward and backward
    (truth `recompiles`, `new_lengths`; `new_shape_s`: the wall time of the steps whose length was new, the compiles
    with their first run) until Dynamo's limit, new lengths past it run eagerly (`new_lengths_eager`). Inputs copied
    from pinned memory, .item() every 10 steps, one process on CPUs 2-3 whose only children are inductor's compile
    workers and the compilers they run (truth `compile_workers`). No HIGH or MEDIUM finding (in the measured run) says a
    cause it did not have: NEVER, pageable copies (pinned inputs); churn only at CUDA_MALLOCS_PER_S, page faults only at
    PAGE_FAULTS_PER_S; own-threads-cpu, own-workers-cpu and cpu-contention only where the main thread waited for a CPU
    CPU_WAIT_SHARE of the run or more (the compile workers share its two CPUs); without a compile in the run (no new
    length), nothing a compile would be said as but host-bound and launch-bound (the steps' own running). The findings a
    compile may be said as (COMPILE, io-wait) but host-bound explain no more than the new lengths' steps; host-bound and
    launch-bound no more than the main thread's time on a CPU and waiting for one, in loss.backward() (a wait on
    PyTorch's autograd thread, which runs and compiles the backward) and in the new lengths' steps; excess-sync no more
    than its .item() time; the CPU causes no more than its wait for a CPU; each plus half a second (over the findings'
    longest window). With the new lengths' steps a third of the run or more (the compiles, most of the run being the
    model's own recompiling), the report leads with COMPILE (or, where the main thread waited for a CPU, own-workers-cpu
    or own-threads-cpu; or the churn or page faults the rates make true), said of the job's process or its compile
    workers, nothing gpu-bound, and its HIGH and MEDIUM findings of those causes (and launch-bound, the steps' host
    side) explain at least half the new lengths' steps. GPU
    busy (each length's step queued, summed over the steps run) under 40%: the lead is the host side or those, nothing
    gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second. The main thread's time on
    a CPU and waiting for one is its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    mine = {pid} | {w["pid"] for w in truth.get("compile_workers", [])}
    top = _in_run(report, truth)
    waited = _waited(own)
    absent, allowed = _by_rates(own, waited)
    absent |= NEVER | {"pageable-copies"}
    compiled_in_run = bool(own["new_lengths"]) or own["recompiles"] > 0
    if not compiled_in_run:
        absent |= (COMPILE - {"host-bound"}) | {"io-wait", "timed-sleep"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)

    def ours(c: CausalChain) -> bool:
        """Said of the job's process or its child processes (the compile workers and the compilers they run)."""
        return bool(mine & set(c.pids)) or any(k.pid in mine or k.relation == "child process" for k in _people(c))

    new_s, wall = own["new_shape_s"], own["wall_s"]
    _capped(top, (COMPILE - {"host-bound"}) | {"io-wait"}, new_s, own)
    # the main thread's own running, its wait for a CPU, and its waits on PyTorch's autograd thread (the backward,
    # compiled there at a new length's first backward()): one story with its running
    host_s = own["main_run_s"] + (own["main_cpu_wait_s"] or 0.0) + own["backward_s"] + new_s
    _capped(top, {"host-bound", "launch-bound"}, min(wall, host_s), own)
    _capped(top, {"excess-sync"}, own["item_s"], own)
    _capped(top, {"own-threads-cpu", "own-workers-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    lead = COMPILE | ({"own-workers-cpu", "own-threads-cpu"} if waited else set())
    if new_s >= THIRD * wall:
        assert top and top[0].root_cause in (lead | allowed) - absent, (_said(top), own)
        assert ours(top[0]), (top[0].summary, top[0].pids, top[0].culprits, sorted(mine))
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds(top, lead | allowed | {"launch-bound"}) >= 0.5 * new_s, (_said(top), own)
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed | {"io-wait"})
    clocks_agree(report, truth)


def check_png_snapshots_main_thread(report: Report, truth: dict, store: Path) -> None:
    """A conv autoencoder (batch 64 of 3x128x128, fused AdamW, .item() every 10 steps) whose main thread, every N steps
    (about once a second), saves the batch's 64 reconstructions as an 8x8 grid PNG: .cpu() of 12.6 MB (pageable; it
    waits for the queued steps), the grid with numpy, the PNG encode (PIL or zlib), the write to /tmp (the page cache,
    no fsync); truth `snapshots_ns`, their parts' times in `self`. One process on CPUs 2-3, no threads of its own, no
    workers, no children, no lock, no sleep, fixed shapes, warmed up. No HIGH or MEDIUM finding (in the measured run)
    says a cause it did not have: NEVER, STEADY, a wait on a thread or a lock, an input wait; churn only at
    CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S; own-threads-cpu and cpu-contention only where the main
    thread waited for a CPU CPU_WAIT_SHARE of the run or more. No culprit outside the process. host-bound and
    launch-bound explain no more than the main thread's time on a CPU and in loss.backward() (`backward_s`, its wait on
    PyTorch's autograd thread); io-wait no more than its writes; pageable copies and excess-sync no more than its .cpu()
    copies and .item() calls; the CPU causes no more than its wait for a CPU; each plus half a second (over the
    findings' longest window). With the snapshots a third of the run or more, the report leads with what a snapshot may
    be said as (host-bound, io-wait, pageable copies, excess-sync, or the page faults the rates allow), said of the
    job's process. With them a tenth of the run or more, the report shows them: findings of those causes said of the
    process (any severity) explaining at least half the snapshots' time, or a recurrent phase whose episodes overlap
    half the snapshots or more. GPU busy (a step's GPU time queued, over the steps run) under 40%: the lead is the host
    side or those, nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second.
    The main thread's time on a CPU and waiting for one is its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    top = _in_run(report, truth)
    waited = _waited(own)
    absent, allowed = _by_rates(own, waited)
    absent |= NEVER | STEADY | THREAD_WAIT | INPUT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    _capped(top, {"host-bound", "launch-bound"}, own["main_run_s"] + own["backward_s"], own)
    _capped(top, {"io-wait"}, own["write_s"], own)
    _capped(top, {"pageable-copies", "excess-sync"}, own["copy_s"] + own["item_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)

    def ours(c: CausalChain) -> bool:
        return pid in c.pids or any(k.pid == pid for k in _people(c))

    lead = (SNAPSHOT - absent) | allowed
    snap_s, wall = own["snapshot_s"], own["wall_s"]
    if snap_s >= THIRD * wall:
        assert top and top[0].root_cause in lead and ours(top[0]), (_said(top), own)
    if snap_s >= WAITED_SHARE * wall:
        shown = [c for c in report.chains if c.origin == "ingero-mcp" and c.root_cause in SNAPSHOT and ours(c)
                 and _overlaps_run(c, truth)]
        assert report.accounting is not None
        rec = [p for p in report.accounting.phases if p.kind == "recurrent"]
        snaps = truth["snapshots_ns"]
        seen = max([sum(any(w.start_ns < e and s < w.end_ns for w in p.episodes) for s, e in snaps)
                    for p in rec] or [0])
        assert _seconds(shown) >= 0.5 * snap_s or 2 * seen >= len(snaps), (_said(shown), rec, own)
    _gpu_busy_rules(top, own, HOST_SIDE | lead, HOST_SIDE | lead)
    clocks_agree(report, truth)


def check_compiled_healthy(report: Report, truth: dict, store: Path) -> None:
    """A control: a GPU-bound MLP (512-4096, three 4096x4096 layers, batch 8192, fp32: tens of ms of GPU work a step)
    under torch.compile, warmed up before the run on everything it runs (training steps, an evaluation under no_grad
    every 100 steps), .item() each step (its one wait for the GPU); batches already on the GPU. One process on CPUs 2-3,
    no threads of its own, no workers (inductor's compile workers sit idle), no IO, no lock, no sleep. No HIGH or MEDIUM
    finding (in the measured run) says a cause it did not have: NEVER, STEADY, a wait on a thread or a lock, an input
    wait, io-wait, pageable copies; churn only at CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S;
    own-threads-cpu and cpu-contention only where the main thread waited for a CPU CPU_WAIT_SHARE of the run or more. No
    culprit outside the process. With no graph compiled in the run (truth `recompiles` 0), no HIGH or MEDIUM finding
    blames a compile: none is cold-start, and none but gpu-bound says a compile (torch.compile, Dynamo, inductor,
    Triton) in its summary or explanation. The job measured itself GPU-bound (busy GPU_BOUND or more): no HIGH or MEDIUM
    finding but gpu-bound and the churn or page faults the rates make true, so no host-side cause. GPU busy under 40%
    (the premise wrong): the lead is the host side, nothing gpu-bound; 80% or more: the host side explains no more than
    the GPU's idle time plus half a second. host-bound and launch-bound explain no more than the main thread's time on a
    CPU and in loss.backward() (its wait on PyTorch's autograd thread), excess-sync no more than its .item() time, each
    plus half a second. The main thread's time on a CPU and waiting for one is its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    top = _in_run(report, truth)
    waited = _waited(own)
    absent, allowed = _by_rates(own, waited)
    absent |= NEVER | STEADY | THREAD_WAIT | INPUT | {"io-wait", "pageable-copies"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    if own["recompiles"] == 0:
        blamed = [c for c in top
                  if c.root_cause != "gpu-bound" and COMPILE_WORDS.search(f"{c.summary} {c.explanation}")]
        assert not blamed, (_said(blamed), own)
    _capped(top, {"host-bound", "launch-bound"}, own["main_run_s"] + own["backward_s"], own)
    _capped(top, {"excess-sync"}, own["item_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= GPU_BOUND:
        ok = {"gpu-bound"} | allowed - {"own-threads-cpu"}
        assert all(c.root_cause in ok for c in top), (_said(top), own)
    _gpu_busy_rules(top, own, HOST_SIDE | allowed, HOST_SIDE | allowed)
    clocks_agree(report, truth)


CHECKS_21 = {"natural_compile_dynamic_shapes": check_compile_dynamic_shapes,
             "natural_png_snapshots_main_thread": check_png_snapshots_main_thread,
             "natural_compiled_healthy": check_compiled_healthy}
