"""The group natural19 (bench/gpu/zoo/device_zoo.sh natural19): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_19 into its CHECKS; the ways of reading findings it
shares with groups 8 to 18 are natural_shares'."""

from __future__ import annotations

from pathlib import Path

from natural_shares import CHURN, CPU_WAIT_SHARE, CUDA_MALLOCS_PER_S, HOST_SIDE, INPUT, PAGE_FAULTS_PER_S
from natural_shares import SECOND, SHARE_SLACK, STARVED_SHARE, clocks_agree
from natural_shares import gpu_busy_rules as _gpu_busy_rules, in_run as _in_run, people as _people
from natural_shares import said as _said, seconds as _seconds
from natural_shares import capped as _capped, own_lead as _own_lead

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

# Causes that need a quota, a GPU sharer, a signal, a timer that fires in the loop, a GPU that slowed down or a child
# started in the run: none of these jobs has them (the collector runs on CPUs of its own; the children and workers
# start before the run; an affinity narrowed to one CPU is no quota).
NEVER = {"cpu-throttled", "gpu-shared", "stopped-by-signal", "gpu-slower", "spawning-processes", "timed-sleep"}
# The proxies' wait for the manager's replies (a child process, over a Unix socket), said as a wait on that process,
# on the socket, or on the consumer of what the job sends.
PROXY_WAIT = {"waiting-on-process", "network-wait", "slow-consumer"}
THREAD_WAIT = {"waiting-on-thread", "gil-or-lock"}  # a wait on a thread of the process, said as the thread or a lock
THIRD = 1 / 3


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


