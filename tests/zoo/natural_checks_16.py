"""The group natural16 (bench/gpu/zoo/device_zoo.sh natural16): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_16 into its CHECKS; the ways of reading findings it
shares with groups 8 to 14 are natural_shares'."""

from __future__ import annotations

import re
from pathlib import Path

from natural_shares import CHURN, CPU_WAIT_SHARE, CUDA_MALLOCS_PER_S, HOST_SIDE, INPUT, PAGE_FAULTS_PER_S
from natural_shares import SHARE_SLACK, STARVED_SHARE, clocks_agree
from natural_shares import gpu_busy_rules as _gpu_busy_rules, in_run as _in_run, people as _people
from natural_shares import said as _said, seconds as _seconds
from natural_shares import capped as _capped, own_lead as _own_lead, scaled as _scaled
from test_zoo import SECOND

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

# Causes that need a quota, a GPU sharer, a network, a slow reader, a signal, a timer that fires or a GPU that slowed
# down: none of these jobs has them (the collector runs on CPUs of its own; no wait of theirs has a timeout).
NEVER = {"cpu-throttled", "gpu-shared", "network-wait", "slow-consumer", "stopped-by-signal", "timed-sleep",
         "gpu-slower"}
SPAWN = {"spawning-processes", "waiting-on-process"}  # a child the loop starts and waits for
COPIES = {"pageable-copies", "launch-bound", "excess-sync"}  # a pageable copy and a wait for it, 257 times a step
IO_OFF_CPU_S = 0.2  # a thread's (or the children's) time off a CPU in file work from which it may have waited on IO
COPIES_SHARE = 0.2  # the copies' share of the run from which a finding must say them
THIRD = 1 / 3
# What says, in a host-bound finding's summary or explanation, that its work is the per-sample copies.
COPY_WORDS = re.compile(r"cop(y|ies|ied)|memcpy|\.to\(|pageable|per[- ]sample", re.IGNORECASE)





def _said_of(c: CausalChain) -> str:
    return f"{c.summary} {c.explanation}"


