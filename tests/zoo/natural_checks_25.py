"""The group natural25 (bench/gpu/zoo/device_zoo.sh natural25): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. Unlike natural22-24, whose costs were the main thread's own work, two of these jobs' main thread
mostly waits on someone else: on DataLoader workers that take turns at a file lock, and on a logging listener thread
that fsyncs every record; the third is a GPU-bound control with a child process and a thread as decoys.
tests/zoo/test_zoo_natural.py merges CHECKS_25 into its CHECKS; the ways of reading findings it shares with earlier
groups are natural_shares', natural_checks_11's, natural_checks_13's, natural_checks_20's, natural_checks_22's and
natural_checks_23's."""

from __future__ import annotations

import re
from pathlib import Path

from natural_checks_11 import KERNEL_IO_THREAD
from natural_checks_13 import DISK_SHARE
from natural_checks_20 import LOCK_WORDS
from natural_checks_22 import GPU_BOUND, NEVER, STEADY, THIRD, THREAD_WAIT, WAITED_SHARE
from natural_checks_22 import _ours, _shown, _waited
from natural_checks_23 import COPIES, HOST_WORK, _autograd, _rates
from natural_shares import CPU_WAIT_SHARE, HOST_SIDE, INPUT, SHARE_SLACK, STARVED_SHARE, clocks_agree
from natural_shares import capped as _capped, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import own_lead as _own_lead, people as _people, said as _said, seconds as _seconds

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

# A wait on workers said as a lock between them: the thread lock's words and the file lock's.
FILE_LOCK_WORDS = re.compile(rf"{LOCK_WORDS.pattern}|flock|fcntl|file[- ]lock", re.IGNORECASE)
# What a wait on the logging listener may be said as: a wait on a thread (or the queue's lock), a slow consumer of
# what the loop produces, or the IO the listener waits for (its fsyncs).
ON_LISTENER = THREAD_WAIT | {"slow-consumer"}
LISTENER_LEAD = ON_LISTENER | {"io-wait"}
# What the control's steps must not be charged to: the decoys are a process and a thread of the job.
DECOY_BLAME = THREAD_WAIT | INPUT | {"own-workers-cpu", "slow-consumer", "spawning-processes"}


def _text(c: CausalChain) -> str:
    return f"{c.summary} {c.explanation} {' '.join(c.recommendations)}"


def _cpu_waits(own: dict, *keys: str) -> float:
    return sum(own.get(k) or 0.0 for k in keys)


