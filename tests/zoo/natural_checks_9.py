"""The group natural9 (bench/gpu/zoo/device_zoo.sh natural9): three jobs with nothing staged, whose checks were written
before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what it
cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_9 into its CHECKS. (The helpers below repeat
test_zoo_natural's few that these need: that module imports this one.)"""

from __future__ import annotations

import re
from pathlib import Path

from natural_shares import SHARE_SLACK, feeder_shares, shares_agree
from test_zoo import SECOND, _top

from ingero_mcp.analysis.models import CausalChain, Report

INPUT = {"waiting-on-workers", "waiting-on-process", "waiting-on-thread"}
HOST_SIDE = {"launch-bound", "host-bound", "excess-sync"}
CHURN = {"allocator-churn", "driver-lock"}  # memory allocated and released (device or page-locked host) per step
SPAWN = {"spawning-processes", "waiting-on-process"}  # a child the loop starts and waits for
THIRD = 1 / 3
# Where the truth says whether a cause was there at all: from these rates over the run it may be named.
PAGE_FAULTS_PER_S = 10_000.0  # a process's minor page faults a second
HOST_ALLOCS_PER_S = 2.0  # the caching host allocator's cudaHostAlloc calls a second (num_host_alloc)
CUDA_MALLOCS_PER_S = 10.0  # the device allocator's cudaMalloc calls a second (segment.all.allocated)
CPU_WAIT_SHARE = 0.05  # the main thread's wait for a CPU (schedstat run delay), as a share of the run
STARVED_SHARE = 0.10  # a worker's wait for a CPU (schedstat), as a share of the run, from which it was starved
DISK_WORDS = re.compile(r"\bIO\b|\bI/O\b|disk|storage|page cache|D state|D-state", re.IGNORECASE)


def _people(c: CausalChain) -> list:
    """A chain's culprits that are tasks (not the kernel or an interrupt)."""
    return [k for k in c.culprits if k.relation not in ("kernel", "interrupt")]


def _said(chains: list[CausalChain]) -> list[str]:
    return [f"{c.severity} {c.root_cause}: {c.summary}" for c in chains]


def _seconds(chains: list[CausalChain]) -> float:
    return sum(c.seconds_lost or 0.0 for c in chains)


