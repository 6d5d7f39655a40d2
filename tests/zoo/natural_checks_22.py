"""The group natural22 (bench/gpu/zoo/device_zoo.sh natural22): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py may merge CHECKS_22 into its CHECKS; the ways of reading findings it
shares with groups 8 to 21 are natural_shares'."""

from __future__ import annotations

from pathlib import Path

from natural_shares import CHURN, CPU_WAIT_SHARE, CUDA_MALLOCS_PER_S, HOST_SIDE, INPUT, PAGE_FAULTS_PER_S
from natural_shares import SECOND, SHARE_SLACK, clocks_agree
from natural_shares import capped as _capped, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import own_lead as _own_lead, people as _people, said as _said, seconds as _seconds

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

# Causes that need a quota, a GPU sharer (another process), a network, a slow reader or a signal: none of these jobs
# has them (the collector runs on CPUs of its own).
NEVER = {"cpu-throttled", "gpu-shared", "network-wait", "slow-consumer", "stopped-by-signal"}
# What none of the three had either: a timer in the loop (the control's exporter waits on a timer of its own, off the
# loop), GPU work per step that changed (fixed shapes, the same step), child processes or workers (none started), first
# launches (all warmed up before the run).
STEADY = {"timed-sleep", "gpu-slower", "spawning-processes", "waiting-on-process", "waiting-on-workers",
          "own-workers-cpu", "cold-start"}
THREAD_WAIT = {"waiting-on-thread", "gil-or-lock"}  # a wait on a thread of the process, said as the thread or a lock
THIRD = 1 / 3
WAITED_SHARE = 0.10  # a share of the run this large or more held the loop up
GPU_BOUND = 0.85  # the GPU busy this share of the run or more: the job is GPU-bound
KEPT_RATE = 0.9  # steps overlapping an export at most 1/KEPT_RATE as long as the others: nothing lost
SYNC_SHOWN = 10  # a log call with this many synchronisations or more a step makes them a pattern worth naming


def _waited(share: float | None) -> bool:
    """A thread waited for a CPU CPU_WAIT_SHARE of the run or more (or the kernel kept no schedstat)."""
    return share is None or share >= CPU_WAIT_SHARE


def _by_rates(own: dict, waited: bool) -> tuple[set[str], set[str]]:
    """(absent, allowed): the causes the truth's rates rule out, and those they make true."""
    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    absent = (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= set() if waited else {"own-threads-cpu", "cpu-contention"}
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set()) | (
        {"own-threads-cpu"} if waited else set())
    return absent, allowed


