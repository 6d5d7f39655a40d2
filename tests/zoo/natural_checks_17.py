"""The group natural17 (bench/gpu/zoo/device_zoo.sh natural17): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_17 into its CHECKS; the ways of reading findings it
shares with groups 8 to 16 are natural_shares'."""

from __future__ import annotations

from pathlib import Path

from natural_checks_13 import RESTART_SHARE, RESTART_WORDS
from natural_shares import CHURN, CPU_WAIT_SHARE, CUDA_MALLOCS_PER_S, HOST_SIDE, INPUT, PAGE_FAULTS_PER_S
from natural_shares import SHARE_SLACK, STARVED_SHARE, clocks_agree
from natural_shares import capped as _capped, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import own_lead as _own_lead, people as _people, said as _said, seconds as _seconds
from test_zoo import SECOND

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

# Causes that need a quota, a GPU sharer, a network, a slow reader, a signal, a timer that fires or a GPU that slowed
# down: none of these jobs has them (the collector runs on CPUs of its own; no wait of theirs has a timeout).
NEVER = {"cpu-throttled", "gpu-shared", "network-wait", "slow-consumer", "stopped-by-signal", "timed-sleep",
         "gpu-slower"}
THIRD = 1 / 3
SYNCS_SHARE = 0.2  # the per-parameter syncs' share of the run from which the report must say the host side
SHOWN_SHARE = 0.1  # the checkpoints' share of the run from which the report must show them
IO_OFF_CPU_S = 0.2  # the main thread's time off a CPU in the writes from which it may have waited on IO


def _text(c: CausalChain) -> str:
    return " ".join([c.summary, c.explanation, *c.recommendations])


def _overlaps(c: CausalChain, truth: dict) -> bool:
    lo, hi = truth["baseline_ns"]
    return c.window is None or min(c.window.end_ns, hi) - max(c.window.start_ns, lo) > SECOND // 2


