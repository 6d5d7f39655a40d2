"""The group natural27 (bench/gpu/zoo/device_zoo.sh natural27): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, by a helper that read no analysis code and no recorded report, from
what each script measures of itself (its truth's `self`) and what it cannot have had. One job's main thread works
inside next() while its DataLoader workers idle (a P x K batch sampler that scans the label list in Python: PyTorch
runs the sampler on the main thread); one's main thread waits in next() on workers that list the dataset's folder for
every sample (sorted(glob.glob(...)) in Dataset.__getitem__); the third is a GPU-bound control whose retrieval
evaluations run in child processes started with subprocess.Popen and never waited for, the decoys.
tests/zoo/test_zoo_natural.py merges CHECKS_27 into its CHECKS; the ways of reading findings it shares with earlier
groups are natural_shares', natural_checks_13's, natural_checks_16's, natural_checks_22's, natural_checks_23's,
natural_checks_25's and natural_checks_26's."""

from __future__ import annotations

import re
from pathlib import Path

from natural_checks_13 import DISK_SHARE
from natural_checks_16 import IO_OFF_CPU_S
from natural_checks_22 import GPU_BOUND, NEVER, THIRD, THREAD_WAIT, WAITED_SHARE
from natural_checks_22 import _ours, _shown, _waited
from natural_checks_23 import COPIES, HOST_WORK, OWN_WORK, _autograd, _rates
from natural_checks_25 import DECOY_BLAME, _cpu_waits
from natural_checks_26 import STARTED, _words
from natural_shares import CPU_WAIT_SHARE, HOST_SIDE, INPUT, SHARE_SLACK, STARVED_SHARE, clocks_agree
from natural_shares import capped as _capped, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import own_lead as _own_lead, people as _people, said as _said, seconds as _seconds

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

HALF = 0.5  # a cost this share of the run or more: the finding that says it is HIGH
# The sampler, said in words or in the code behind a finding: its class, its generator function, the comprehension
# that scans the labels, the label list, the batch sampler (a whole word: the script's file name, which holds
# "_sampler_", says nothing of where the time went).
SAMPLER_WORDS = re.compile(r"PKSampler|__iter__|listcomp|\bsampler\b|batch[_ ]sampler|label list|labels list|"
                           r"enumerate\(self\.labels\)", re.IGNORECASE)
# A fix for the main thread's own Python work: vectorise it, compute it once, cache it, move it off the main thread
# (or out of the sampler, into the workers' side), not a fix for the GPU's kernels alone.
HOST_FIX = re.compile(r"vectori[sz]|precomput|\bcach|\bonce\b|numpy|main thread|sampler|worker|\bindex", re.IGNORECASE)
# The folder listed per sample, said in words or in the code behind a finding: glob (a whole word: the script's file
# name holds "_glob_"), fnmatch, the directory scan, the Dataset's class or __getitem__.
GLOB_WORDS = re.compile(r"\bglob\b|fnmatch|scandir|listdir|getdents|NpyFolder|__getitem__", re.IGNORECASE)
# A fix on the loader's side: the workers, the dataset, its __getitem__, its file list.
LOADER_FIX = re.compile(r"worker|dataset|__getitem__|\bglob\b|file list|list (the )?files|listing|DataLoader",
                        re.IGNORECASE)


def _high_if(c: CausalChain, share: float) -> None:
    """A finding that explains a cost of HALF the run or more says it with confidence (HIGH)."""
    if share >= HALF:
        assert c.severity == "HIGH", (c.severity, c.summary, share)


