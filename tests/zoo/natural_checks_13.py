"""The group natural13 (bench/gpu/zoo/device_zoo.sh natural13): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_13 into its CHECKS; the ways of reading findings it
shares with groups 8 to 12 are natural_shares'."""

from __future__ import annotations

import re
from pathlib import Path

from natural_shares import CHURN, CPU_WAIT_SHARE, CUDA_MALLOCS_PER_S, HOST_ALLOCS_PER_S, HOST_SIDE, INPUT
from natural_shares import PAGE_FAULTS_PER_S, STARVED_SHARE
from natural_shares import SECOND, SHARE_SLACK, clocks_agree
from natural_shares import in_run as _in_run, people as _people, said as _said, seconds as _seconds

from ingero_mcp.analysis.models import CausalChain, Report

# Causes that need a quota, a GPU sharer, a network, a signal, a timer that fires or a GPU that slowed down: none of
# these jobs has them (the collector runs on CPUs of its own; the loaders' and the queue's waits end when a batch
# comes).
NEVER = {"cpu-throttled", "gpu-shared", "network-wait", "slow-consumer", "stopped-by-signal", "timed-sleep",
         "gpu-slower"}
DISK_SHARE = 0.10  # of the bytes a worker read, the share from storage (not the page cache) from which IO is true
BUSY = 0.8  # a worker on a CPU or waiting for one this share of the run or more wanted a CPU all along
RESTART_SHARE = 0.2  # the epochs' worker starts and shutdowns, as a share of the run, from which the report says them
THIRD = 1 / 3
# What says that a loader's workers are started anew (each epoch) rather than only that the loop waited for them.
RESTART_WORDS = re.compile(r"persistent_workers|spawn|fork|restart|re-?creat|new (worker|process)|"
                           r"start(s|ed|ing)? (up )?(\w+ )?(worker|process)|(worker|process)(s|es)?'? start|epoch",
                           re.IGNORECASE)


def _scale(own: dict, chains: list[CausalChain]) -> float:
    """How much longer than the measured run the longest of these findings' windows is (at least 1): a finding's seconds
    may cover the warm-up's last seconds too, where the job ran as in the run (natural_checks_11's lesson)."""
    span = max([own["wall_s"]] + [(c.window.end_ns - c.window.start_ns) / SECOND for c in chains if c.window])
    return span / own["wall_s"]


def _text(c: CausalChain) -> str:
    return " ".join([c.summary, c.explanation, *c.recommendations])


def _gpu_rules(top: list[CausalChain], own: dict, lead: set[str]) -> None:
    """GPU busy (the script's kernels measured queued, over the run) under 40%: the report leads with `lead` and says
    nothing gpu-bound; 80% or more: everything but gpu-bound explains no more than the GPU's idle time (over the
    findings' longest window) plus half a second (a stall that is true and small may still be the first finding)."""
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy < 0.4:
        assert top and top[0].root_cause in lead, (_said(top), own)
        assert not any(c.root_cause == "gpu-bound" for c in top), _said(top)
    elif busy >= 0.8:
        rest = [c for c in top if c.root_cause != "gpu-bound"]
        assert _seconds(rest) <= (1 - busy) * own["wall_s"] * _scale(own, rest) + 0.5, (_said(rest), own)