def _shown(report: Report, truth: dict) -> list[CausalChain]:
    """Every finding of the analysis (any severity) whose window overlaps the measured run by over half a second."""
    lo, hi = truth["baseline_ns"]
    return [c for c in report.chains if c.origin == "ingero-mcp"
            and (c.window is None or min(c.window.end_ns, hi) - max(c.window.start_ns, lo) > SECOND // 2)]


def _ours(c: CausalChain, pid: int) -> bool:
    """Said of the job's process (its pid, or a culprit of it)."""
    return pid in c.pids or any(k.pid == pid for k in _people(c))


def check_tensor_str_logging(report: Report, truth: dict, store: Path) -> None:
    """The zoo's MLP (batch 4096 on the GPU, fp32, fused AdamW, clip_grad_norm_, a LambdaLR) whose every step logs its
    metrics through Python's logging: one FileHandler (the page cache, a flush a record, no fsync) and a custom
    formatter rendering the record's metrics with "%s=%s", so that four GPU tensors (the loss, the accuracy, the
    gradient norm, a 10-class accuracy vector) go through str(tensor): dozens of small synchronisations a log call
    (truth `syncs_per_log`), the first waiting for the step's queued work, the rest round trips with the GPU idle
    between them, and torch's Python formatting around them. Nothing else in the loop synchronises. One process on CPUs
    2-3, no threads of its own, no workers, no children, no sleep; the handler's lock is taken by one thread only. No
    HIGH or MEDIUM finding (in the measured run) says a cause it did not have: NEVER, STEADY, an input wait, a wait on a
    thread or a lock (the autograd thread's backward is the step's own work; the handler's lock is uncontended),
    pageable copies (the values read back are a few bytes each: the round trip is the cost, not the copy); churn only at
    CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S; own-threads-cpu and cpu-contention only where the main
    thread waited for a CPU CPU_WAIT_SHARE of the run or more. No culprit outside the process. excess-sync explains no
    more than the log calls' time; host-bound and launch-bound no more than the main thread's time on a CPU and in
    loss.backward() (`backward_s`, its wait on PyTorch's autograd thread); io-wait no more than the log calls' time
    outside the formatter (the record, the handler's lock, the write and flush); own-threads-cpu and cpu-contention no
    more than the main thread's wait for a CPU; each plus half a second (over the findings' longest window). With the
    logging's cost (`log_overhead_s`: the run's time beyond its steps at the rate of the same loop with one loss.item()
    a step instead of the log call) a third of the run or more, the report leads, said of the job's process, with what
    the logging is: excess-sync, host-bound or launch-bound (or the churn, faults or wait for a CPU the rates make
    true), nothing gpu-bound, and those explain at least half that cost. With SYNC_SHOWN synchronisations a log call or
    more, that cost a fifth of the run or more and the GPU busy under 80%, some finding (any severity, in the run) says
    excess-sync of the process. GPU busy (a step's kernels measured queued) under 40%: the lead is the host side or
    those allowed, nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second.
    The main thread's time on a CPU and waiting for one is its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    top = _in_run(report, truth)
    waited = _waited(own["main_cpu_wait_share"])
    absent, allowed = _by_rates(own, waited)
    absent |= NEVER | STEADY | THREAD_WAIT | INPUT | {"pageable-copies"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    _capped(top, {"excess-sync"}, own["log_s"], own)
    _capped(top, {"host-bound", "launch-bound"}, own["main_run_s"] + own["backward_s"], own)
    _capped(top, {"io-wait"}, own["log_rest_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    lead = HOST_SIDE | (allowed - absent)
    overhead, wall = own["log_overhead_s"], own["wall_s"]
    assert overhead is not None, "the script did not measure the loop without its log call"
    if overhead >= THIRD * wall:
        _own_lead(top, lead, pid, own)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds(top, lead) >= 0.5 * overhead, (_said(top), sorted(lead), own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if (own["syncs_per_log"] or 0) >= SYNC_SHOWN and overhead >= 0.2 * wall and busy < 0.8:
        syncs = [c for c in _shown(report, truth) if c.root_cause == "excess-sync" and _ours(c, pid)]
        assert syncs, (_said(report.chains), own)
    _gpu_busy_rules(top, own, lead, lead)
    clocks_agree(report, truth)


def check_anomaly_mode_left_on(report: Report, truth: dict, store: Path) -> None:
    """A Transformer text classifier (4 pre-norm layers, d 768, 64 x 256 tokens held on the GPU, bf16 autocast, fused
    AdamW, loss.item() each step) trained with torch.autograd.set_detect_anomaly(True) left on: in the forward every
    autograd node stores the Python stack that made it (the main thread's own Python, under the GIL); in the backward
    every gradient a node returns is checked for NaN and read back (a synchronisation each) by PyTorch's autograd
    thread (truth `autograd`: pt_autograd_0) while the main thread waits in loss.backward(). Without anomaly mode the
    same steps (measured before it was turned on: `plain_*`) are GPU-bound. One process on CPUs 2-3, no threads of its
    own, no workers, no children, no IO, no lock of its own, no sleep. No HIGH or MEDIUM finding (in the measured run)
    says a cause it did not have: NEVER, STEADY, IO, pageable copies (each check reads back one bool: the round trip is
    the cost); churn only at CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S; own-threads-cpu and
    cpu-contention only where the main thread or the autograd thread waited for a CPU CPU_WAIT_SHARE of the run or
    more; a wait on a thread or a lock only naming the autograd thread (the main thread's wait for the backward, which
    anomaly mode's checks lengthen). No culprit outside the process. A wait on the autograd thread explains no more than
    the main thread's time in loss.backward(); excess-sync no more than that and .item(); host-bound and launch-bound no
    more than the main thread's time on a CPU and in loss.backward() (where the autograd thread runs the backward and
    its checks); own-threads-cpu and cpu-contention no more than the two threads' wait for a CPU; each plus half a
    second (over the findings' longest window). With anomaly mode's cost (`anomaly_overhead_s`: the run's time beyond
    its steps at the plain rate) a third of the run or more, the report leads, said of the job's process, with what
    that cost is: host-bound, launch-bound, excess-sync, a wait on the autograd thread (or the churn, faults or wait for
    a CPU the rates make true), nothing gpu-bound, and those explain at least half the cost. With the forward's extra
    time (`forward_extra_s`) a tenth of the run or more, some finding (any severity, in the run) says the host side of
    the process (host-bound or launch-bound); with the rest of the cost (`rest_extra_s`: the backward's checks) a tenth
    or more and the autograd thread known, some finding says excess-sync, launch-bound or a wait on the autograd thread.
    GPU busy (a step's kernels without anomaly mode, measured queued) under 40%: the lead is the host side or those
    allowed, nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second. The main
    thread's time running outside CUDA calls is at least the forward's extra CPU time (the stack captures are Python)
    less SHARE_SLACK; its time on a CPU and waiting for one is its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    ag = truth.get("autograd") or {}
    atid = ag.get("tid")
    top = _in_run(report, truth)
    waited = _waited(own["main_cpu_wait_share"]) or (own["autograd_cpu_wait_share"] or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _by_rates(own, waited)
    absent |= NEVER | STEADY | {"io-wait", "pageable-copies"}
    if atid is None:
        absent |= THREAD_WAIT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]

    def is_autograd(k: Culprit) -> bool:
        return (atid is not None and atid in k.tids) or (k.comm or "").startswith("pt_autograd")

    def on_autograd(c: CausalChain) -> bool:
        return any(is_autograd(k) for k in _people(c))

    for c in top:
        if c.root_cause in THREAD_WAIT:
            assert on_autograd(c), (c.summary, c.culprits, atid)
    wall = own["wall_s"]
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(top, THREAD_WAIT, own["backward_s"], own)
    _capped(top, {"excess-sync"}, own["backward_s"] + own["item_s"], own)
    _capped(top, {"host-bound", "launch-bound"}, main_run + own["backward_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"},
            (own["main_cpu_wait_s"] or 0.0) + (own["autograd_cpu_wait_s"] or 0.0), own)
    lead = HOST_SIDE | (THREAD_WAIT if atid is not None else set()) | (allowed - absent)
    overhead = own["anomaly_overhead_s"]
    assert overhead is not None, "the script did not measure the steps without anomaly mode"
    if overhead >= THIRD * wall:
        _own_lead(top, lead, pid, own)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds(top, lead) >= 0.5 * overhead, (_said(top), sorted(lead), own)
    shown = _shown(report, truth)
    if own["forward_extra_s"] >= WAITED_SHARE * wall:
        host = [c for c in shown if c.root_cause in {"host-bound", "launch-bound"} and _ours(c, pid)]
        assert host, (_said(report.chains), own)
    if atid is not None and (own["rest_extra_s"] or 0.0) >= WAITED_SHARE * wall:
        checks = [c for c in shown if (c.root_cause in {"excess-sync", "launch-bound"} and _ours(c, pid))
                  or (c.root_cause in THREAD_WAIT and on_autograd(c))]
        assert checks, (_said(report.chains), own)
    _gpu_busy_rules(top, own, lead, lead)
    shares = clocks_agree(report, truth)
    assert shares["run_outside_ns"] >= own["forward_extra_cpu_share"] - SHARE_SLACK, (shares, own)


def check_healthy_textfile_exporter(report: Report, truth: dict, store: Path) -> None:
    """A control: a GPU-bound MLP (512-4096, three 4096x4096 layers, batch 8192 on the GPU, fp32, fused AdamW: tens of
    ms of GPU work a step) reading its loss with .item() each step (its one wait for the GPU) and recording the step's
    duration and loss under a threading.Lock shared with a thread of its process (truth `exporter`: metrics_export)
    that wakes once a second (a timed wait of its own), copies that state under the lock, computes percentiles, reads
    /proc/self/status and /proc/self/stat and the allocator's counters, writes a node_exporter textfile (write, fsync,
    atomic rename, in a folder under /var/tmp) and appends a heartbeat line (truth `exports_ns`). One process on CPUs
    2-3, no workers, no children; the main thread does no IO and never sleeps on a timer. No HIGH or MEDIUM finding (in
    the measured run) says a cause it did not have: NEVER, STEADY (the exporter's timer and fsync are its own, off the
    loop), an input wait, IO, pageable copies (.item()'s bytes); a wait on a thread or a lock only where the steps that
    overlapped an export were slower than the others (`other_over_overlap` under KEPT_RATE), naming the exporter;
    churn only at CUDA_MALLOCS_PER_S, page faults only at PAGE_FAULTS_PER_S; own-threads-cpu and cpu-contention only
    where the main thread waited for a CPU CPU_WAIT_SHARE of the run or more. No culprit outside the process. The job
    measured itself GPU-bound (busy GPU_BOUND or more) and the steps overlapping exports kept their pace: no HIGH or
    MEDIUM finding but gpu-bound and the churn or page faults the rates make true; none names the exporter (its tid or
    name). Where the exports did slow the steps, a lock, a wait on a thread, own-threads-cpu, and any finding naming
    the exporter explain no more than the time the overlapping steps took beyond the median step
    (`lost_in_export_s`) plus half a second. host-bound and launch-bound explain no more than the main thread's time on
    a CPU and in loss.backward() (its wait on PyTorch's autograd thread), excess-sync no more than its .item() time,
    own-threads-cpu and cpu-contention no more than its wait for a CPU, each plus half a second. GPU busy under 40%
    (the premise wrong): the lead is the host side or those allowed, nothing gpu-bound; 80% or more: those explain no
    more than the GPU's idle time plus half a second. The main thread's time inside CUDA calls (asleep or spinning in
    .item()'s wait) is at least half its .item() share less SHARE_SLACK; its time on a CPU and waiting for one, its own
    clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    etid, ecomm = truth["exporter"]["tid"], truth["exporter"]["comm"] or "metrics_export"
    top = _in_run(report, truth)
    waited = _waited(own["main_cpu_wait_share"])
    absent, allowed = _by_rates(own, waited)
    kept = own["other_over_overlap"] is None or own["other_over_overlap"] >= KEPT_RATE
    absent |= NEVER | STEADY | INPUT | {"io-wait", "pageable-copies"}
    absent |= THREAD_WAIT if kept else set()
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]

    def on_exporter(c: CausalChain) -> bool:
        return any((etid is not None and etid in k.tids) or k.comm == ecomm for k in _people(c))

    for c in top:
        if c.root_cause in THREAD_WAIT:
            assert on_exporter(c), (c.summary, c.culprits, etid)
    _capped(top, {"host-bound", "launch-bound"},
            (own["main_run_s"] if own["main_run_s"] is not None else own["wall_s"]) + own["backward_s"], own)
    _capped(top, {"excess-sync"}, own["item_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    blamed = [c for c in top if c.root_cause in THREAD_WAIT or on_exporter(c)]
    _capped(blamed, {c.root_cause for c in blamed}, own["lost_in_export_s"], own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= GPU_BOUND and kept:
        ok = {"gpu-bound"} | (allowed - {"own-threads-cpu"})
        assert all(c.root_cause in ok for c in top), (_said(top), own)
        assert not any(on_exporter(c) for c in top), [(c.summary, c.culprits) for c in top]
    lead = HOST_SIDE | (allowed - absent) | (set() if kept else THREAD_WAIT)
    _gpu_busy_rules(top, own, lead, lead)
    shares = clocks_agree(report, truth)
    inside = shares["sleep_inside_ns"] + shares["run_inside_ns"]
    assert inside >= 0.5 * own["item_share"] - SHARE_SLACK, (shares, own)


CHECKS_22 = {"natural_tensor_str_logging": check_tensor_str_logging,
             "natural_anomaly_mode_left_on": check_anomaly_mode_left_on,
             "natural_healthy_textfile_exporter": check_healthy_textfile_exporter}
