"""The group natural26 (bench/gpu/zoo/device_zoo.sh natural26): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, by a helper that read no analysis code and no recorded report, from
what each script measures of itself (its truth's `self`) and what it cannot have had. One job's main thread waits on
DataLoader workers that themselves wait on a third process (the server of a multiprocessing.Manager() dict they share
as a cache); one's main thread works (torch.tensor() over a list of numpy arrays in its collate function, inside
PyTorch's C++); the third is a GPU-bound control whose busy augmentation workers and pin-memory thread are the decoys.
tests/zoo/test_zoo_natural.py merges CHECKS_26 into its CHECKS; the ways of reading findings it shares with earlier
groups are natural_shares', natural_checks_22's, natural_checks_23's and natural_checks_25's."""

from __future__ import annotations

import re
from pathlib import Path

from natural_checks_22 import GPU_BOUND, NEVER, THIRD, THREAD_WAIT, WAITED_SHARE
from natural_checks_22 import _ours, _shown, _waited
from natural_checks_23 import COPIES, HOST_WORK, OWN_WORK, _autograd, _cpu_cost, _rates
from natural_checks_25 import DECOY_BLAME, _cpu_waits
from natural_shares import CPU_WAIT_SHARE, HOST_SIDE, INPUT, SHARE_SLACK, STARVED_SHARE, clocks_agree
from natural_shares import capped as _capped, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import own_lead as _own_lead, people as _people, said as _said, seconds as _seconds

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

# What none of the three had: a timer in the loop, GPU work per step that changed (fixed shapes), processes started
# in the run (the workers and the manager were started before it), first launches (warmed up before the run).
STARTED = {"timed-sleep", "gpu-slower", "spawning-processes", "cold-start"}
# The Manager's server, said in words (or in the code behind a finding: the workers' frames are in
# multiprocessing/managers.py): its name, its proxies.
MANAGER_WORDS = re.compile(r"\bmanager\b|\bproxy\b|\bproxies\b|DictProxy|SyncManager|multiprocessing\.managers|"
                           r"managers\.py|Manager\(\)", re.IGNORECASE)
# A wait on the workers or on the manager behind them, said as a wait on them, a lock between them, their CPUs, or the
# local socket the proxies talk over (a wait on a server).
ON_LOADER = INPUT | {"gil-or-lock", "own-workers-cpu", "network-wait"}
# Where the conversion happens, said in words or in the code behind a finding: the collate function, the call that
# converts, the list of arrays, PyTorch's C++ that walks it, or the fix (stack first).
CONVERT_WORDS = re.compile(r"collate|torch\.tensor|tensor\(|ndarray|list of (numpy )?arrays|np\.stack|numpy\.stack|"
                           r"np\.array|from_numpy|tensor_new|recursive_store|internal_new_from_data", re.IGNORECASE)
KEPT_LOOSE = 0.2  # the loader's measured cost (against a rate from ~15 steps) under this share of the run: none


def _words(c: CausalChain) -> str:
    """A finding's words and the code behind it (its frames, as JSON), for a search of what it names."""
    frames = c.frames.model_dump_json() if c.frames is not None else ""
    return f"{c.summary} {c.explanation} {' '.join(c.recommendations)} {frames}"