def check_subprocess_eval(report: Report, truth: dict, store: Path) -> None:
    """An MLP classifier (loss.item() each step, batches on the GPU) that every ~2.5 s predicts a held-out set, copies
    the logits to the host (.cpu(), 26 MB), np.save()s them to a local file and runs a numpy metrics script in a child
    Python with subprocess.run(capture_output=True), waiting for it (the main thread sleeps in poll and wait4 while the
    child starts, imports numpy, loads the files and computes ~0.5-1 s of metrics); truth `children`: their comm and
    pids, `evals_ns` the evaluations' spans. One process on CPUs 2-3 (the children inherit them), no thread of its own
    but PyTorch's autograd thread, no workers, no lock, no sleep of its own. No HIGH or MEDIUM finding (in the measured
    run) says a cause it did not have: NEVER, a wait on workers or a thread (the autograd thread's backward is the
    step's own work; subprocess.run waits on its pipes and the child's exit on the main thread), a lock; a spawn or a
    wait on a process only where the calls took 5% of the run or more; the workers' CPUs only where the children waited
    for a CPU STARVED_SHARE of their life; IO only where np.save or the children spent IO_OFF_CPU_S or more off a CPU
    (the files go to the page cache, no fsync); churn only at CUDA_MALLOCS_PER_S, page faults only where the main
    process or the children (over the run) faulted PAGE_FAULTS_PER_S; own-threads-cpu and cpu-contention only where the
    main thread waited for a CPU CPU_WAIT_SHARE of the run or more; launch-bound only where a step's kernels (GPU time
    queued) take under twice the host's time queueing them. Every culprit is the job's process or one of its children (a
    child's pid, or a process of another pid said a child: not merely one of the children's comm, which the collector's
    own Python shares). A spawn, a wait on a process or the workers' CPUs names a child; together they explain no more
    than the time in subprocess.run; IO no more than the time off a CPU in np.save and the calls; pageable copies no
    more than predicting (the copy back is .cpu() of the logits); excess-sync no more than .item() and predicting;
    launch-bound no more than the queueing; host-bound no more than the main thread's CPU time; own-threads-cpu and
    cpu-contention no more than its wait for a CPU; each plus half a second (over the findings' longest window). With
    the calls a third of the run or more, the report leads with the wait on the children (a spawn or a wait on a
    process, or the workers' CPUs or page faults where true of the children), naming a child, and those explain at least
    half the time in subprocess.run; with a tenth or more, it shows the evaluations: a finding of those (any severity)
    naming a child for at least half that time, or an other-work phase over all but two of them. GPU busy (a step's and
    an evaluation's kernels measured queued) under 40%: the lead is the host side, the wait on the children or those
    allowed above, nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second.
    The main thread's sleep outside CUDA calls is at least its measured sleep in the calls (their wall less its CPU time
    and wait for a CPU in them) less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks'
    (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    kids, comm = set(truth["children"]["pids"]), truth["children"]["comm"]
    top = _in_run(report, truth)
    steps = max(own["steps"], 1)

    def is_child(k: Culprit) -> bool:
        return k.pid in kids or (k.pid != pid and k.relation == "child process")

    def on_child(c: CausalChain) -> bool:
        return any(is_child(k) for k in _people(c))

    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    kid_faults = own["children_minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S or kid_faults
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    starved = (own["children_cpu_wait_share_of_life"] or 0.0) >= STARVED_SHARE
    io = max(own["save_off_cpu_s"], own["children_off_cpu_s"]) >= IO_OFF_CPU_S
    absent = NEVER | (INPUT - {"waiting-on-process"}) | {"gil-or-lock"}
    absent |= (set() if churn else CHURN) | (set() if faults else {"page-faults"}) | (set() if io else {"io-wait"})
    absent |= (set() if waited else {"own-threads-cpu", "cpu-contention"}) | (set() if starved else {"own-workers-cpu"})
    absent |= SPAWN if own["sub_share"] < 0.05 else set()
    if own["gpu_step_ms"] is not None and own["gpu_step_ms"] >= 2 * own["issue_s"] / steps * 1e3:
        absent.add("launch-bound")
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or is_child(k) for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    waits = SPAWN | {"own-workers-cpu"}
    for c in top:
        if c.root_cause in waits:
            assert on_child(c), (c.summary, c.culprits, comm, sorted(kids)[:8])
    _capped(top, waits, own["sub_s"], own)
    _capped(top, {"io-wait"}, own["save_off_cpu_s"] + own["children_off_cpu_s"], own)
    _capped(top, {"pageable-copies"}, own["predict_s"], own)
    _capped(top, {"excess-sync"}, own["item_s"] + own["predict_s"], own)
    _capped(top, {"launch-bound"}, own["issue_s"], own)
    _capped(top, {"host-bound"}, own["main_run_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    on_kids = waits | ({"page-faults"} if kid_faults else set())
    if own["sub_share"] >= THIRD:
        lead = on_kids - absent
        assert top and top[0].root_cause in lead and on_child(top[0]), (_said(top), sorted(lead), own)
        assert _seconds([c for c in top if c.root_cause in on_kids and on_child(c)]) >= 0.5 * own["sub_s"], \
            (_said(top), own)
    elif own["sub_share"] >= 0.1:
        lo, hi = truth["baseline_ns"]
        shown = [c for c in report.chains if c.origin == "ingero-mcp" and c.root_cause in on_kids and on_child(c)
                 and (c.window is None or min(c.window.end_ns, hi) - max(c.window.start_ns, lo) > SECOND // 2)]
        assert report.accounting is not None
        other = [p for p in report.accounting.phases if p.kind == "other-work"]
        seen = max([sum(any(w.start_ns < b and a < w.end_ns for w in p.episodes) for a, b in truth["evals_ns"])
                    for p in other] or [0])
        assert _seconds(shown) >= 0.5 * own["sub_s"] or seen >= len(truth["evals_ns"]) - 2, \
            (_said(shown), other, own)
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set()) | ({"io-wait"} if io else set())
    allowed |= ({"own-threads-cpu"} if waited else set()) | ({"own-workers-cpu"} if starved else set())
    _gpu_busy_rules(top, own, HOST_SIDE | SPAWN | allowed, HOST_SIDE | SPAWN | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] >= own["sub_sleep_share"] - SHARE_SLACK, (shares, own)


def check_cpu_neighbor_control(report: Report, truth: dict, store: Path) -> None:
    """A control: a GPT-style LM (~134 M parameters, batches of 16 x 1024 tokens on the GPU, bf16 autocast, fused AdamW,
    loss.item() each step: tens of milliseconds of GPU work a step against a few of queueing) on CPUs 2-3, while
    another team's process (truth `neighbor`: pack_logs, two threads compressing and hashing log text flat out) keeps
    CPUs 6-7 busy the whole run; it shares nothing with the job. No finding at all (any severity, any time) names the
    neighbour (its pid, a tid of it or its name). No HIGH or MEDIUM finding (in the measured run) says a cause the job
    did not have: NEVER, an input wait (a wait on a thread: the autograd thread's backward is the step's own work),
    workers, a spawn (the neighbour was started before the run; the job waits for nothing of it), IO, a lock, pageable
    copies (.item()'s 4 bytes cost their round trip); churn only at CUDA_MALLOCS_PER_S, page faults only at
    PAGE_FAULTS_PER_S; own-threads-cpu and cpu-contention only where the main thread waited for a CPU CPU_WAIT_SHARE of
    the run or more (its CPUs are its own: whatever held them is of its process or the kernel), for no more than that
    wait plus half a second. No culprit outside the job's process. GPU busy (a step's kernels measured queued, over the
    run to the GPU's end of its last step) 80% or more: no host-side finding (HOST_SIDE) and no contention at all, and
    everything but gpu-bound explains no more than the GPU's idle time plus half a second; under 40% (the premise
    wrong): the lead is the host side, nothing gpu-bound. The main thread's time inside CUDA calls (asleep or running:
    .item()'s wait for the GPU, a full launch queue) is at least half its measured .item() share; its time on a CPU and
    waiting for one, its own clocks' (SHARE_SLACK). (The truth records the job's steps per second alone, before the
    neighbour started, and beside it: `with_over_alone`.)"""
    own, pid = truth["self"], truth["feeder"]["pid"]
    nb = truth["neighbor"]
    npid, ntids, ncomm = nb["pid"], set(nb["tids"]), nb["comm"]
    assert not own["neighbor_shares_job_cpus"], "the neighbour shared the job's CPUs: not the control checked here"

    def on_neighbor(k: Culprit) -> bool:
        return k.pid == npid or bool(ntids & set(k.tids)) or k.comm == ncomm

    named = [c for c in report.chains if c.origin == "ingero-mcp" and (npid in c.pids or any(
        on_neighbor(k) for k in c.culprits))]
    assert not named, [(c.severity, c.root_cause, c.summary, c.culprits) for c in named]
    top = _in_run(report, truth)
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    absent = NEVER | INPUT | {"own-workers-cpu", "spawning-processes", "io-wait", "gil-or-lock", "pageable-copies"}
    absent |= (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= set() if waited else {"own-threads-cpu", "cpu-contention"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= 0.8:
        assert not any(c.root_cause in HOST_SIDE | {"cpu-contention", "own-threads-cpu"} for c in top), \
            (_said(top), own)
        rest = [c for c in top if c.root_cause != "gpu-bound"]
        assert _seconds(rest) <= _scaled((1 - busy) * own["wall_s"], rest, own["wall_s"]) + 0.5, (_said(rest), own)
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set()) | (
        {"own-threads-cpu"} if waited else set())
    _gpu_busy_rules(top, own, HOST_SIDE | allowed, HOST_SIDE | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_inside_ns"] + shares["run_inside_ns"] >= 0.5 * own["item_share"], (shares, own)


def check_per_sample_h2d(report: Report, truth: dict, store: Path) -> None:
    """A ResNet-style conv net (batch 256 of 3x32x32, bf16 autocast, SGD, loss.item() each step) whose batch comes from
    a DataLoader with num_workers=0 and collate_fn=list as a Python list of 256 per-sample CPU tensors (12 KB each, from
    images preprocessed in RAM; __getitem__ flips at random), each moved to the GPU on its own with .to(dev) from
    pageable memory (non_blocking=False: a copy and a stream synchronise each, 257 with the labels a step), then stacked
    on the GPU; the script synchronises before and after the copies to time them alone. One process on CPUs 2-3, no
    thread of its own but PyTorch's autograd thread, no workers, no other process, no file IO, no lock, no sleep. No
    HIGH or MEDIUM finding (in the measured run) says a cause it did not have: NEVER, an input wait (a wait on a thread:
    the autograd thread's backward is the step's own work), workers, a spawn, IO, a lock; churn only at
    CUDA_MALLOCS_PER_S (each copy's device memory comes from the caching allocator), page faults only at
    PAGE_FAULTS_PER_S; own-threads-cpu and cpu-contention only where the main thread waited for a CPU CPU_WAIT_SHARE of
    the run or more. No culprit outside its process. Pageable copies explain no more than the copies; excess-sync no
    more than the copies, the synchronise before them and .item(); launch-bound no more than the copies and queueing the
    steps; host-bound no more than the main thread's CPU time; page faults no more than next() and the copies;
    own-threads-cpu and cpu-contention no more than the main thread's wait for a CPU; each plus half a second (over the
    findings' longest window). With the copies COPIES_SHARE of the run or more, a HIGH or MEDIUM finding says them
    (pageable copies, launch-bound or excess-sync: each copy is a pageable memcpy and a wait for it, all true; or
    host-bound whose summary or explanation speaks of the copies: COPY_WORDS), and those explain at least half of what
    stacking the batch on the CPU and copying it once would have saved (a batch's copy alone both ways, before the run).
    With the copies or next() a third of the run or more, the report leads with the larger (either where they are within
    SHARE_SLACK), said of the job's process: for the copies those causes or host-bound (their dispatch is the main
    thread's own work outside CUDA calls), for next() host-bound (or page faults where true). GPU busy (a step's kernels
    measured queued from a batch on the GPU) under 40%: the lead is the host side or the copies, nothing gpu-bound; 80%
    or more: those explain no more than the GPU's idle time plus half a second. The main thread's time inside CUDA calls
    is at least half the copies' share, and its time outside them (running, asleep, waiting for a CPU) at least next()'s
    share, less SHARE_SLACK each; its time on a CPU and waiting for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    top = _in_run(report, truth)
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    absent = NEVER | INPUT | {"own-workers-cpu", "spawning-processes", "io-wait", "gil-or-lock"}
    absent |= (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= set() if waited else {"own-threads-cpu", "cpu-contention"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    _capped(top, {"pageable-copies"}, own["copy_s"], own)
    _capped(top, {"excess-sync"}, own["copy_s"] + own["sync_s"] + own["item_s"], own)
    _capped(top, {"launch-bound"}, own["copy_s"] + own["issue_s"], own)
    _capped(top, {"host-bound"}, own["main_run_s"], own)
    _capped(top, {"page-faults"}, own["fetch_s"] + own["copy_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)

    def says_copies(c: CausalChain) -> bool:
        return c.root_cause in COPIES or (c.root_cause == "host-bound" and bool(COPY_WORDS.search(_said_of(c))))

    if own["copy_share"] >= COPIES_SHARE:
        named = [c for c in top if says_copies(c)]
        assert named, (_said(top), own)
        assert _seconds(named) >= 0.5 * max(own["stacking_would_save_s"] or 0.0, 0.0), (_said(named), own)
    if max(own["copy_share"], own["fetch_share"]) >= THIRD:
        by_copies = own["copy_share"] >= own["fetch_share"] - SHARE_SLACK
        by_fetch = own["fetch_share"] >= own["copy_share"] - SHARE_SLACK
        lead = COPIES | {"host-bound"} if by_copies else set()
        lead |= {"host-bound", "page-faults"} if by_fetch else set()
        _own_lead(top, lead - absent, pid, own)
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set()) | (
        {"own-threads-cpu"} if waited else set())
    _gpu_busy_rules(top, own, HOST_SIDE | COPIES | allowed, HOST_SIDE | COPIES | allowed)
    shares = clocks_agree(report, truth)
    inside = shares["run_inside_ns"] + shares["sleep_inside_ns"]
    assert inside >= 0.5 * own["copy_share"] - SHARE_SLACK, (shares, own)
    outside = shares["run_outside_ns"] + shares["sleep_outside_ns"] + shares["cpu_wait_ns"]
    assert outside >= own["fetch_share"] - SHARE_SLACK, (shares, own)


CHECKS_16 = {"natural_subprocess_eval": check_subprocess_eval,
             "natural_cpu_neighbor_control": check_cpu_neighbor_control,
             "natural_per_sample_h2d": check_per_sample_h2d}