def check_grad_norm_per_param(report: Report, truth: dict, store: Path) -> None:
    """A 12-layer Transformer LM (batches on the GPU, bf16 autocast, fused AdamW, loss.item() each step) that logs each
    of its 149 parameters' gradient norm with `p.grad.norm().item()` between backward() and opt.step(): 149 syncs a step
    (a tiny kernel, a copy back and a wait for the GPU each; the first waits for the backward pass). One process on CPUs
    2-3, no thread of its own but PyTorch's autograd thread, no workers, no child, no file, no lock. No HIGH or MEDIUM
    finding (in the measured run) says a cause it did not have: NEVER, an input wait (workers, a process, a thread: the
    autograd thread's backward is the step's own work), a spawn, the workers' CPUs, IO, a lock; churn only at
    CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S, own-threads-cpu and cpu-contention only where the main
    thread waited for a CPU CPU_WAIT_SHARE of the run or more. Every culprit is the job's process. Excess-sync explains
    no more than the logging loop and loss.item(), launch-bound no more than the logging loop, queueing and opt.step(),
    host-bound no more than the main thread's CPU time and its time queueing forward and backward (the autograd thread's
    queueing of backward is the step's own host work), own-threads-cpu and cpu-contention no more than its wait for a
    CPU, each plus half a second (over the findings' longest window). With the syncs after the first (the per-parameter
    logging's own cost, `rest_items_share`) SYNCS_SHARE of the run or more, a HIGH or MEDIUM host-side finding
    (HOST_SIDE: each .item() is a launch, a copy and a wait; the host runs the loop) says them, and the host side
    explains at least half of that time or of the GPU's idle time, whichever is less; a third or more: the report
    leads with the host side, said of the job's process. GPU busy (a step's kernels, the norms included, measured
    queued) under 40%: the lead is the host side, nothing gpu-bound; 80% or more: the host side explains no more than
    the GPU's idle time plus half a second. The main thread's time inside CUDA calls is at least the first .item()'s and
    loss.item()'s shares (waits for the GPU inside a copy or a synchronise) less SHARE_SLACK; its time on a CPU and
    waiting for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    top = _in_run(report, truth)
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    absent = NEVER | INPUT | {"spawning-processes", "own-workers-cpu", "io-wait", "gil-or-lock"}
    absent |= (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= set() if waited else {"own-threads-cpu", "cpu-contention"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    _capped(top, {"excess-sync"}, own["log_s"] + own["loss_item_s"], own)
    _capped(top, {"launch-bound"}, own["log_s"] + own["queue_s"] + own["opt_s"], own)
    _capped(top, {"host-bound"}, own["main_run_s"] + own["queue_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    idle_s = (1 - own["gpu_busy_share"]) * own["wall_s"] if own["gpu_busy_share"] is not None else own["wall_s"]
    if own["rest_items_share"] >= SYNCS_SHARE:
        host = [c for c in top if c.root_cause in HOST_SIDE]
        assert host, (_said(top), own)
        assert _seconds(host) >= 0.5 * min(own["rest_items_s"], idle_s), (_said(host), own)
    if own["rest_items_share"] >= THIRD:
        _own_lead(top, HOST_SIDE, pid, own)
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set()) | (
        {"own-threads-cpu"} if waited else set())
    _gpu_busy_rules(top, own, HOST_SIDE | allowed, HOST_SIDE | allowed)
    shares = clocks_agree(report, truth)
    inside = shares["run_inside_ns"] + shares["sleep_inside_ns"]
    assert inside >= own["first_item_share"] + own["loss_item_share"] - SHARE_SLACK, (shares, own)


def check_spawn_workers_each_epoch(report: Report, truth: dict, store: Path) -> None:
    """A small ResNet fed by DataLoader(num_workers=3, multiprocessing_context="spawn", persistent_workers=False) over
    16,384 images in one 64 MB numpy array held by its Dataset: every short epoch's iter() starts 3 new Python processes
    one after the other, the main thread writing each the pickled dataset through a pipe that the child reads only once
    it has imported torch; the first next() waits for a worker's first batch, the last next() shuts them down (truth
    `workers`: every pid seen, its epoch; `epochs`, `epochs_ns`); the batches copied from pageable memory, .item() each
    step; the whole process (workers too) on CPUs 2-5, nothing else there. No HIGH or MEDIUM finding (in the measured
    run) says a cause it did not have: NEVER, IO (the main thread reads no file; the workers import what the main
    process loaded already), contention by another process, a lock; churn and page faults only at their rates
    (CUDA_MALLOCS_PER_S; PAGE_FAULTS_PER_S in the main process or in a worker on average: the spawned workers' imports
    fault); the workers' CPUs only where a worker waited for a CPU STARVED_SHARE of its life or the main thread
    CPU_WAIT_SHARE of the run, own-threads-cpu only at the latter; under a tenth of the run in the loader (iter() and
    next()), no input wait, spawn or workers' CPUs at all. No culprit but the job's process and its workers (their pids,
    pt_data_worker, or a child process). A wait for input (workers, or a process: the pipe to a child still starting),
    a spawn and the workers' CPUs name a worker; together they explain no more than the main thread's time in the
    loader and its wait for a CPU, a spawn no more than the epochs' starts and shutdowns (iter() to the first batch, the
    last next()), pageable copies no more than the copies, the host side (HOST_SIDE) no more than the run less the time
    in the loader, plus half a second (budgets over the findings' longest window). In the loader a third of the run or
    more: the report leads with it (an input wait or a spawn, or the workers' CPUs or page faults where true, host-bound
    where iter()'s CPU time was half the loader's) naming a worker where it is a wait, a spawn or the workers' CPUs, and
    the loader's findings explain at least half the time the main thread spent off a CPU in the loader. Where the starts
    and shutdowns took RESTART_SHARE of the run or more and half the loader's time or more, the report says the
    restarts: a spawn naming a worker, or a loader finding (or host-bound, page faults: the spawns' own cost) that
    speaks of them (RESTART_WORDS: persistent_workers, spawn, workers started, the epochs). GPU busy (a step's kernels
    measured queued) under 40%: the lead is the loader or the host side, nothing gpu-bound; 80% or more: those explain
    no more than the GPU's idle time plus half a second. The main thread's sleep outside CUDA calls and wait for a CPU
    are at least its time in iter() and next() less its CPU time there, less SHARE_SLACK; its time on a CPU and waiting
    for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    workers = {w["pid"] for w in truth["workers"]}
    top = _in_run(report, truth)
    wall = own["wall_s"]

    def is_worker(k: Culprit) -> bool:
        return k.pid != pid and (k.pid in workers or k.comm == "pt_data_worker" or k.relation == "child process")

    def on_worker(c: CausalChain) -> bool:
        return any(is_worker(k) for k in _people(c))

    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    per_worker_faults = (own["workers_minor_faults_per_s"] or 0.0) / max(own["num_workers"], 1)
    faults = max(own["minor_faults_per_s"], per_worker_faults) >= PAGE_FAULTS_PER_S
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    starved = (own["workers_cpu_wait_share_max"] or 0.0) >= STARVED_SHARE
    absent = NEVER | {"io-wait", "cpu-contention", "gil-or-lock"}
    absent |= (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= (set() if starved or waited else {"own-workers-cpu"}) | (set() if waited else {"own-threads-cpu"})
    loader_causes = INPUT | {"spawning-processes", "own-workers-cpu"}
    if own["loader_share"] < 0.1:
        absent |= loader_causes
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or is_worker(k) for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    loader = [c for c in top if c.root_cause in loader_causes]
    for c in loader:
        assert on_worker(c), (c.summary, c.culprits, sorted(workers)[:8])
    _capped(top, loader_causes, own["loader_s"] + (own["main_cpu_wait_s"] or 0.0), own)
    _capped(top, {"spawning-processes"}, own["restart_s"], own)
    _capped(top, {"pageable-copies"}, own["copy_s"], own)
    _capped(top, HOST_SIDE, wall - own["loader_s"], own)
    lead = (loader_causes | ({"page-faults"} if faults else set())) - absent
    if own["iter_cpu_s"] >= 0.5 * own["loader_s"]:
        lead |= {"host-bound"}  # the spawns and the pickling are the main thread's own CPU time
    if own["loader_share"] >= THIRD:
        assert top and top[0].root_cause in lead, (_said(top), sorted(lead), own)
        if top[0].root_cause in loader_causes:
            assert on_worker(top[0]), (top[0].summary, top[0].culprits, sorted(workers)[:8])
        off_cpu = own["loader_s"] - own["next_cpu_s"] - own["iter_cpu_s"]
        assert _seconds([c for c in top if c.root_cause in lead]) >= 0.5 * off_cpu, (_said(top), own)
    if own["restart_share"] >= RESTART_SHARE and own["restart_s"] >= 0.5 * own["loader_s"]:
        says = [c for c in top if (c.root_cause == "spawning-processes" and on_worker(c))
                or (c.root_cause in loader_causes | {"host-bound", "page-faults"} and RESTART_WORDS.search(_text(c)))]
        assert says, ([(c.root_cause, _text(c)) for c in top], own)
    both = HOST_SIDE | lead | {"pageable-copies"} | (CHURN if churn else set())
    _gpu_busy_rules(top, own, both, both)
    shares = clocks_agree(report, truth)
    stalled = shares["sleep_outside_ns"] + shares["cpu_wait_ns"]
    off = own["loader_share"] - own["wait_cpu_share"] - own["iter_cpu_s"] / wall
    assert stalled >= off - SHARE_SLACK, (shares, own)


def check_sync_torch_save_ckpt(report: Report, truth: dict, store: Path) -> None:
    """An MLP of 71M parameters (0.86 GB with AdamW's moments; batches on the GPU, fp32, loss.item() each step) that
    every ~4 s copies its whole state to the host (.cpu() of each tensor: pageable copies back, each waited for) and
    torch.save()s it to a local-disk file, os.replace()d over the last one, on the main thread, no fsync (truth
    `saves_ns`). One process on CPUs 2-3, no thread of its own but PyTorch's autograd thread, no workers, no child, no
    lock. No HIGH or MEDIUM finding (in the measured run) says a cause it did not have: NEVER, an input wait, a spawn,
    the workers' CPUs, a lock; churn only at CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S (the host copies'
    fresh pages), IO only where the main thread spent IO_OFF_CPU_S or more off a CPU in the writes, own-threads-cpu and
    cpu-contention only where it waited for a CPU CPU_WAIT_SHARE of the run or more, launch-bound only where a step's
    kernels (GPU time queued) take under twice the main thread's CPU time a step outside the checkpoints. Every culprit
    is the job's process. Pageable copies explain no more than the copies to the host, excess-sync no more than the
    copies, IO no more than the writes' time off a CPU, page faults no more than the checkpoints, host-bound no more
    than the main thread's CPU time, launch-bound no more than its CPU time outside the checkpoints, own-threads-cpu and
    cpu-contention no more than its wait for a CPU, each plus half a second (over the findings' longest window). With
    the checkpoints SHOWN_SHARE of the run or more, the report shows them: the findings of what a checkpoint does
    (pageable copies, excess-sync, host-bound, and IO or page faults where true) explain at least half their time, or an
    other-work phase covers all but one of them; a third of the run or more: the report leads with one of those, said
    of the job's process. GPU busy (a step's kernels measured queued) under 40%: the lead is the host side or one of
    those, nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second. The main
    thread's time on a CPU and waiting for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    top = _in_run(report, truth)
    steps = max(own["steps"], 1)
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    io = own["write_off_cpu_s"] >= IO_OFF_CPU_S
    absent = NEVER | INPUT | {"spawning-processes", "own-workers-cpu", "gil-or-lock"}
    absent |= (set() if churn else CHURN) | (set() if faults else {"page-faults"}) | (set() if io else {"io-wait"})
    absent |= set() if waited else {"own-threads-cpu", "cpu-contention"}
    outside_run_s = max(own["main_run_s"] - own["ckpt_run_s"], 0.0)  # the main thread's CPU time in the steps
    if own["gpu_step_ms"] is not None and own["gpu_step_ms"] >= 2 * outside_run_s / steps * 1e3:
        absent.add("launch-bound")
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    _capped(top, {"pageable-copies"}, own["ckpt_copy_s"], own)
    _capped(top, {"excess-sync"}, own["ckpt_copy_s"], own)
    _capped(top, {"io-wait"}, own["write_off_cpu_s"], own)
    _capped(top, {"page-faults"}, own["ckpt_s"], own)
    _capped(top, {"host-bound"}, own["main_run_s"], own)
    _capped(top, {"launch-bound"}, outside_run_s, own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    saving = ({"pageable-copies", "excess-sync", "host-bound"} | ({"io-wait"} if io else set())
              | ({"page-faults"} if faults else set()))
    if own["ckpt_share"] >= SHOWN_SHARE:
        shown = [c for c in report.chains
                 if c.origin == "ingero-mcp" and c.root_cause in saving and _overlaps(c, truth)]
        assert report.accounting is not None
        other = [p for p in report.accounting.phases if p.kind == "other-work"]
        seen = max([sum(any(w.start_ns < b and a < w.end_ns for w in (p.episodes or [p.window])) for a, b in
                        truth["saves_ns"]) for p in other] or [0])
        assert _seconds(shown) >= 0.5 * own["ckpt_s"] or seen >= len(truth["saves_ns"]) - 1, (_said(shown), other, own)
    if own["ckpt_share"] >= THIRD:
        _own_lead(top, saving - absent, pid, own)
    allowed = (CHURN if churn else set()) | ({"own-threads-cpu"} if waited else set())
    both = (HOST_SIDE | saving | allowed) - absent
    _gpu_busy_rules(top, own, both, both)
    clocks_agree(report, truth)


CHECKS_17 = {"natural_grad_norm_per_param": check_grad_norm_per_param,
             "natural_spawn_workers_each_epoch": check_spawn_workers_each_epoch,
             "natural_sync_torch_save_ckpt": check_sync_torch_save_ckpt}