def check_manager_dict_sample_cache(report: Report, truth: dict, store: Path) -> None:
    """A small ResNet (fp32 without TF32, 128 crops of 3x160x160 a step, SGD, loss.item() each step) fed by
    DataLoader(num_workers=4, persistent_workers=True) whose workers (truth `workers`: pt_data_worker pids, forked
    before the measured run) look every sample up in a decoded-image cache shared through a
    multiprocessing.Manager().dict(): `i in cache` and `cache[i]`, two round trips a sample to the manager's server
    process (truth `manager`: its pid and threads, started before CUDA and the run), which pickles and sends each ~110
    KB array, its connection threads taking turns at its GIL; every lookup hits (the first epoch filled it before the
    run). The workers wait on the manager, the main thread waits in next(). All on CPUs 2-5; no threads of the job's
    own, no children but the workers and the manager, no file IO, no sleep. No HIGH or MEDIUM finding (in the measured
    run) says a cause the job did not have: NEVER but a network wait (the proxies talk over a local socket to a server),
    STARTED, IO; the workers' CPUs (own-workers-cpu) only where a worker or the manager waited for a CPU STARVED_SHARE
    of the run; churn, faults and own-threads-cpu or cpu-contention only at the rates (natural_checks_23's _rates: the
    main, autograd or manager's threads waiting for a CPU CPU_WAIT_SHARE of the run or more); with the main thread's
    time in next() off its CPU under a tenth of the run, no input wait. Every culprit is the job's process, one of its
    workers or the manager. A wait on workers, a process or a thread, a lock, the workers' CPUs or the network names a
    worker (its pid, a tid of it, or pt_data_worker) or the manager (its pid or a tid of it), except a wait on a thread
    or a lock naming PyTorch's autograd thread (the backward). Those naming the workers or the manager explain no more
    than the main thread's time in next(); those on the autograd thread no more than its time in loss.backward();
    pageable copies and excess-sync no more than the batch's copy and .item(); host-bound and launch-bound no more than
    its time on a CPU and in loss.backward(); own-threads-cpu and cpu-contention naming neither no more than the main
    and autograd threads' wait for a CPU; each plus half a second (over the findings' longest window). With the
    manager's cost (`manager_overhead_s`: the run's time beyond its steps at the rate measured with the cache in shared
    memory) and the main thread's time in next() both a third of the run or more, the report leads, said of the job's
    process, with the wait on the loader (an input wait, a lock, a network wait, or own-workers-cpu where true) naming a
    worker or the manager, nothing gpu-bound, and the findings naming them explain at least half the main thread's time
    in next() off its CPU; and with the workers in the proxy calls half their time or more, some finding (any severity,
    in the run) says the manager: names its process, or, naming a worker, says it in words or in its code
    (MANAGER_WORDS): a report that says only that the workers do not keep up sends the reader to add workers, which
    would queue more clients at the one server. GPU busy (a step's kernels measured queued) under 40%: the lead is that
    wait or the host side, nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a
    second. The main thread's sleep outside CUDA calls and wait for a CPU are at least its time in next() off its CPU
    less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    wpids = {w["pid"] for w in truth["workers"]}
    wtids = {t for w in truth["workers"] for t in w["tids"]}
    mgr = truth["manager"]
    mpid, mtids = mgr["pid"], set(mgr["tids"]) | {mgr["pid"]}
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = (_waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
              or (own.get("manager_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE)
    absent, allowed = _rates(own, waited)
    starved = max(own["workers_cpu_wait_max_share"] or 0.0, own.get("manager_cpu_wait_share") or 0.0) >= STARVED_SHARE
    absent |= (NEVER - {"network-wait"}) | STARTED | {"io-wait"}
    absent |= set() if starved else {"own-workers-cpu"}
    allowed |= {"own-workers-cpu"} if starved else set()
    wait_off = own["wait_off_cpu_s"]
    if wait_off < WAITED_SHARE * wall:
        absent |= INPUT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid in {pid, mpid} | wpids for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]

    def is_worker(k: Culprit) -> bool:
        return k.pid in wpids or bool(wtids & set(k.tids)) or (k.comm or "").startswith("pt_data_worker")

    def is_manager(k: Culprit) -> bool:
        return k.pid == mpid or bool(mtids & set(k.tids))

    def on_workers(c: CausalChain) -> bool:
        return any(is_worker(k) for k in _people(c))

    def on_manager(c: CausalChain) -> bool:
        return any(is_manager(k) for k in _people(c))

    def on_loader(c: CausalChain) -> bool:
        return on_workers(c) or on_manager(c)

    for c in top:
        if c.root_cause in ON_LOADER:
            ok = on_loader(c) or (c.root_cause in THREAD_WAIT and on_autograd(c))
            assert ok, (c.summary, c.culprits, wpids, mpid)
    loaded = [c for c in top if on_loader(c)]
    _capped(loaded, {c.root_cause for c in loaded}, own["wait_s"], own)
    rest = [c for c in top if not on_loader(c)]
    _capped(rest, THREAD_WAIT, own["backward_s"], own)
    _capped(rest, COPIES, own["h2d_s"] + own["item_s"], own)
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(rest, HOST_WORK, main_run + own["backward_s"], own)
    _capped(rest, {"own-threads-cpu", "cpu-contention"}, _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s"),
            own)
    lead = (INPUT | {"gil-or-lock", "network-wait"} | ({"own-workers-cpu"} if starved else set())) - absent
    overhead = own["manager_overhead_s"]
    assert overhead is not None, "the script did not measure the loop with the cache in shared memory"
    if overhead >= THIRD * wall and own["wait_share"] >= THIRD:
        _own_lead(top, lead, pid, own)
        assert on_loader(top[0]), (top[0].summary, top[0].culprits, sorted(wpids), mpid)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds([c for c in loaded if c.root_cause in lead]) >= 0.5 * wait_off, (_said(loaded), own)
        if own["proxy_share_of_workers"] >= 0.5:
            seen = [c for c in _shown(report, truth)
                    if on_manager(c) or (on_workers(c) and MANAGER_WORDS.search(_words(c)))]
            assert seen, (_said(report.chains), own)
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= wait_off / wall - SHARE_SLACK, (shares, own)


def check_tensor_from_ndarray_list(report: Report, truth: dict, store: Path) -> None:
    """A classifier head (LayerNorm, 768-4096-4096-1000, fp32 without TF32, fused AdamW, loss.item() each step) trained
    on precomputed embeddings held in memory as one numpy array per record, fed by a DataLoader with num_workers=0 whose
    collate function builds each batch with torch.tensor() over the list of 256 arrays: PyTorch's C++ constructor walks
    them element by element (196,608 numpy scalars a batch) on the main thread, under the GIL; then a pageable 786 KB
    copy to the GPU. One process on CPUs 2-3, no threads of its own, no workers (the loader's work is the main
    thread's), no children, no IO, no lock, no sleep; every batch has the same shape. Read as natural_checks_23's
    _cpu_cost says: no HIGH or MEDIUM finding says a cause the job did not have (NEVER, STEADY: no worker to wait on,
    IO), churn, faults or a wait for a CPU only at the rates, a wait on a thread only naming the autograd thread,
    nothing blamed outside the process; the findings' seconds within the job's own clocks; with the cost the run's time
    beyond its steps at the rate measured with the arrays stacked by np.stack first (`convert_overhead_s`) a third of
    the run or more, the lead said of the process is the main thread's own work (host-bound, or what the rates make
    true), nothing gpu-bound, explaining at least half that cost; with the conversion (`convert_s`) a tenth of the run
    or more some finding says host-bound of the process; GPU busy under 40% the lead is that own work, 80% or more the
    host side no more than the GPU's idle time; the main thread's time running outside CUDA calls at least the
    conversion's CPU time (`convert_cpu_share`) less SHARE_SLACK. The copies and synchronising calls are the batch's
    copy and .item() (`h2d_s`, `item_s`). Besides: launch-bound explains no more than the main thread's time queueing
    the step and in loss.backward() (`step_s`, `backward_s`) plus half a second: the work is not issuing kernels. With
    the conversion's cost a third of the run or more, some finding (any severity, in the run) of the process that says
    host-bound says where, in its words or in the code behind it (CONVERT_WORDS: the collate function, the torch.tensor
    call, the list of arrays, PyTorch's C++ constructor, or the fix): a report that says only "PyTorch's own code", with
    the fix for many small kernels, sends the reader to the model, which is not where the time goes."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    overhead = own["convert_overhead_s"]
    _cpu_cost(report, truth, overhead, own["convert_s"], own["convert_cpu_share"], own["h2d_s"] + own["item_s"])
    top = _in_run(report, truth)
    _capped(top, {"launch-bound"}, own["step_s"] + own["backward_s"], own)
    if overhead >= THIRD * own["wall_s"]:
        seen = [c for c in _shown(report, truth) if c.root_cause in OWN_WORK and _ours(c, pid)
                and CONVERT_WORDS.search(_words(c))]
        assert seen, (_said(report.chains), own)


def check_healthy_simclr_busy_workers(report: Report, truth: dict, store: Path) -> None:
    """A control: two-view contrastive pretraining of a ViT (width 1280, 12 layers, 32 images and 64 views of 160 px a
    step, normalised on the GPU, fp32 without TF32, fused AdamW, loss.item() each step its one wait for the GPU: a few
    hundred ms of GPU work a step) fed by DataLoader(num_workers=5, pin_memory=True, persistent_workers=True) over an
    infinite random sampler, whose workers (truth `workers`) do SimCLR's augmentations in numpy (~10 ms an image: busy a
    good part of the run, `workers_busy_share`) and PyTorch's pin-memory thread (truth `pin_thread`) pins each batch;
    truth `decoys` lists them. The loader keeps batches ready: the main thread's next() returns at once. The main
    process and its workers on CPUs 2-9, no threads of the job's own, no children but the workers (started before the
    run), no IO, no lock, no sleep; .item()'s 4 bytes and the pinned batch are the copies. No HIGH or MEDIUM finding (in
    the measured run) says a cause it did not have: NEVER, STARTED, pageable copies (the batches are pinned), IO (only
    where the run had major page faults); a slow consumer or a spawn (the workers persist, the sampler never ends an
    epoch); a wait on the workers or a process or the workers' CPUs only where the loader cost the steps (the main
    thread in next() a tenth of the run or more, or the run's time beyond its steps at the rate of the same loop on one
    batch kept on the GPU, `loader_overhead_s`, KEPT_LOOSE of the run or more), naming a decoy; a wait on a thread or a
    lock naming PyTorch's autograd thread, or a decoy where the loader cost the steps; churn, faults and own-threads-cpu
    or cpu-contention only at the rates (the main, autograd or pin-memory thread waiting for a CPU CPU_WAIT_SHARE of the
    run or more). No culprit outside the job's process but the workers, and the workers only where the loader cost the
    steps. The job measured itself GPU-bound (busy GPU_BOUND or more) and the loader cost nothing: no HIGH or MEDIUM
    finding but gpu-bound and the churn or page faults the rates make true, none naming a decoy (a worker's pid or tids
    or pt_data_worker, the pin-memory thread's tid or pt_data_pin). Any finding naming a decoy explains no more than the
    main thread's time in next() and its and the autograd thread's wait for a CPU; a wait on the autograd thread no more
    than the main thread's time in loss.backward(); host-bound and launch-bound no more than its time on a CPU and in
    loss.backward(); excess-sync no more than its .item() time; own-threads-cpu and cpu-contention naming no decoy no
    more than the main and autograd threads' wait for a CPU; each plus half a second. GPU busy under 40% (the premise
    wrong): the lead is the host side or those allowed, nothing gpu-bound; 80% or more: those explain no more than the
    GPU's idle time plus half a second. The main thread's time inside CUDA calls (asleep or spinning in .item()'s wait,
    or in launches behind a full queue) is at least half its .item() share less SHARE_SLACK; its time on a CPU and
    waiting for one, its own clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    wpids = {w["pid"] for w in truth["workers"]}
    wtids = {t for w in truth["workers"] for t in w["tids"]}
    pin = truth.get("pin_thread") or {}
    ptid = pin.get("tid")
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = (_waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
              or (own.get("pin_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE)
    absent, allowed = _rates(own, waited)
    overhead = own["loader_overhead_s"]
    assert overhead is not None, "the script did not measure the loop without the loader"
    kept = own["wait_share"] < WAITED_SHARE and overhead < KEPT_LOOSE * wall
    absent |= NEVER | STARTED | {"pageable-copies"}
    absent |= set() if own["major_faults"] else {"io-wait"}
    if kept:
        absent |= (INPUT - THREAD_WAIT) | {"own-workers-cpu"}
    if atid is None and kept:
        absent |= THREAD_WAIT

    def is_decoy(k: Culprit) -> bool:
        comm = k.comm or ""
        return (k.pid in wpids or bool(wtids & set(k.tids)) or (ptid is not None and ptid in k.tids)
                or comm.startswith("pt_data_worker") or comm.startswith("pt_data_pin"))

    def on_decoy(c: CausalChain) -> bool:
        return any(is_decoy(k) for k in _people(c))

    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or (not kept and k.pid in wpids) for c in top for k in _people(c)), \
        [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in DECOY_BLAME:
            ok = on_decoy(c) or (c.root_cause in THREAD_WAIT and on_autograd(c))
            assert ok and (not kept or not on_decoy(c)), (c.summary, c.culprits, sorted(wpids), ptid)
    blamed = [c for c in top if on_decoy(c)]
    _capped(blamed, {c.root_cause for c in blamed},
            own["wait_s"] + _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s"), own)
    rest = [c for c in top if not on_decoy(c)]
    _capped(rest, THREAD_WAIT, own["backward_s"], own)
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
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


CHECKS_26 = {"natural_manager_dict_sample_cache": check_manager_dict_sample_cache,
             "natural_tensor_from_ndarray_list": check_tensor_from_ndarray_list,
             "natural_healthy_simclr_busy_workers": check_healthy_simclr_busy_workers}