def check_epoch_worker_restart(report: Report, truth: dict, store: Path) -> None:
    """A ResNet-18 trained for ~1 s epochs over 8,192 images held in one 509 MB numpy array by its Dataset, fed by
    DataLoader(num_workers=4) with persistent_workers at its default (False): every epoch's iter() forks 4 new workers
    from the large parent (truth `workers`: every pid seen, pt_data_worker; `epochs_ns`), its first next() waits for
    them to start and hand over a batch, its last next() shuts them down; the batches copied from pageable memory,
    .item() each step; the whole process (workers too) on CPUs 2-7, nothing else there. No HIGH or MEDIUM finding (in
    the measured run) says a cause it did not have: NEVER, IO (nothing is read from a file), contention by another
    process, a lock (the waits are the loader's queue and the workers' exits); churn and page faults only at their rates
    (CUDA_MALLOCS_PER_S; PAGE_FAULTS_PER_S in the main process or in a worker on average, the forks' copy-on-write
    faults included); the workers' CPUs only where a worker waited for a CPU STARVED_SHARE of its life or the main
    thread CPU_WAIT_SHARE of the run, own-threads-cpu only at the latter; under a tenth of the run in the loader
    (iter() and next()), no input wait, spawn or workers' CPUs at all. No culprit but the job's process and its workers
    (their pids, pt_data_worker, or a child process). A wait for input, a spawn and the workers' CPUs name a worker;
    together they explain no more than the main thread's time in the loader and its wait for a CPU, a spawn no more than
    the epochs' starts and shutdowns (iter(), the first and the last next()), pageable copies no more than the copies,
    the host side (HOST_SIDE) no more than the run less the time in next(), plus half a second (budgets over the
    findings' longest window). In the loader a third of the run or more: the report leads with it (an input wait or a
    spawn, or the workers' CPUs or page faults where true, host-bound where the forks' CPU time was half the loader's)
    naming a worker where it is a wait, a spawn or the workers' CPUs, and the loader's findings explain at least half
    the time next() slept. Where the starts and shutdowns took RESTART_SHARE of the run or more and half the loader's
    time or more, the report says the restarts: a spawn naming a worker, or a loader finding (or one of host-bound,
    page faults: the forks' own cost) that speaks of them (persistent_workers, a spawn or fork, workers started, the
    epochs: RESTART_WORDS). GPU busy (a step's kernels measured queued) under 40%: the lead is the loader or the host
    side, nothing gpu-bound; 80% or more: all but gpu-bound explain no more than the GPU's idle time plus half a second
    (a true, small stall may still lead). The main thread's sleep outside CUDA calls and wait for a CPU are at least its
    time in next() less its CPU time there, less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks'
    (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    workers = {w["pid"] for w in truth["workers"]}
    top = _in_run(report, truth)
    wall = own["wall_s"]

    def on_worker(c: CausalChain) -> bool:
        return any(k.pid in workers or k.comm == "pt_data_worker" or k.relation == "child process"
                   for k in _people(c) if k.pid != pid)

    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    per_worker_faults = (own["workers_minor_faults_per_s"] or 0.0) / max(own["workers"], 1)
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
    assert all(k.pid == pid or k.pid in workers or k.comm == "pt_data_worker" or k.relation == "child process"
               for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    loader = [c for c in top if c.root_cause in loader_causes]
    for c in loader:
        assert on_worker(c), (c.summary, c.culprits, sorted(workers)[:8])
    budget = (own["loader_s"] + (own["main_cpu_wait_s"] or 0.0)) * _scale(own, loader)
    assert _seconds(loader) <= budget + 0.5, (_said(loader), own)
    spawn = [c for c in top if c.root_cause == "spawning-processes"]
    assert _seconds(spawn) <= own["restart_s"] * _scale(own, spawn) + 0.5, (_said(spawn), own)
    copies = [c for c in top if c.root_cause == "pageable-copies"]
    assert _seconds(copies) <= own["copy_s"] * _scale(own, copies) + 0.5, (_said(copies), own)
    host = [c for c in top if c.root_cause in HOST_SIDE]
    assert _seconds(host) <= (wall - own["wait_s"]) * _scale(own, host) + 0.5, (_said(host), own)
    lead_loader = (loader_causes | ({"page-faults"} if faults else set())) - absent
    if own["iter_cpu_s"] >= 0.5 * own["loader_s"]:
        lead_loader |= {"host-bound"}  # the forks are the main thread's own CPU time
    if own["loader_share"] >= THIRD:
        assert top and top[0].root_cause in lead_loader, (_said(top), own)
        if top[0].root_cause in loader_causes:
            assert on_worker(top[0]), (top[0].summary, top[0].culprits, sorted(workers)[:8])
        said_loader = [c for c in top if c.root_cause in lead_loader]
        assert _seconds(said_loader) >= 0.5 * (own["wait_s"] - own["next_cpu_s"]), (_said(said_loader), own)
    if own["restart_share"] >= RESTART_SHARE and own["restart_s"] >= 0.5 * own["loader_s"]:
        says = [c for c in top if (c.root_cause == "spawning-processes" and on_worker(c))
                or (c.root_cause in loader_causes | {"host-bound", "page-faults"} and RESTART_WORDS.search(_text(c)))]
        assert says, ([(c.root_cause, _text(c)) for c in top], own)
    _gpu_rules(top, own, HOST_SIDE | lead_loader | {"pageable-copies"} | (CHURN if churn else set()))
    shares = clocks_agree(report, truth)
    stalled = shares["sleep_outside_ns"] + shares["cpu_wait_ns"]
    assert stalled >= own["wait_share"] - own["wait_cpu_share"] - SHARE_SLACK, (shares, own)


def check_zlib_compressed_shards(report: Report, truth: dict, store: Path) -> None:
    """A light conv net fed by DataLoader(num_workers=2, pin_memory=True, persistent_workers=True) whose Dataset reads
    images from 16 np.savez_compressed shards written to the local disk at set-up (in the page cache): per item, the
    worker reads its .npz member and zlib inflates it (npz[key]; the script times it: `inflate_fraction` of the items'
    time), then crops and flips it (truth `workers`: the pt_data_worker processes, on the job's CPUs 2-3 with the main
    process; `pin_thread`: PyTorch's pin-memory thread relaying their batches). No HIGH or MEDIUM finding (in the
    measured run) says a cause it did not have: NEVER, a spawn (the workers started before the run and persist),
    contention by another process, pageable copies (the batches are pinned; .item()'s 4 bytes cost their round trip);
    IO only where the workers read DISK_SHARE of their bytes from storage (/proc/PID/io); churn and page faults only
    at their rates (HOST_ALLOCS_PER_S, CUDA_MALLOCS_PER_S; PAGE_FAULTS_PER_S in any of the processes); the workers'
    CPUs only where a worker waited for a CPU STARVED_SHARE of the run or the main thread CPU_WAIT_SHARE,
    own-threads-cpu only where the main or the pin-memory thread did; under a tenth of the run in next(), no wait for
    input, lock or workers' CPUs at all. No culprit but the job's three processes (and the kernel). A wait for input or
    a lock (the main thread's wait for a batch from the pin-memory thread, said as one) names a worker (its pid or
    pt_data_worker) or the pin-memory thread, not only the autograd thread. The loader's findings (those, IO, the
    workers' or the threads' CPUs, page faults) explain no more than the main thread's time in next() and its wait for
    a CPU, the host side (HOST_SIDE) no more than the run less the time in next(), plus half a second (over the
    findings' longest window). In next() a third of the run or more: the report leads with the loader (a wait for input
    or a lock, or IO, the CPUs or page faults where true), naming a worker where both workers wanted a CPU (ran or
    waited for one) BUSY of the run or more and more than the pin-memory thread ran by a tenth of the run (the
    inflating workers are the bottleneck, the pin-memory thread only relays), a worker or the pin-memory thread
    otherwise; and the loader's findings explain at least half the time next() slept. GPU busy (a step's copy and
    kernels measured queued) under 40%: the lead is the loader or the host side, nothing gpu-bound; 80% or more: all
    but gpu-bound explain no more than the GPU's idle time plus half a second. The main thread's sleep outside CUDA
    calls and wait for a CPU are at least its time in next() less its CPU time there, less SHARE_SLACK; its time on a
    CPU and waiting for one, its own clocks' (SHARE_SLACK). (The share of the items' time spent inflating is recorded,
    `inflate_fraction`; the report is not held to naming zlib: its stacks are not guaranteed.)"""
    own, pid = truth["self"], truth["feeder"]["pid"]
    workers = {w["pid"] for w in truth["workers"]}
    pin = truth.get("pin_thread") or {}
    pin_tid, pin_comm = pin.get("tid"), pin.get("comm") or "pt_data_pin"
    top = _in_run(report, truth)
    wall = own["wall_s"]

    def on_worker(c: CausalChain) -> bool:
        return any(k.pid in workers or k.comm == "pt_data_worker" for k in _people(c))

    def on_pin(c: CausalChain) -> bool:
        return pin_tid is not None and any(pin_tid in k.tids or k.comm == pin_comm for k in _people(c))

    churn = (own["host_allocs_per_s"] or 0.0) >= HOST_ALLOCS_PER_S or own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = max(own["minor_faults_per_s"], own["workers_minor_faults_per_s_max"] or 0.0) >= PAGE_FAULTS_PER_S
    main_waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    waited = main_waited or (own["pin_cpu_wait_share"] or 0.0) >= CPU_WAIT_SHARE
    starved = (own["workers_cpu_wait_share_max"] or 0.0) >= STARVED_SHARE
    disk = (own["workers_disk_read_bytes"] or 0) >= DISK_SHARE * max(own["workers_rchar"] or 0, 1)
    relayed = INPUT | {"gil-or-lock"}  # the main thread's wait for a batch, said as a wait or a lock
    absent = NEVER | {"spawning-processes", "cpu-contention", "pageable-copies"}
    absent |= (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= (set() if starved or main_waited else {"own-workers-cpu"}) | (set() if waited else {"own-threads-cpu"})
    absent |= set() if disk else {"io-wait"}
    if own["wait_share"] < 0.1:
        absent |= relayed | {"own-workers-cpu"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid in workers | {pid} for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in relayed:
            assert on_worker(c) or on_pin(c), (c.summary, c.culprits, pin_tid, sorted(workers))
    loader_causes = relayed | {"io-wait", "own-workers-cpu", "own-threads-cpu", "page-faults"}
    loader = [c for c in top if c.root_cause in loader_causes]
    budget = (own["wait_s"] + (own["main_cpu_wait_s"] or 0.0)) * _scale(own, loader)
    assert _seconds(loader) <= budget + 0.5, (_said(loader), own)
    host = [c for c in top if c.root_cause in HOST_SIDE]
    assert _seconds(host) <= (wall - own["wait_s"]) * _scale(own, host) + 0.5, (_said(host), own)
    lead_loader = loader_causes - absent
    if own["wait_share"] >= THIRD:
        assert top and top[0].root_cause in lead_loader, (_said(top), own)
        if top[0].root_cause in relayed | {"own-workers-cpu", "io-wait"}:
            wanted = [(r["cpu_share"] or 0.0) + (r["cpu_wait_share"] or 0.0) for r in own["per_process"]]
            pin_run = own["pin_run_share"] or 0.0
            if wanted and min(wanted) >= BUSY and min(wanted) >= pin_run + 0.1:
                assert on_worker(top[0]), (top[0].summary, top[0].culprits, sorted(workers), own)
            else:
                assert on_worker(top[0]) or on_pin(top[0]), (top[0].summary, top[0].culprits, pin_tid, own)
        assert _seconds(loader) >= 0.5 * (own["wait_s"] - own["wait_cpu_s"]), (_said(loader), own)
    _gpu_rules(top, own, HOST_SIDE | lead_loader | (CHURN if churn else set()))
    shares = clocks_agree(report, truth)
    stalled = shares["sleep_outside_ns"] + shares["cpu_wait_ns"]
    assert stalled >= own["wait_share"] - own["wait_cpu_share"] - SHARE_SLACK, (shares, own)


def check_queue_backpressure(report: Report, truth: dict, store: Path) -> None:
    """A control: a wide MLP (fp32, tens of milliseconds of GPU work a step, .item() each step) fed by a producer thread
    of its own process (truth `producer`: batch_producer) that gathers each batch from a table in memory with numpy in
    a millisecond or two and put()s it on a queue.Queue(maxsize=4): the queue stays full, the producer spends most of
    its time blocked in put(), the main thread rarely waits in get(). One process on CPUs 2-3, no workers, no child, no
    file IO, no sleep. No HIGH or MEDIUM finding (in the measured run) says a cause it did not have: NEVER, a spawn, a
    wait on workers or a process, the workers' CPUs, IO, contention by another process; churn and page faults only at
    their rates (CUDA_MALLOCS_PER_S, PAGE_FAULTS_PER_S), own-threads-cpu only where the main thread waited for a CPU
    CPU_WAIT_SHARE of the run or more; a wait on a thread only where the main thread spent a tenth of the run or more
    in get(). No culprit outside the process. A wait on a thread and a lock name the producer (its tid or name), not
    only PyTorch's autograd thread; whatever blames the producer (those, or any finding naming it) explains no more
    than the main thread's time in get() and the producer's time making batches (its hold on the GIL at most), plus
    half a second (over the findings' longest window): its blocked put() is the trainer's back-pressure, not a cost.
    Pageable copies explain no more than the copies plus half a second. In get() a third of the run or more (the
    producer would then not have kept up): the report leads with the wait on it (waiting-on-thread, gil-or-lock, or
    own-threads-cpu where allowed), naming it. GPU busy (a step's kernels measured queued) 80% or more: no finding
    leads that blames the producer, and all but gpu-bound explain no more than the GPU's idle time plus half a second
    (the .item() each step waits for a busy GPU: that costs only the gap it leaves); under 40%: the lead is the host
    side (HOST_SIDE, or the waits allowed above), nothing gpu-bound. The main thread's time inside CUDA calls (asleep or
    running: .item()'s wait for the GPU) is at least half its measured .item() share; its time on a CPU and waiting
    for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    ptid, pcomm = truth["producer"]["tid"], truth["producer"]["comm"]
    top = _in_run(report, truth)

    def on_producer(c: CausalChain) -> bool:
        return any(ptid in k.tids or k.comm == pcomm for k in _people(c))

    churn = own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    absent = NEVER | {"spawning-processes", "waiting-on-workers", "waiting-on-process", "own-workers-cpu", "io-wait",
                      "cpu-contention"}
    absent |= (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= set() if waited else {"own-threads-cpu"}
    absent |= {"waiting-on-thread"} if own["get_share"] < 0.1 else set()
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in ("waiting-on-thread", "gil-or-lock"):
            assert on_producer(c), (c.summary, c.culprits, ptid)
    blamed = [c for c in top if c.root_cause in ("waiting-on-thread", "gil-or-lock") or on_producer(c)]
    budget = (own["get_s"] + own["producer_make_s"]) * _scale(own, blamed)
    assert _seconds(blamed) <= budget + 0.5, (_said(blamed), own)
    copies = [c for c in top if c.root_cause == "pageable-copies"]
    assert _seconds(copies) <= own["copy_s"] * _scale(own, copies) + 0.5, (_said(copies), own)
    allowed = (CHURN if churn else set()) | ({"page-faults"} if faults else set()) | (
        {"own-threads-cpu"} if waited else set())
    if own["get_share"] >= THIRD:
        lead = {"waiting-on-thread", "gil-or-lock"} | ({"own-threads-cpu"} if waited else set())
        assert top and top[0].root_cause in lead, (_said(top), own)
        assert on_producer(top[0]), (top[0].summary, top[0].culprits, ptid)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= 0.8:
        assert not (top and top[0] in blamed), (_said(top), own)
    waits = ({"waiting-on-thread", "gil-or-lock"} if own["get_share"] >= 0.1 else set())
    _gpu_rules(top, own, HOST_SIDE | allowed | waits)
    shares = clocks_agree(report, truth)
    assert shares["sleep_inside_ns"] + shares["run_inside_ns"] >= 0.5 * own["item_share"], (shares, own)


CHECKS_13 = {"natural_epoch_worker_restart": check_epoch_worker_restart,
             "natural_zlib_compressed_shards": check_zlib_compressed_shards,
             "natural_queue_backpressure": check_queue_backpressure}