def check_flock_hdf5_workers(report: Report, truth: dict, store: Path) -> None:
    """A small ResNet (fp32 without TF32, 128 crops of 3x160x160 a step, SGD, loss.item() each step) fed by
    DataLoader(num_workers=4, persistent_workers=True) whose workers (truth `workers`: pt_data_worker pids, forked
    before the measured run) read every sample of one packed zlib-compressed file under an exclusive fcntl.flock on a
    lock file (open, pread, close and inflate under it, a crop and a flip outside it): the workers take turns at the
    lock and the main thread waits in next(). The file is in the page cache; all on CPUs 2-3; no threads of the job's
    own, no children but the workers, no sleep. No HIGH or MEDIUM finding (in the measured run) says a cause the job did
    not have: NEVER, a timed sleep, a slower GPU, a spawn (the workers started before the run), a cold start; IO only
    where the workers read DISK_SHARE of their bytes from storage; the workers' CPUs (own-workers-cpu) only where a
    worker waited for a CPU STARVED_SHARE of the run; churn, faults and own-threads-cpu or cpu-contention only at the
    rates (natural_checks_23's _rates: the main thread or the autograd thread waiting for a CPU CPU_WAIT_SHARE of the
    run or more). Every culprit is the job's process or one of its workers. An input wait, a lock or own-workers-cpu
    names a worker (its pid, a tid of it, or pt_data_worker), except a wait on a thread or a lock naming PyTorch's
    autograd thread (the backward). Those naming the workers explain no more than the main thread's time in next();
    those on the autograd thread no more than its time in loss.backward(); pageable copies and excess-sync no more than
    the batch's copy and .item(); host-bound and launch-bound no more than its time on a CPU and in loss.backward();
    own-threads-cpu and cpu-contention no more than the two threads' wait for a CPU; each plus half a second (over the
    findings' longest window). With the lock's cost (`lock_overhead_s`: the run's time beyond its steps at the rate
    measured without the lock) and the main thread's time in next() both a third of the run or more, the report leads,
    said of the job's process, with the wait on the workers (an input wait, a lock, or own-workers-cpu where true)
    naming a worker, nothing gpu-bound, and the findings naming the workers explain at least half the main thread's time
    in next() off its CPU; and with the workers waiting for the lock half their time or more, some finding (any
    severity, in the run) naming a worker says the lock (gil-or-lock, or a lock or flock in its words). With the main
    thread's time in next() off its CPU under a tenth of the run, no input wait. GPU busy (a step's kernels measured
    queued) under 40%: the lead is that wait or the host side, nothing gpu-bound; 80% or more: those explain no more
    than the GPU's idle time plus half a second. The main thread's sleep outside CUDA calls and wait for a CPU are at
    least its time in next() off its CPU less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    wpids = {w["pid"] for w in truth["workers"]}
    wtids = {t for w in truth["workers"] for t in w["tids"]}
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = _waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _rates(own, waited)
    starved = (own["workers_cpu_wait_max_share"] or 0.0) >= STARVED_SHARE
    disk = own["workers_disk_read_bytes"] >= DISK_SHARE * max(own["workers_rchar"], 1)
    absent |= NEVER | {"timed-sleep", "gpu-slower", "spawning-processes", "cold-start"}
    absent |= (set() if starved else {"own-workers-cpu"}) | (set() if disk else {"io-wait"})
    allowed |= ({"own-workers-cpu"} if starved else set()) | ({"io-wait"} if disk else set())
    wait_off = own["wait_off_cpu_s"]
    if wait_off < WAITED_SHARE * wall:
        absent |= INPUT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or k.pid in wpids for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]

    def is_worker(k: Culprit) -> bool:
        return k.pid in wpids or bool(wtids & set(k.tids)) or (k.comm or "").startswith("pt_data_worker")

    def on_workers(c: CausalChain) -> bool:
        return any(is_worker(k) for k in _people(c))

    waits = INPUT | {"gil-or-lock", "own-workers-cpu"}
    for c in top:
        if c.root_cause in waits:
            assert on_workers(c) or (c.root_cause in THREAD_WAIT and on_autograd(c)), (c.summary, c.culprits, wpids)
    on_w = [c for c in top if c.root_cause in waits and on_workers(c)]
    _capped(on_w, waits, own["wait_s"], own)
    _capped([c for c in top if c.root_cause in THREAD_WAIT and not on_workers(c)], THREAD_WAIT, own["backward_s"], own)
    _capped(top, COPIES, own["h2d_s"] + own["item_s"], own)
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s"), own)
    lead = INPUT | {"gil-or-lock"} | ({"own-workers-cpu"} if starved else set())
    overhead = own["lock_overhead_s"]
    assert overhead is not None, "the script did not measure the loop without the lock"
    if overhead >= THIRD * wall and own["wait_share"] >= THIRD:
        _own_lead(top, lead - absent, pid, own)
        assert on_workers(top[0]), (top[0].summary, top[0].culprits, sorted(wpids))
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds(on_w) >= 0.5 * wait_off, (_said(on_w), own)
        if own["lock_wait_share_of_workers"] >= 0.5:
            seen = [c for c in _shown(report, truth) if on_workers(c) and (
                c.root_cause == "gil-or-lock" or FILE_LOCK_WORDS.search(_text(c)))]
            assert seen, (_said(report.chains), own)
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= wait_off / wall - SHARE_SLACK, (shares, own)


def check_log_queue_fsync_listener(report: Report, truth: dict, store: Path) -> None:
    """The zoo's MLP (batch 2048 on the GPU, fp32, fused AdamW, clip_grad_norm_, a cosine lr schedule) that reads 8
    values back once a step (.tolist(): its one wait for the GPU) and logs 12 records a step through a QueueHandler
    whose enqueue() blocks on a bounded queue.Queue(maxsize=512), drained by a QueueListener thread (truth `listener`:
    log_listener) whose FileHandler flushes and fsyncs every record to the local disk. Once the listener falls behind,
    every put() sleeps on the queue's condition until the listener's next get(): the main thread waits on the listener,
    which waits on the disk. One process on CPUs 2-3; no workers, no children, no timed sleep, no copies but the
    read-back's 32 bytes. No HIGH or MEDIUM finding (in the measured run) says a cause the job did not have: NEVER but a
    slow consumer (the listener is one, of the loop's records), STEADY, a wait on workers or a process, pageable copies;
    IO only where the listener spent a tenth of the run or more in fsync; churn, faults and own-threads-cpu or
    cpu-contention only at the rates (the main, autograd or listener thread waiting for a CPU CPU_WAIT_SHARE of the run
    or more). Every culprit is the job's process, or the kernel's IO threads (the journal, writeback) in an IO wait or a
    wait on the listener. A wait on a thread, a lock or a slow consumer names the listener (its tid or name), or
    PyTorch's autograd thread for a wait on a thread or a lock. Those naming the listener and IO waits explain no more
    than the main thread's time in put() plus half a second; those on the autograd thread no more than its time in
    loss.backward(); excess-sync no more than the read-back; host-bound and launch-bound no more than the main thread's
    time on a CPU and in loss.backward(); own-threads-cpu and cpu-contention no more than the three threads' wait for a
    CPU; each plus half a second (over the findings' longest window). With the main thread's time in put() off its CPU a
    third of the run or more, the report leads, said of the job's process, with the wait on the listener (a wait on a
    thread, a lock or a slow consumer naming the listener, or the IO it waits for), nothing gpu-bound, and those
    findings explain at least half that time; with it a tenth or more, some finding (any severity, in the run) says it
    (naming the listener, or io-wait of the process); under a tenth, no finding names the listener. GPU busy (a step's
    kernels measured queued) under 40%: the lead is that wait or the host side, nothing gpu-bound; 80% or more: those
    explain no more than the GPU's idle time plus half a second. The main thread's sleep outside CUDA calls and wait for
    a CPU are at least its time in put() off its CPU less SHARE_SLACK; its time on a CPU and waiting for one, its own
    clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    lis = truth["listener"]
    ltids, lcomm = set(lis["tids"]) | ({lis["tid"]} if lis.get("tid") else set()), lis.get("comm") or "log_listener"
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = (_waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
              or (own.get("listener_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE)
    absent, allowed = _rates(own, waited)
    io = own["listener_fsync_s"] >= WAITED_SHARE * wall
    absent |= (NEVER - {"slow-consumer"}) | STEADY | (INPUT - {"waiting-on-thread"}) | {"pageable-copies"}
    absent |= set() if io else {"io-wait"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    for c in top:
        for k in _people(c):
            kernel_io = c.root_cause in LISTENER_LEAD and bool(KERNEL_IO_THREAD.match(k.comm or ""))
            assert k.pid == pid or kernel_io, (c.summary, c.culprits)

    def is_listener(k: Culprit) -> bool:
        return bool(ltids & set(k.tids)) or k.comm == lcomm

    def on_listener(c: CausalChain) -> bool:
        return any(is_listener(k) for k in _people(c))

    for c in top:
        if c.root_cause in ON_LISTENER:
            assert on_listener(c) or (c.root_cause in THREAD_WAIT and on_autograd(c)), (c.summary, c.culprits, ltids)
    blamed = [c for c in top if on_listener(c) or c.root_cause == "io-wait"]
    _capped(blamed, {c.root_cause for c in blamed}, own["put_s"], own)
    _capped([c for c in top if c.root_cause in THREAD_WAIT and not on_listener(c)], THREAD_WAIT, own["backward_s"],
            own)
    _capped(top, {"excess-sync"}, own["item_s"], own)
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"},
            _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s", "listener_cpu_wait_s"), own)
    put_off = own["put_off_cpu_s"]
    lead = LISTENER_LEAD - absent
    if put_off >= THIRD * wall:
        _own_lead(top, lead, pid, own)
        c0 = top[0]
        assert on_listener(c0) or c0.root_cause == "io-wait", (c0.summary, c0.culprits, ltids)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        said_wait = [c for c in top if c.root_cause in lead and (on_listener(c) or c.root_cause == "io-wait")]
        assert _seconds(said_wait) >= 0.5 * put_off, (_said(said_wait), own)
    if put_off >= WAITED_SHARE * wall:
        seen = [c for c in _shown(report, truth) if (c.root_cause in LISTENER_LEAD and on_listener(c))
                or (c.root_cause == "io-wait" and _ours(c, pid))]
        assert seen, (_said(report.chains), own)
    else:
        assert not any(on_listener(c) for c in top), [(c.summary, c.culprits) for c in top]
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= put_off / wall - SHARE_SLACK, (shares, own)


def check_healthy_elastic_timer(report: Report, truth: dict, store: Path) -> None:
    """A control: a GPU-bound MLP (512-4096, three 4096x4096 layers, batch 8192 on the GPU, fp32, fused AdamW: tens of
    ms of GPU work a step, loss.item() each step its one wait for the GPU) whose every step runs under torchelastic's
    `timer.expires(after=60)`: two TimerRequests a step put on a multiprocessing.Queue, written to a pipe by the queue's
    feeder thread in the job's process (truth `feeder_thread`), read by a LocalTimerServer in a child process forked
    before the run (truth `server`: timer_server, its watchdog thread waking every 0.1 s); truth `decoys` lists both.
    One process and its server on CPUs 2-3; no workers, no IO of the loop's own, no timed sleep in the loop, no copies
    but .item()'s 4 bytes. No HIGH or MEDIUM finding (in the measured run) says a cause it did not have: NEVER, STEADY
    (the server was started once, before the run; its timer is its own, off the loop), IO, pageable copies; a wait on a
    thread, a process or workers, a lock, a slow consumer or the workers' CPUs only where the timer cost the steps a
    tenth of the run or more (`timer_overhead_s`, against the same loop without the timer measured before the run),
    naming a decoy (a wait on a thread or a lock may also name PyTorch's autograd thread); churn, faults and
    own-threads-cpu or cpu-contention only at the rates. No culprit outside the job's process but the server, and the
    server only where the timer cost a tenth of the run. The job measured itself GPU-bound (busy GPU_BOUND or more) and
    the timer cost under a tenth of the run: no HIGH or MEDIUM finding but gpu-bound and the churn or page faults the
    rates make true, none naming a decoy (the server's pid or tids, the feeder thread's tid or name). Any finding naming
    a decoy explains no more than the timer's cost plus half a second; a wait on the autograd thread no more than the
    main thread's time in loss.backward(); host-bound and launch-bound no more than its time on a CPU and in
    loss.backward(); excess-sync no more than its .item() time; own-threads-cpu and cpu-contention no more than the
    main, autograd and feeder threads' wait for a CPU; each plus half a second. GPU busy under 40% (the premise wrong):
    the lead is the host side or those allowed, nothing gpu-bound; 80% or more: those explain no more than the GPU's
    idle time plus half a second. The main thread's time inside CUDA calls (asleep or spinning in .item()'s wait) is at
    least half its .item() share less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    srv, fdr = truth["server"], truth["feeder_thread"]
    spid, stids = srv["pid"], set(srv["tids"])
    ftid = fdr.get("tid")
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = (_waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
              or (own.get("feeder_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE)
    absent, allowed = _rates(own, waited)
    overhead = own["timer_overhead_s"]
    assert overhead is not None, "the script did not measure the loop without the timer"
    kept = overhead < WAITED_SHARE * wall
    absent |= NEVER | STEADY | {"io-wait", "pageable-copies"}
    if kept:
        absent |= (INPUT - THREAD_WAIT) | {"own-workers-cpu", "slow-consumer"}
    else:
        absent -= {"waiting-on-process", "waiting-on-workers", "own-workers-cpu", "slow-consumer"}
    if atid is None and kept:
        absent |= THREAD_WAIT

    def is_decoy(k: Culprit) -> bool:
        return k.pid == spid or bool(stids & set(k.tids)) or (ftid is not None and ftid in k.tids) or (
            k.comm == srv.get("comm") and k.comm is not None)

    def on_decoy(c: CausalChain) -> bool:
        return any(is_decoy(k) for k in _people(c))

    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or (not kept and k.pid == spid) for c in top for k in _people(c)), \
        [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in DECOY_BLAME:
            ok = on_decoy(c) or (c.root_cause in THREAD_WAIT and on_autograd(c))
            assert ok and (not kept or not on_decoy(c)), (c.summary, c.culprits, spid, ftid)
    blamed = [c for c in top if on_decoy(c)]
    _capped(blamed, {c.root_cause for c in blamed}, overhead, own)
    _capped([c for c in top if c.root_cause in THREAD_WAIT and not on_decoy(c)], THREAD_WAIT, own["backward_s"], own)
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(top, {"excess-sync"}, own["item_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"},
            _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s", "feeder_cpu_wait_s"), own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= GPU_BOUND and kept:
        ok = {"gpu-bound"} | (allowed - {"own-threads-cpu"})
        assert all(c.root_cause in ok for c in top), (_said(top), own)
        assert not any(on_decoy(c) for c in top), [(c.summary, c.culprits) for c in top]
    lead = HOST_SIDE | (allowed - absent) | (THREAD_WAIT if atid is not None else set()) | (
        set() if kept else DECOY_BLAME - absent)
    _gpu_busy_rules(top, own, lead, lead)
    shares = clocks_agree(report, truth)
    inside = shares["sleep_inside_ns"] + shares["run_inside_ns"]
    assert inside >= 0.5 * own["item_share"] - SHARE_SLACK, (shares, own)


CHECKS_25 = {"natural_flock_hdf5_workers": check_flock_hdf5_workers,
             "natural_log_queue_fsync_listener": check_log_queue_fsync_listener,
             "natural_healthy_elastic_timer": check_healthy_elastic_timer}