def check_nvidia_smi_logger(report: Report, truth: dict, store: Path) -> None:
    """The zoo's MLP (loss.item() each step) logging the GPU every 10 steps with subprocess.run(nvidia-smi ...,
    capture_output=True) on its main thread (truth `children`: the children's comm; `command`): the main thread starts
    the child, then sleeps in the pipes' poll and wait4 until it has exited, the GPU idle meanwhile (the step before
    ended with .item()). One process on CPUs 2-3 (its children inherit them), no thread of its own but PyTorch's
    autograd thread, no workers, no disk IO, no lock, no sleep of its own, no copies but .item()'s 4 bytes. No HIGH or
    MEDIUM finding says a cause it did not have: an input wait but on the children, workers, IO (the children's exec
    reads a binary in the page cache), a quota, a GPU sharer (nvidia-smi queries NVML, it runs no kernels), a network,
    a slow consumer, a signal, a timed sleep (the waits have no timeout), a lock, pageable copies, a slower GPU, memory
    churn; page faults only at PAGE_FAULTS_PER_S; contention (own-threads-cpu, cpu-contention) only where the main
    thread waited for a CPU CPU_WAIT_SHARE of the run or more (schedstat), for no more than that wait plus half a
    second. Every culprit is the job's process or one of its children (their comm, or a child process). A spawn or a
    wait on a process names a child and explains no more than the time in subprocess.run plus half a second; none at
    all where the calls took under 5% of the run. With the calls a third of the run or more, the report leads with
    them (spawning-processes or waiting-on-process, naming a child), and those explain at least half their time.
    Launch-bound and excess-sync explain no more than the steps' queueing and .item() plus half a second; the host side
    (HOST_SIDE) no more than the run less the main thread's sleep in the calls, plus half a second. GPU busy (a step's
    kernels measured queued) under 40%: nothing gpu-bound, and with the calls under a third the report leads with the
    host side or the calls; 80% or more: the host side and the calls explain no more than the GPU's idle time plus half
    a second. The main thread's sleep outside CUDA calls is at least its measured sleep in the calls (their wall less
    its CPU time and wait for a CPU in them, by schedstat) less SHARE_SLACK; its time on a CPU and waiting for one, its
    own clocks' (SHARE_SLACK)."""
    own, pid, child = truth["self"], truth["feeder"]["pid"], truth["children"]["comm"]
    top = _top(report)
    wall = own["wall_s"]

    def is_child(k) -> bool:
        return k.pid != pid and (k.relation == "child process" or k.comm == child)

    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    absent = CHURN | {"waiting-on-workers", "waiting-on-thread", "own-workers-cpu", "io-wait", "cpu-throttled",
                      "gpu-shared", "network-wait", "slow-consumer", "stopped-by-signal", "timed-sleep", "gil-or-lock",
                      "pageable-copies", "gpu-slower"}
    absent |= set() if own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S else {"page-faults"}
    absent |= set() if waited else {"own-threads-cpu", "cpu-contention"}
    absent |= SPAWN if own["smi_share"] < 0.05 else set()
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or is_child(k) for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in SPAWN:
            assert any(is_child(k) for k in _people(c)), (c.summary, c.culprits, child)
        if c.root_cause == "own-threads-cpu":
            assert all(k.pid == pid for k in _people(c)), (c.summary, c.culprits)
    spawn = [c for c in top if c.root_cause in SPAWN]
    assert _seconds(spawn) <= own["smi_s"] + 0.5, (_said(spawn), own)
    if own["smi_share"] >= THIRD:
        assert top and top[0].root_cause in SPAWN, (_said(top), own)
        assert any(is_child(k) for k in _people(top[0])), (top[0].summary, top[0].culprits, child)
        assert _seconds(spawn) >= 0.5 * own["smi_s"], (_said(spawn), own)
    contention = [c for c in top if c.root_cause in ("own-threads-cpu", "cpu-contention")]
    assert _seconds(contention) <= (own["main_cpu_wait_s"] or 0.0) + 0.5, (_said(contention), own)
    syncs = [c for c in top if c.root_cause in ("launch-bound", "excess-sync")]
    assert _seconds(syncs) <= own["launch_s"] + own["item_s"] + 0.5, (_said(syncs), own)
    host = [c for c in top if c.root_cause in HOST_SIDE]
    assert _seconds(host) <= wall - own["smi_sleep_s"] + 0.5, (_said(host), own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy < 0.4:
        assert not any(c.root_cause == "gpu-bound" for c in top), _said(top)
        if own["smi_share"] < THIRD:
            assert top and top[0].root_cause in HOST_SIDE | SPAWN, (_said(top), own)
    elif busy >= 0.8:
        assert _seconds(host + spawn) <= (1 - busy) * wall + 0.5, (_said(host + spawn), own)
    shares = feeder_shares(report, truth)
    assert shares["sleep_outside_ns"] >= own["smi_sleep_share"] - SHARE_SLACK, (shares, own)
    shares_agree(shares, own)


def check_thread_prefetch_python(report: Report, truth: dict, store: Path) -> None:
    """A small ResNet fed by a producer thread of its own process (truth `producer`: batch_prefetch) that augments each
    sample in Python over numpy and hands batches over through a queue.Queue(maxsize=4); the main thread get()s,
    copies from pageable memory, trains and reads the loss with .item(). Both threads run Python, so besides waiting in
    get() for a batch not yet made, the main thread waits for the GIL the producer holds. One process on CPUs 2-3, no
    other process, no workers, no disk IO, no sleep of its own (get() and put() wait without a timeout on the main
    thread; the GIL's waits are its own, not a sleep in the code). No HIGH or MEDIUM finding says a cause it did not
    have: a wait on workers or a process, workers' CPUs, IO, a quota, contention by another process (its threads
    waiting behind one another is own-threads-cpu), a GPU sharer, a network, a slow consumer, a spawn, a signal, a
    timed sleep, a slower GPU, memory churn; page faults only at PAGE_FAULTS_PER_S; own-threads-cpu only where the main
    thread waited for a CPU CPU_WAIT_SHARE of the run or more, naming its own threads, for no more than that wait plus
    half a second. No culprit outside the process. A wait on a thread and a lock (gil-or-lock) name the producer (its
    tid or name), not only PyTorch's autograd thread (whose backward is the step's own work). The findings that blame
    the producer (those, or any naming it) explain no more than the main thread was off its CPU (the run less its CPU
    time by schedstat) plus half a second. Blocked in get() a third of the run or more: the report leads with that wait
    on the producer (waiting-on-thread, gil-or-lock, or own-threads-cpu where allowed: the same wait said by why the
    producer was slow), naming it, and the findings that blame it explain at least half the time get() slept.
    Pageable copies explain no more than the copies plus half a second; the host side (HOST_SIDE) no more than the main
    thread's CPU time and .item() plus half a second. GPU busy (a step's kernels measured queued) under 40%: nothing
    gpu-bound; 80% or more: no wait on the producer leads, and the host side explains no more than the GPU's idle time
    plus half a second. The main thread's sleep outside CUDA calls and wait for a CPU are at least its time in get()
    less its CPU time there, less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    ptid, pcomm = truth["producer"]["tid"], truth["producer"]["comm"]
    top = _top(report)
    wall = own["wall_s"]
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    absent = CHURN | {"waiting-on-workers", "waiting-on-process", "own-workers-cpu", "io-wait", "cpu-throttled",
                      "cpu-contention", "gpu-shared", "network-wait", "slow-consumer", "spawning-processes",
                      "stopped-by-signal", "timed-sleep", "gpu-slower"}
    absent |= set() if own["minor_faults_per_s"] >= PAGE_FAULTS_PER_S else {"page-faults"}
    absent |= set() if waited else {"own-threads-cpu"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]

    def on_producer(c: CausalChain) -> bool:
        return any(ptid in k.tids or k.comm == pcomm for k in _people(c))

    for c in top:
        if c.root_cause in ("waiting-on-thread", "gil-or-lock"):
            assert on_producer(c), (c.summary, c.culprits, ptid)
    blamed = [c for c in top if c.root_cause in ("waiting-on-thread", "gil-or-lock") or on_producer(c)]
    assert _seconds(blamed) <= wall - own["main_run_s"] + 0.5, (_said(blamed), own)
    if own["get_share"] >= THIRD:
        lead = {"waiting-on-thread", "gil-or-lock"} | ({"own-threads-cpu"} if waited else set())
        assert top and top[0].root_cause in lead, (_said(top), own)
        assert on_producer(top[0]), (top[0].summary, top[0].culprits, ptid)
        assert _seconds(blamed) >= 0.5 * (own["get_s"] - own["get_cpu_s"]), (_said(blamed), own)
    assert _seconds([c for c in top if c.root_cause == "own-threads-cpu"]) <= (own["main_cpu_wait_s"] or 0.0) + 0.5, \
        (_said(top), own)
    assert _seconds([c for c in top if c.root_cause == "pageable-copies"]) <= own["copy_s"] + 0.5, (_said(top), own)
    host = [c for c in top if c.root_cause in HOST_SIDE]
    assert _seconds(host) <= own["main_run_s"] + own["item_s"] + 0.5, (_said(host), own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy < 0.4:
        assert not any(c.root_cause == "gpu-bound" for c in top), _said(top)
    elif busy >= 0.8:
        assert not (top and top[0].root_cause in {"waiting-on-thread", "gil-or-lock"}), _said(top)
        assert _seconds(host) <= (1 - busy) * wall + 0.5, (_said(host), own)
    shares = feeder_shares(report, truth)
    floor = own["get_share"] - own["get_cpu_share"] - SHARE_SLACK
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= floor, (shares, own)
    shares_agree(shares, own)


def check_cold_npy_files(report: Report, truth: dict, store: Path) -> None:
    """The first epoch over per-sample .npy files evicted from the page cache at set-up, read with np.load by a
    2-worker pinned DataLoader (truth `workers`: the pt_data_worker processes, on CPUs 4 and 5 of their own); the main
    process on CPUs 2-3 (its main thread, PyTorch's pin-memory thread relaying the workers' batches, the autograd
    thread). The set-up (writing, syncing and evicting the files) precedes the measured run (truth baseline_ns): only
    the HIGH and MEDIUM findings whose window overlaps the run by over half a second (or that have none) are held to
    it. None says a cause the run did not have: a quota, contention by another process, a GPU sharer, a network, a
    slow consumer, a spawn (the workers started before the run), a signal, a timed sleep (the loader's waits end when a
    batch arrives), pageable copies (the batches are pinned; .item()'s 4 bytes cost their round trip), a slower GPU;
    memory churn only where the allocators' counters grew (cudaHostAlloc HOST_ALLOCS_PER_S a second, or cudaMalloc
    CUDA_MALLOCS_PER_S); page faults only where the main process or a worker faulted PAGE_FAULTS_PER_S a second;
    own-workers-cpu only where a worker waited for a CPU STARVED_SHARE of the run (schedstat); own-threads-cpu only
    where the main thread waited CPU_WAIT_SHARE. No culprit but the job's processes. A wait for input, IO and the
    workers' CPUs name a worker process (its pid, or pt_data_worker), not only the pin-memory thread that relays their
    batches, and together explain no more than the main thread's time in next() plus half a second; under a tenth of
    the run in next(), none of them. In next() a third of the run or more: the report leads with the loader (a wait
    for input, io-wait, or the workers' CPUs or page faults where allowed) naming a worker, and those findings explain
    at least half the time next() slept; and where the data measurably came from the disk (the workers read from
    storage at least half the bytes they loaded, /proc/PID/io), the workers spent over half the run in np.load and over
    half of that off a CPU, the report says the disk: an io-wait finding naming a worker, or a lead that speaks of IO or
    the disk. The host side (HOST_SIDE) explains no more than the run less the time in next(), plus half a second. GPU
    busy (a step's copy and kernels measured queued) under 40%: nothing gpu-bound; 80% or more: no loader finding
    leads, and the host side explains no more than the GPU's idle time plus half a second. The main thread's sleep
    outside CUDA calls and wait for a CPU are at least its time in next() less its CPU time there, less SHARE_SLACK; its
    time on a CPU and waiting for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    workers = {w["pid"] for w in truth["workers"]}
    lo, hi = truth["baseline_ns"]
    wall = own["wall_s"]

    def in_run(c: CausalChain) -> bool:
        return c.window is None or min(c.window.end_ns, hi) - max(c.window.start_ns, lo) > SECOND // 2

    def on_worker(c: CausalChain) -> bool:
        return any(k.pid in workers or k.comm == "pt_data_worker" for k in _people(c))

    run = [c for c in _top(report) if in_run(c)]
    churn = (own["host_allocs_per_s"] or 0.0) >= HOST_ALLOCS_PER_S or own["cuda_mallocs_per_s"] >= CUDA_MALLOCS_PER_S
    faults = max(own["minor_faults_per_s"], own["workers_minor_faults_per_s_max"]) >= PAGE_FAULTS_PER_S
    starved = own["workers_cpu_wait_share_max"] >= STARVED_SHARE
    waited = own["main_cpu_wait_share"] is None or own["main_cpu_wait_share"] >= CPU_WAIT_SHARE
    absent = {"cpu-throttled", "cpu-contention", "gpu-shared", "network-wait", "slow-consumer", "spawning-processes",
              "stopped-by-signal", "timed-sleep", "pageable-copies", "gpu-slower"}
    absent |= (set() if churn else CHURN) | (set() if faults else {"page-faults"})
    absent |= (set() if starved else {"own-workers-cpu"}) | (set() if waited else {"own-threads-cpu"})
    loader_causes = INPUT | {"io-wait", "own-workers-cpu"}
    if own["wait_share"] < 0.1:
        absent |= loader_causes
    assert not any(c.root_cause in absent for c in run), (_said(run), own)
    assert all(k.pid in workers | {pid} for c in run for k in _people(c)), [(c.summary, c.culprits) for c in run]
    loader = [c for c in run if c.root_cause in loader_causes]
    for c in loader:
        assert on_worker(c), (c.summary, c.culprits, sorted(workers))
    assert _seconds(loader) <= own["wait_s"] + 0.5, (_said(loader), own)
    if own["wait_share"] >= THIRD:
        lead = loader_causes | ({"page-faults"} if faults else set())
        assert run and run[0].root_cause in lead, (_said(run), own)
        assert on_worker(run[0]), (run[0].summary, run[0].culprits, sorted(workers))
        assert _seconds(loader) >= 0.5 * (own["wait_s"] - own["wait_cpu_s"]), (_said(loader), own)
        from_disk = (own["disk_read_fraction"] or 0.0) >= 0.5
        in_load = (own["load_share_per_worker"] or 0.0) > 0.5 and (own["load_blocked_fraction"] or 0.0) > 0.5
        if from_disk and in_load:
            said_io = any(c.root_cause == "io-wait" for c in loader)
            lead_says = bool(DISK_WORDS.search(f"{run[0].summary} {run[0].explanation}"))
            assert said_io or lead_says, (_said(run), run[0].explanation, own)
    host = [c for c in run if c.root_cause in HOST_SIDE]
    assert _seconds(host) <= wall - own["wait_s"] + 0.5, (_said(host), own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy < 0.4:
        assert not any(c.root_cause == "gpu-bound" for c in run), _said(run)
    elif busy >= 0.8:
        assert not (run and run[0].root_cause in loader_causes), _said(run)
        assert _seconds(host) <= (1 - busy) * wall + 0.5, (_said(host), own)
    shares = feeder_shares(report, truth)
    floor = own["wait_share"] - own["wait_cpu_share"] - SHARE_SLACK
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= floor, (shares, own)
    shares_agree(shares, own)


CHECKS_9 = {"natural_nvidia_smi_logger": check_nvidia_smi_logger,
            "natural_thread_prefetch_python": check_thread_prefetch_python,
            "natural_cold_npy_files": check_cold_npy_files}