def _shown(report: Report, truth: dict) -> list[CausalChain]:
    """Every finding of the analysis (any severity) whose window overlaps the measured run by over half a second."""
    lo, hi = truth["baseline_ns"]
    return [c for c in report.chains if c.origin == "ingero-mcp"
            and (c.window is None or min(c.window.end_ns, hi) - max(c.window.start_ns, lo) > SECOND // 2)]


def check_save_on_cpu_activations(report: Report, truth: dict, store: Path) -> None:
    """8 Transformer MLP blocks (4096 tokens, bf16 autocast, fused AdamW, batches on the GPU, loss.item() each step)
    trained under torch.autograd.graph.save_on_cpu(pin_memory=False): every tensor autograd saves
    (offload_bytes_per_step, ~0.9 GB) is copied by the main thread in the forward into fresh pageable CPU memory
    (torch.empty + a synchronous copy_) and back to the GPU by the autograd thread in the backward (truth `autograd`),
    while the main thread waits in backward(); the script synchronises after the forward, the backward and the optimiser
    to time them. One process on CPUs 2-3, no workers, no children, no file, no sleep. No HIGH or MEDIUM finding (in the
    measured run) says a cause it did not have: NEVER, a network, a slow consumer, a wait on workers or a process, the
    workers' CPUs, IO (the host memory is allocated, not read from a disk); churn only at CUDA_MALLOCS_PER_S, page
    faults only at PAGE_FAULTS_PER_S (fresh pageable memory faults as the copies fill it), own-threads-cpu and
    cpu-contention only where the main thread or the autograd thread waited for a CPU CPU_WAIT_SHARE of the run or more;
    a wait on a thread or a lock only naming the autograd thread (the backward's copies are its work). No culprit
    outside the process. Pageable copies and page faults explain no more than the forward and backward (where the copies
    are), a wait on the autograd thread no more than the backward, host-bound no more than the main thread's CPU time,
    own-threads-cpu and cpu-contention no more than the two threads' wait for a CPU, excess-sync no more than the
    synchronised phases (forward, backward, optimiser, .item()), launch-bound no more than the main thread's CPU time;
    each plus half a second (over the findings' longest window). Where the offload cost a third of the run or more (the
    run's time beyond the same steps without save_on_cpu, `offload_overhead_share`), some finding (any severity) says
    the pageable copies (or the page faults, where their rate makes them true), and the report leads, said of the job's
    process, with what the offload is: pageable copies, page faults where true, host-bound where the main thread was on
    a CPU half the run or more (the staging copies and the faults are its CPU work), excess-sync where it slept a third
    of the run or more, a wait on the autograd thread where that thread was on a CPU a third of the run or more,
    own-threads-cpu where allowed; and those explain at least half the offload's cost. GPU busy (a step's kernels
    without save_on_cpu measured queued) under 40%: the lead is the host side or those, nothing gpu-bound; 80% or more:
    those explain no more than the GPU's idle time plus half a second. The main thread's time on a CPU and waiting for
    one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    atid = (truth.get("autograd") or {}).get("tid")
    top = _in_run(report, truth)
    churn, faults, main_waited = _rates(own)
    waited = main_waited or (own["autograd_cpu_wait_share"] or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _by_rates(churn, faults, waited)
    absent |= NEVER | INPUT - {"waiting-on-thread"} | {"network-wait", "slow-consumer", "own-workers-cpu", "io-wait"}
    if atid is None:
        absent |= THREAD_WAIT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]

    def on_autograd(c: CausalChain) -> bool:
        return any(atid in k.tids for k in _people(c))

    for c in top:
        if c.root_cause in THREAD_WAIT:
            assert on_autograd(c), (c.summary, c.culprits, atid)
    wall = own["wall_s"]
    _capped(top, {"pageable-copies", "page-faults"}, own["fwd_bwd_s"], own)
    _capped(top, THREAD_WAIT, own["bwd_s"], own)
    _capped(top, {"host-bound"}, own["main_run_s"] if own["main_run_s"] is not None else wall, own)
    _capped(top, {"launch-bound"}, own["main_run_s"] if own["main_run_s"] is not None else wall, own)
    _capped(top, {"own-threads-cpu", "cpu-contention"},
            (own["main_cpu_wait_s"] or 0.0) + (own["autograd_cpu_wait_s"] or 0.0), own)
    _capped(top, {"excess-sync"}, own["fwd_bwd_s"] + own["opt_s"] + own["item_s"], own)
    lead = {"pageable-copies"} | ({"page-faults"} if faults else set()) | ({"own-threads-cpu"} if waited else set())
    lead |= {"host-bound"} if (own["main_cpu_share"] or 0.0) >= 0.5 else set()
    lead |= {"excess-sync"} if own["main_asleep_share"] >= THIRD else set()
    lead |= THREAD_WAIT if atid is not None and (own["autograd_cpu_share"] or 0.0) >= THIRD else set()
    lead -= absent
    if own["offload_overhead_share"] >= THIRD:
        says = {"pageable-copies"} | ({"page-faults"} if faults else set())
        assert any(c.root_cause in says for c in _shown(report, truth)), (_said(report.chains), own)
        _own_lead(top, lead, pid, own)
        assert _seconds(top, lead) >= 0.5 * own["offload_overhead_s"], (_said(top), sorted(lead), own)
    both = HOST_SIDE | lead | allowed
    _gpu_busy_rules(top, own, both, both)
    clocks_agree(report, truth)


def check_manager_dict_counters(report: Report, truth: dict, store: Path) -> None:
    """The zoo's MLP (batch 4096 on the GPU, fused AdamW, loss.item() each step) keeping its run state in a
    multiprocessing.Manager() dict and list: each step reads the stop flag, increments two counters (a read and a write
    each) and appends the loss: 6 proxy round trips a step over a Unix socket to the manager's server process (truth
    `manager`: a child forked before CUDA, a thread per client), the GPU idle meanwhile (.item() ended the step); a
    monitor child (truth `monitor`: run_monitor) polls the step every 10 ms and every 50 steps reads the whole loss
    list. All on CPUs 2-3; no workers, no file, no lock of the job's own, no timed sleep in the main thread. No HIGH or
    MEDIUM finding (in the measured run) says a cause it did not have: NEVER, a wait on workers or a thread (the
    autograd thread's backward is the step's own work; the replies come from a process), a lock, IO, pageable copies
    (.item()'s 4 bytes cost their round trip); the workers' CPUs only where the manager or the monitor waited for a CPU
    STARVED_SHARE of the run, naming one of them; churn only at CUDA_MALLOCS_PER_S, page faults only at
    PAGE_FAULTS_PER_S; own-threads-cpu and cpu-contention only where the main thread waited for a CPU CPU_WAIT_SHARE of
    the run or more. Every culprit is the job's process, the manager or the monitor. A wait on a process or a slow
    consumer names the manager (its pid or tids). The proxies' wait (PROXY_WAIT) and the workers' CPUs explain no more
    than the proxies' time; excess-sync no more than .item() and the proxies (the GPU idles across both); launch-bound
    no more than queueing the steps; host-bound no more than the main thread's CPU time; own-threads-cpu and
    cpu-contention no more than its wait for a CPU; each plus half a second (over the findings' longest window). With
    the proxies' time off the main thread's CPU a tenth of the run or more, a finding (any severity) of PROXY_WAIT on
    the manager (or the socket) explains at least half of it. With the proxies a third of the run or more, the report
    leads with them, said of the job's process or the manager: a PROXY_WAIT where their time off a CPU is at least their
    CPU time less SHARE_SLACK, host-bound where their CPU time is at least their time off it less SHARE_SLACK,
    own-threads-cpu or cpu-contention where the main thread waited for a CPU a tenth of the run or more. GPU busy (a
    step's kernels measured queued) under 40%: the lead is the host side, the proxies or what the rates allow, nothing
    gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second. The main thread's sleep
    outside CUDA calls and wait for a CPU are at least the proxies' time off its CPU less SHARE_SLACK; its time on a CPU
    and waiting for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    mgr, mon = truth["manager"], truth["monitor"]
    mpid, mtids = mgr["pid"], set(mgr["tids"])
    opid, otids = mon["pid"], set(mon["tids"])
    top = _in_run(report, truth)
    churn, faults, waited = _rates(own)
    wall = own["wall_s"]
    starved = max(own["manager_cpu_wait_s"] or 0.0, own["monitor_cpu_wait_s"] or 0.0) >= STARVED_SHARE * wall

    def on_manager(k: Culprit) -> bool:
        return k.pid == mpid or bool(mtids & set(k.tids))

    def on_child(k: Culprit) -> bool:
        return on_manager(k) or k.pid == opid or bool(otids & set(k.tids))

    absent, allowed = _by_rates(churn, faults, waited)
    absent |= NEVER | (INPUT - {"waiting-on-process"}) | {"gil-or-lock", "io-wait", "pageable-copies"}
    absent |= set() if starved else {"own-workers-cpu"}
    allowed |= {"own-workers-cpu"} if starved else set()
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or on_child(k) for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in PROXY_WAIT - {"network-wait"}:
            assert any(on_manager(k) for k in _people(c)), (c.summary, c.culprits, mpid)
        if c.root_cause == "own-workers-cpu":
            assert any(on_child(k) for k in _people(c)), (c.summary, c.culprits, mpid, opid)
    _capped(top, PROXY_WAIT | {"own-workers-cpu"}, own["proxy_s"], own)
    _capped(top, {"excess-sync"}, own["item_s"] + own["proxy_s"], own)
    _capped(top, {"launch-bound"}, own["issue_s"], own)
    _capped(top, {"host-bound"}, own["main_run_s"] if own["main_run_s"] is not None else wall, own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    if own["proxy_off_cpu_share"] >= 0.1:
        shown = [c for c in _shown(report, truth) if c.root_cause in PROXY_WAIT
                 and (c.root_cause == "network-wait" or any(on_manager(k) for k in _people(c)))]
        assert _seconds(shown) >= 0.5 * own["proxy_off_cpu_s"], (_said(shown), own)
    if own["proxy_share"] >= THIRD:
        off, cpu = own["proxy_off_cpu_share"], own["proxy_cpu_share"]
        lead = (PROXY_WAIT if off >= cpu - SHARE_SLACK else set()) | ({"host-bound"} if cpu >= off - SHARE_SLACK
                                                                        else set())
        if (own["main_cpu_wait_share"] or 0.0) >= 0.1:
            lead |= {"own-threads-cpu", "cpu-contention"}
        assert top and top[0].root_cause in lead - absent, (_said(top), sorted(lead), own)
        assert pid in top[0].pids or any(k.pid == pid or on_manager(k) for k in _people(top[0])), \
            (top[0].summary, top[0].pids, top[0].culprits)
    _gpu_busy_rules(top, own, HOST_SIDE | PROXY_WAIT | allowed, HOST_SIDE | PROXY_WAIT | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= own["proxy_off_cpu_share"] - SHARE_SLACK, (shares, own)


def check_inherited_one_cpu(report: Report, truth: dict, store: Path) -> None:
    """A small conv net (bf16 autocast, SGD, loss.item() each step) fed uint8 crops by DataLoader(num_workers=3,
    persistent_workers=True, no pin_memory) whose workers do numpy augmentations (truth `workers`), the whole job
    narrowed at its start to ONE CPU (the launcher's mistake it stands in for: `cpus_in_force`, every worker's affinity
    as its worker_init_fn saw it): the main thread and the three workers share one CPU. No children but the workers
    (started before the run), no IO, no lock, no sleep of its own. No HIGH or MEDIUM finding (in the measured run) says
    a cause it did not have: NEVER (a one-CPU affinity is no CFS quota: not cpu-throttled), a network, a slow consumer,
    IO, a lock, a wait on a thread (next() waits on the workers' pipe); churn only at CUDA_MALLOCS_PER_S, page faults
    only at PAGE_FAULTS_PER_S (the main process's, or a worker's); own-threads-cpu and cpu-contention only where the
    main thread waited for a CPU CPU_WAIT_SHARE of the run or more; the workers' CPUs only where that is so or a worker
    waited for a CPU STARVED_SHARE of the run. Every culprit is the job's process or its workers (their pids,
    pt_data_worker, or a child process); an input wait (workers, or a process) and the workers' CPUs name a worker. The
    input wait, the workers' CPUs and cpu-contention explain no more than the main thread's time in next() plus its wait
    for a CPU; own-threads-cpu no more than its wait for a CPU; pageable copies no more than the copies; host-bound no
    more than its CPU time; launch-bound and excess-sync no more than the step and the copy; each plus half a second
    (over the findings' longest window). With the main thread in next() a third of the run or more, the report leads
    with the loader (an input wait or the workers' CPUs naming a worker, cpu-contention or own-threads-cpu or page
    faults where allowed) and those explain at least half its time in next() off its CPU. With the job on one CPU, in
    next() a third of the run or more and the workers waiting for the CPU STARVED_SHARE of the run on average, some
    finding (any severity) says the workers' CPU shortage (own-workers-cpu, or cpu-contention naming a worker). GPU busy
    (a step's kernels measured queued) under 40%: the lead is the host side or the loader, nothing gpu-bound; 80% or
    more: those explain no more than the GPU's idle time plus half a second. The main thread's sleep outside CUDA calls
    and wait for a CPU are at least its time in next() off its CPU less SHARE_SLACK; its time on a CPU and waiting for
    one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    workers = {w["pid"] for w in truth["workers"]}
    top = _in_run(report, truth)
    wall = own["wall_s"]
    churn, _, waited = _rates(own)
    faults = max(own["minor_faults_per_s"], own["workers_minor_faults_per_s_max"] or 0.0) >= PAGE_FAULTS_PER_S
    starved = (own["workers_cpu_wait_share_max"] or 0.0) >= STARVED_SHARE
    absent, allowed = _by_rates(churn, faults, waited)
    absent |= NEVER | {"network-wait", "slow-consumer", "io-wait", "gil-or-lock", "waiting-on-thread"}
    absent |= set() if starved or waited else {"own-workers-cpu"}
    allowed |= {"own-workers-cpu"} if starved or waited else set()

    def is_worker(k: Culprit) -> bool:
        return k.pid != pid and (k.pid in workers or k.comm == "pt_data_worker" or k.relation == "child process")

    def on_worker(c: CausalChain) -> bool:
        return any(is_worker(k) for k in _people(c))

    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or is_worker(k) for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    loader = INPUT - {"waiting-on-thread"} | {"own-workers-cpu"}
    for c in top:
        if c.root_cause in loader:
            assert on_worker(c), (c.summary, c.culprits, sorted(workers))
    main_wait = own["main_cpu_wait_s"] or 0.0
    _capped(top, loader | {"cpu-contention"}, own["next_s"] + main_wait, own)
    _capped(top, {"own-threads-cpu"}, main_wait, own)
    _capped(top, {"pageable-copies"}, own["copy_s"], own)
    _capped(top, {"host-bound"}, own["main_run_s"] if own["main_run_s"] is not None else wall, own)
    _capped(top, {"launch-bound", "excess-sync"}, own["step_s"] + own["copy_s"], own)
    lead = (loader | allowed | ({"cpu-contention"} if waited else set())) - absent
    if own["next_share"] >= THIRD:
        assert top and top[0].root_cause in lead, (_said(top), sorted(lead), own)
        if top[0].root_cause in loader:
            assert on_worker(top[0]), (top[0].summary, top[0].culprits, sorted(workers))
        else:
            assert pid in top[0].pids or any(k.pid == pid or is_worker(k) for k in _people(top[0])), \
                (top[0].summary, top[0].pids, top[0].culprits)
        assert _seconds(top, lead) >= 0.5 * own["next_off_cpu_s"], (_said(top), sorted(lead), own)
        if own["one_cpu"] and (own["workers_cpu_wait_share_mean"] or 0.0) >= STARVED_SHARE:
            short = [c for c in _shown(report, truth) if on_worker(c)
                     and c.root_cause in {"own-workers-cpu", "cpu-contention"}]
            assert short, (_said(report.chains), own)
    both = HOST_SIDE | lead | {"pageable-copies"}
    _gpu_busy_rules(top, own, both, both)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= own["next_off_cpu_share"] - SHARE_SLACK, (shares, own)


CHECKS_19 = {"natural_save_on_cpu_activations": check_save_on_cpu_activations,
             "natural_manager_dict_counters": check_manager_dict_counters,
             "natural_inherited_one_cpu": check_inherited_one_cpu}