def check_pk_sampler_label_scan(report: Report, truth: dict, store: Path) -> None:
    """A person re-identification ResNet (fp32 without TF32, 128 crops of 3x128x64 a step, batch-hard triplet loss and
    cross-entropy, Adam, loss.item() each step) fed by DataLoader(num_workers=4, persistent_workers=True) through a P x
    K batch sampler (truth `sampler`: PKSampler.__iter__) that finds each of the 16 identities' records by a list
    comprehension over the 38,400-entry Python label list, every batch: PyTorch runs the sampler in the main process, on
    the main thread, inside next(), so the main thread is on its CPU in next() while the four workers (truth `workers`,
    started before the run: a crop and a flip a sample) wait for indices. The main process and its workers on CPUs 2-5;
    no threads of the job's own, no children but the workers, no IO, no lock, no sleep; every batch has the same shape.
    No HIGH or MEDIUM finding (in the measured run) says a cause the job did not have: NEVER, STARTED, IO; the workers'
    CPUs (own-workers-cpu) only where a worker waited for a CPU STARVED_SHARE of the run; a wait on the workers or a
    process only where the main thread spent WAITED_SHARE of the run or more in next() off its CPU (`wait_off_cpu_s`),
    naming a worker; a wait on a thread or a lock only naming PyTorch's autograd thread (the backward), or a worker
    where a wait on them is allowed; churn, faults and own-threads-cpu or cpu-contention only at the rates
    (natural_checks_23's _rates: the main or the autograd thread waiting for a CPU CPU_WAIT_SHARE of the run or more).
    Every culprit is the job's process, or a worker in a wait allowed on them. Those naming the workers explain no more
    than the main thread's time in next() off its CPU; a wait on the autograd thread no more than its time in
    loss.backward(); pageable copies and excess-sync no more than the batch's copy and .item(); host-bound and
    launch-bound no more than the main thread's time on a CPU and in loss.backward(); own-threads-cpu and cpu-contention
    no more than the two threads' wait for a CPU; each plus half a second (over the findings' longest window). With the
    scans' cost (`sampler_overhead_s`: the run's time beyond its steps at the rate measured with the index lists built
    once) a third of the run or more, the report leads, said of the job's process, with the main thread's own work
    (host-bound, or what the rates make true; not a wait on the workers, which idle), HIGH where that cost is half the
    run or more, nothing gpu-bound, explaining at least half that cost; and some host-bound finding of the process (any
    severity, in the run) says where, in its words or in the code behind it (SAMPLER_WORDS: the sampler, its __iter__,
    the scan of the label list), with a fix for the host's own work (HOST_FIX: vectorise, precompute, cache, once, off
    the main thread, the sampler or the workers' side): a report that says "waiting on the workers", or "PyTorch's data
    loading" with no word of the sampler, sends the reader to the workers, which have nothing to do. GPU busy (a step's
    kernels measured queued) under 40%: the lead is that own work (or the wait, where allowed), nothing gpu-bound; 80%
    or more: those explain no more than the GPU's idle time plus half a second. The main thread's time running outside
    CUDA calls is at least the sampler's CPU share (`sampler_cpu_share`) less SHARE_SLACK; its time on a CPU and waiting
    for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    wpids = {w["pid"] for w in truth["workers"]}
    wtids = {t for w in truth["workers"] for t in w["tids"]}
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = _waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _rates(own, waited)
    starved = (own["workers_cpu_wait_max_share"] or 0.0) >= STARVED_SHARE
    wait_off = own["wait_off_cpu_s"]
    loader_waited = wait_off >= WAITED_SHARE * wall
    absent |= NEVER | STARTED | {"io-wait"}
    absent |= set() if starved else {"own-workers-cpu"}
    absent |= set() if loader_waited else INPUT - THREAD_WAIT
    if atid is None:
        absent |= THREAD_WAIT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)

    def is_worker(k: Culprit) -> bool:
        return k.pid in wpids or bool(wtids & set(k.tids)) or (k.comm or "").startswith("pt_data_worker")

    def on_workers(c: CausalChain) -> bool:
        return any(is_worker(k) for k in _people(c))

    workers_allowed = loader_waited or starved
    assert all(k.pid == pid or (workers_allowed and is_worker(k)) for c in top for k in _people(c)), \
        [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in THREAD_WAIT:
            assert on_autograd(c) or (workers_allowed and on_workers(c)), (c.summary, c.culprits, atid)
        if c.root_cause in (INPUT - THREAD_WAIT) | {"own-workers-cpu"}:
            assert on_workers(c), (c.summary, c.culprits, sorted(wpids))
    blamed = [c for c in top if on_workers(c)]
    _capped(blamed, {c.root_cause for c in blamed}, wait_off, own)
    rest = [c for c in top if not on_workers(c)]
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(rest, THREAD_WAIT, own["backward_s"], own)
    _capped(top, COPIES, own["h2d_s"] + own["item_s"], own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s"),
            own)
    lead = OWN_WORK | (allowed - absent)
    overhead = own["sampler_overhead_s"]
    assert overhead is not None, "the script did not measure the loop with the index lists built once"
    if overhead >= THIRD * wall:
        _own_lead(top, lead, pid, own)
        _high_if(top[0], overhead / wall)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds(top, lead) >= 0.5 * overhead, (_said(top), sorted(lead), own)
        said_where = [c for c in _shown(report, truth) if c.root_cause in OWN_WORK and _ours(c, pid)
                      and SAMPLER_WORDS.search(_words(c))]
        assert said_where, (_said(report.chains), own)
        assert any(HOST_FIX.search(" ".join(c.recommendations)) for c in said_where), \
            [(c.summary, c.recommendations) for c in said_where]
    wait_lead = (INPUT | {"own-workers-cpu"}) - absent
    _gpu_busy_rules(top, own, lead | HOST_SIDE | wait_lead, HOST_SIDE | lead | wait_lead)
    shares = clocks_agree(report, truth)
    assert shares["run_outside_ns"] >= own["sampler_cpu_share"] - SHARE_SLACK, (shares, own)


def check_glob_in_getitem(report: Report, truth: dict, store: Path) -> None:
    """A ResNet-18-style classifier (fp32 without TF32, 64 crops of 3x64x64 a step, SGD with Nesterov, loss.item() each
    step) fed by DataLoader(num_workers=4, persistent_workers=True) whose Dataset (truth `dataset`: NpyFolder) lists its
    folder of 1,500 .npy files with sorted(glob.glob(...)) in __getitem__ to load one of them: the workers (truth
    `workers`, forked before the measured run, each with a CPU to itself) are on their CPUs listing the folder (scandir,
    fnmatch, path joins, a sort), the main thread waits in next() and the GPU idles. The files are in the page cache;
    the main process and its workers on CPUs 2-7; no threads of the job's own, no children but the workers, no lock, no
    sleep. No HIGH or MEDIUM finding (in the measured run) says a cause the job did not have: NEVER, STARTED; IO only
    where the workers read DISK_SHARE of their bytes from storage (a folder listed in memory is not IO); the workers'
    CPUs (own-workers-cpu) only where a worker waited for a CPU STARVED_SHARE of the run; a lock only naming PyTorch's
    autograd thread (the workers share no lock: nothing between them to take turns at), a wait on a thread only naming
    it or a worker's thread (the queue's feeder that hands a batch over); churn, faults and own-threads-cpu or
    cpu-contention only at the rates (the main or the autograd thread waiting for a CPU CPU_WAIT_SHARE of the run or
    more); with the main thread's time in next() off its CPU under a tenth of the run, no input wait. Every culprit is
    the job's process or one of its workers. A wait on the workers or a process or own-workers-cpu names a worker (its
    pid, a tid of it, or pt_data_worker). Those naming the workers explain no more than the main thread's time in
    next(); a wait on the autograd thread no more than its time in loss.backward();
    pageable copies and excess-sync no more than the batch's copy and .item(); host-bound and launch-bound no more than
    its time on a CPU and in loss.backward(); own-threads-cpu and cpu-contention no more than the two threads' wait for
    a CPU; each plus half a second (over the findings' longest window). With the listing's cost (`glob_overhead_s`: the
    run's time beyond its steps at the rate measured with the file list made once) and the main thread's time in next()
    both a third of the run or more, the report leads, said of the job's process, with the wait on the loader (an input
    wait, or own-workers-cpu where true) naming a worker, HIGH where the main thread spent half the run or more in
    next() off its CPU, with a fix on the loader's side (LOADER_FIX), nothing gpu-bound, and the findings naming the
    workers explain at least half the main thread's time in next() off its CPU; and with the workers in the listing half
    their time or more, some finding naming a worker (any severity, in the run) says where, in its words or in the code
    behind it (GLOB_WORDS: glob, fnmatch, the directory scan, NpyFolder or its __getitem__). GPU busy (a step's kernels
    measured queued) under 40%: the lead is that wait or the host side, nothing gpu-bound; 80% or more: those explain no
    more than the GPU's idle time plus half a second. The main thread's sleep outside CUDA calls and wait for a CPU are
    at least its time in next() off its CPU less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks'."""
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
    absent |= NEVER | STARTED
    absent |= (set() if starved else {"own-workers-cpu"}) | (set() if disk else {"io-wait"})
    allowed |= ({"own-workers-cpu"} if starved else set()) | ({"io-wait"} if disk else set())
    wait_off = own["wait_off_cpu_s"]
    if wait_off < WAITED_SHARE * wall:
        absent |= INPUT - THREAD_WAIT
    if atid is None:
        absent |= THREAD_WAIT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or k.pid in wpids for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]

    def is_worker(k: Culprit) -> bool:
        return k.pid in wpids or bool(wtids & set(k.tids)) or (k.comm or "").startswith("pt_data_worker")

    def on_workers(c: CausalChain) -> bool:
        return any(is_worker(k) for k in _people(c))

    for c in top:
        if c.root_cause == "gil-or-lock":
            assert on_autograd(c), (c.summary, c.culprits, atid)
        elif c.root_cause == "waiting-on-thread":  # the backward, or a worker's thread (its queue's feeder)
            assert on_autograd(c) or on_workers(c), (c.summary, c.culprits, atid, sorted(wpids))
        elif c.root_cause in INPUT | {"own-workers-cpu"}:
            assert on_workers(c), (c.summary, c.culprits, sorted(wpids))
    on_w = [c for c in top if on_workers(c)]
    _capped(on_w, {c.root_cause for c in on_w}, own["wait_s"], own)
    rest = [c for c in top if not on_workers(c)]
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(rest, THREAD_WAIT, own["backward_s"], own)
    _capped(top, COPIES, own["h2d_s"] + own["item_s"], own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(rest, {"own-threads-cpu", "cpu-contention"}, _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s"),
            own)
    lead = ((INPUT - THREAD_WAIT) | {"waiting-on-thread"} | ({"own-workers-cpu"} if starved else set())) - absent
    overhead = own["glob_overhead_s"]
    assert overhead is not None, "the script did not measure the loop with the file list made once"
    if overhead >= THIRD * wall and own["wait_share"] >= THIRD:
        _own_lead(top, lead, pid, own)
        c0 = top[0]
        assert on_workers(c0), (c0.summary, c0.culprits, sorted(wpids))
        _high_if(c0, wait_off / wall)
        assert LOADER_FIX.search(" ".join(c0.recommendations)), (c0.summary, c0.recommendations)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds([c for c in on_w if c.root_cause in lead]) >= 0.5 * wait_off, (_said(on_w), own)
        if own["glob_share_of_workers"] >= HALF:
            seen = [c for c in _shown(report, truth) if on_workers(c) and GLOB_WORDS.search(_words(c))]
            assert seen, (_said(report.chains), own)
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= wait_off / wall - SHARE_SLACK, (shares, own)


def check_healthy_async_eval_popen(report: Report, truth: dict, store: Path) -> None:
    """A control: a CLIP-style dual encoder (two MLP towers 4096 wide, 8,192 pairs a step held on the GPU, fp32 without
    TF32, fused AdamW, loss.item() each step its one wait for the GPU: ~100 ms of GPU work a step) that every ~3 s
    embeds a held-out set, copies the embeddings to the host (16 MB), np.save()s them and starts a numpy retrieval
    evaluation in a child Python with subprocess.Popen, not waiting for it (poll() each step; a due evaluation skipped
    while one runs): truth `evals` and `decoys` the children (pids, spans from their start to the poll that found them
    exited), `children` their comm. The children, busy on a CPU of the job a second or more each, processes started in
    the run again and again, and the files written are the decoys; the loop never waits for them. One process on CPUs
    2-5 (the children inherit them); no threads of the job's own, no workers, no lock, no sleep. No HIGH or MEDIUM
    finding (in the measured run) says a cause it did not have: NEVER, a timed sleep, a slower GPU, a cold start,
    pageable copies (16 MB every few seconds), IO (only where the run had major page faults or np.save spent
    IO_OFF_CPU_S in all); a spawn, a wait on a process or workers, their CPUs, a slow consumer only where the
    evaluations cost the steps a tenth of the run or more (`eval_overhead_s`, against the same loop without them
    measured before the run, or the main thread's part in them, `eval_main_s`), naming a decoy; a wait on a thread or a
    lock only naming PyTorch's autograd thread, or a decoy where they cost the steps; churn, faults and own-threads-cpu
    or cpu-contention only at the rates (the main or the autograd thread waiting for a CPU CPU_WAIT_SHARE of the run or
    more). No culprit outside the job's process but the children, and those only where the evaluations cost a tenth
    of the run. The job measured itself GPU-bound (busy GPU_BOUND or more: a step's kernels and an evaluation's
    embedding, measured queued) and the evaluations cost under a tenth: no HIGH or MEDIUM finding but gpu-bound and the
    churn or page faults the rates make true, none naming a decoy (a child's pid). Any finding naming a decoy explains
    no more than the evaluations' cost (the larger of the two measures) and the main and autograd threads' wait for a
    CPU; a wait on the autograd thread no more than the main thread's time in loss.backward(); host-bound and
    launch-bound no more than its time on a CPU and in loss.backward(); excess-sync no more than its .item() time;
    own-threads-cpu and cpu-contention naming no decoy no more than the two threads' wait for a CPU; each plus half a
    second. GPU busy under 40% (the premise wrong): the lead is the host side or those allowed, nothing gpu-bound; 80%
    or more: those explain no more than the GPU's idle time plus half a second. The main thread's time inside CUDA
    calls (asleep or spinning in .item()'s wait for the GPU) is at least half its .item() share less SHARE_SLACK; its
    time on a CPU and waiting for one, its own clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    cpids = {e["pid"] for e in truth["evals"]} | {d["pid"] for d in truth.get("decoys") or []}
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = _waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _rates(own, waited)
    overhead = own["eval_overhead_s"]
    assert overhead is not None, "the script did not measure the loop without the evaluations"
    cost = max(overhead, own["eval_main_s"])
    kept = cost < WAITED_SHARE * wall
    absent |= NEVER | {"timed-sleep", "gpu-slower", "cold-start", "pageable-copies"}
    absent |= set() if (own["major_faults"] or own["save_s"] >= IO_OFF_CPU_S) else {"io-wait"}
    if kept:
        absent |= (INPUT - THREAD_WAIT) | {"own-workers-cpu", "slow-consumer", "spawning-processes"}
    if atid is None and kept:
        absent |= THREAD_WAIT

    def is_decoy(k: Culprit) -> bool:
        return k.pid in cpids

    def on_decoy(c: CausalChain) -> bool:
        return any(is_decoy(k) for k in _people(c))

    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or (not kept and is_decoy(k)) for c in top for k in _people(c)), \
        [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in DECOY_BLAME:
            ok = on_decoy(c) or (c.root_cause in THREAD_WAIT and on_autograd(c))
            assert ok and (not kept or not on_decoy(c)), (c.summary, c.culprits, sorted(cpids))
    blamed = [c for c in top if on_decoy(c)]
    _capped(blamed, {c.root_cause for c in blamed}, cost + _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s"),
            own)
    rest = [c for c in top if not on_decoy(c)]
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(rest, THREAD_WAIT, own["backward_s"], own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(top, {"excess-sync"}, own["item_s"], own)
    _capped(rest, {"own-threads-cpu", "cpu-contention"}, _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s"),
            own)
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


CHECKS_27 = {"natural_pk_sampler_label_scan": check_pk_sampler_label_scan,
             "natural_glob_in_getitem": check_glob_in_getitem,
             "natural_healthy_async_eval_popen": check_healthy_async_eval_popen}
