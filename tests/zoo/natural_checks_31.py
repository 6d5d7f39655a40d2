"""The group natural31 (bench/gpu/zoo/device_zoo.sh natural31): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, by a helper that read no analysis code and no recorded report, from
what each script measures of itself (its truth's `self`) and what it cannot have had. Two jobs' main thread waits on
someone else: one on a lock of its own process that a metrics-exporter thread holds while it renders, serialises and
compresses the registry the lock guards (a lock convoy inside the process, about a third of the run); one in
multiprocessing.Pool.map(), every step, on three pool processes that augment the batch's images (pickled to them and
back) while the GPU idles (most of the run). The third is a GPU-bound control whose process scrubs its dataset's shards
in a thread of its own (storage reads and crc32 flat out, on the job's CPUs), the decoy. tests/zoo/test_zoo_natural.py
may merge CHECKS_31 into its CHECKS; the ways of reading findings it shares with earlier groups are natural_shares',
natural_checks_20's, natural_checks_22's, natural_checks_23's, natural_checks_25's, natural_checks_26's,
natural_checks_27's and natural_checks_30's."""

from __future__ import annotations

import re
from pathlib import Path

from natural_checks_20 import LOCK_WORDS
from natural_checks_22 import GPU_BOUND, NEVER, STEADY, THIRD, THREAD_WAIT, WAITED_SHARE
from natural_checks_22 import _shown, _waited
from natural_checks_23 import COPIES, HOST_WORK, _autograd, _rates
from natural_checks_25 import DECOY_BLAME, _cpu_waits
from natural_checks_26 import STARTED
from natural_checks_27 import LOADER_FIX, _high_if
from natural_checks_30 import _words_without
from natural_shares import CPU_WAIT_SHARE, HOST_SIDE, INPUT, SHARE_SLACK, STARVED_SHARE, clocks_agree
from natural_shares import capped as _capped, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import own_lead as _own_lead, people as _people, said as _said, seconds as _seconds

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

REGISTRY_SCRIPT = "natural_registry_lock_export"
# Where the loop's wait goes, said in words or in the code behind a finding naming the exporter: the lock (its words:
# lock, mutex, futex, the GIL; acquire), the registry and its methods, and what the exporter does while it holds it
# (rendering, json.dumps, gzip/zlib compression, a snapshot). The script's file name and the thread's name
# (metrics_export) are taken out of the text before the search: naming the thread says who, not where.
REGISTRY_WORDS = re.compile(rf"{LOCK_WORDS.pattern}|acquire|registry|MetricsRegistry|\brecord\b|_render|\brender|"
                            r"\bjson|dumps|\bgzip|\bzlib|deflate|compress|seriali[sz]|snapshot", re.IGNORECASE)
# A fix for a lock held over slow work: copy (snapshot) under it and do the rest outside it, hold it for less time
# (a shorter critical section, finer locks), or do the export less often, elsewhere or asynchronously.
LOCK_FIX = re.compile(r"\bcop(y|ies|ying)\b|snapshot|outside (of )?(the )?lock|release|hold(s|ing)? (the |a )?lock|"
                      r"shorter|narrow|critical section|lock-free|finer|per-(metric|series)|separate (lock|process)|"
                      r"another (thread|process)|less often|less frequent|interval|async|queue|double[- ]buffer",
                      re.IGNORECASE)
POOL_SCRIPT = "natural_pool_map_augment"
# Where the main thread's wait goes, said in words or in the code behind a finding naming the pool: multiprocessing and
# its Pool (map, mapstar, the pool's module, its worker and handler functions), pickling the tasks and results, the
# augmentation the pool processes run (the function, its crop, numpy). The script's file name (which holds "pool",
# "map" and "augment") is taken out of the text before the search.
POOL_WORDS = re.compile(r"multiprocessing|\bpool\b|Pool\.map|\bmap\(|mapstar|pool\.py|PoolWorker|_handle_(results|"
                        r"tasks)|\bpickl|\bunpickl|\baugment|random_resized_crop|\bnumpy\b", re.IGNORECASE)
# A fix on the input side: a DataLoader with workers, the pool's work overlapped with the GPU (asynchronous map, imap,
# prefetching batches ahead), less pickling (shared memory, indices instead of images), the augmentation on the GPU.
POOL_FIX = re.compile(rf"{LOADER_FIX.pattern}|imap|map_async|apply_async|async|prefetch|ahead|overlap|pipelin|"
                      r"shared memory|pickl|indices|on the GPU|\bGPU (augment|transform)", re.IGNORECASE)
# What the control's steps must not be charged to: its scrub thread, by a wait on it or a lock, its CPU (contention,
# own threads'), or its reads (IO).
VERIFY_BLAME = DECOY_BLAME | {"cpu-contention", "own-threads-cpu", "io-wait"}


def check_registry_lock_export(report: Report, truth: dict, store: Path) -> None:
    """A 1000-class MLP head (1024-4096-4096-1000, fp32 without TF32, batch 4096 drawn on the GPU, fused AdamW, the
    batch's per-source and per-class histograms made on the GPU and read back with one .cpu(), then loss.item()) whose
    every step records its metrics in a MetricsRegistry (truth `registry`) under the registry's one threading.Lock;
    a thread of the process (truth `exporter`: metrics_export) exports the registry every interval (set at start-up so
    that it holds the lock about 40% of the time) and holds the lock while it renders ~360,000 bucket counts into a
    dict, json.dumps() it, gzip-compresses it at level 9 and writes the file (page cache, no fsync): the main thread's
    record() sleeps on the lock for what is left of each export, after the step's read-back, so the GPU idles. One
    process on CPUs 2-3; no workers, no children, no IO to wait for, no sleep in the loop; every step has the same
    shapes. No HIGH or MEDIUM finding (in the measured run) says a cause the job did not have: NEVER, STEADY, IO;
    churn, faults and own-threads-cpu or cpu-contention only at the rates (natural_checks_23's _rates: the main,
    autograd or exporter thread waiting for a CPU CPU_WAIT_SHARE of the run or more). Every culprit is the job's
    process; a wait on a thread or a lock names the exporter (its tid or name) or PyTorch's autograd thread. Findings
    naming the exporter explain no more than the main thread's wait on the lock or the exporter's measured cost (the
    run's time beyond its steps at the rate with no exporter, `export_overhead_s`), whichever is more, and the main and
    autograd threads' wait for a CPU; a wait on the autograd thread no more than the main thread's time in
    loss.backward(); pageable copies and excess-sync no more than its read-back (`read_s`); host-bound and launch-bound
    no more than its time on a CPU and in loss.backward(); own-threads-cpu and cpu-contention naming no exporter no more
    than the two threads' wait for a CPU; each plus half a second (over the findings' longest window). With the main
    thread's wait on the lock (`lock_wait_share`, timed around acquire()) a third of the run or more, the report leads,
    said of the job's process, with that wait (a wait on a thread or a lock) naming the exporter, HIGH where the wait
    is half the run or more, nothing gpu-bound, the findings naming the exporter explain at least half the wait, and
    the lead says where (REGISTRY_WORDS, in its words or the code behind it: the lock, the registry, the rendering,
    json, gzip; the script's file name and the thread's name taken out) with a fix for it (LOCK_FIX: a copy under the
    lock and the rest outside it, a shorter hold, exports less often or elsewhere): a report that says only "the main
    thread waits on metrics_export" leaves the reader to find which lock and why it is held so long. With the wait a
    tenth of the run or more, some finding (any severity, in the run) says it (a wait on a thread or a lock naming the
    exporter); with it and the exporter's cost both under a tenth, no HIGH or MEDIUM finding names the exporter. GPU
    busy (a step's kernels measured) under 40%: the lead is that wait or the host side, nothing gpu-bound; 80% or more:
    those explain no more than the GPU's idle time plus half a second. The main thread's sleep outside CUDA calls and
    wait for a CPU are at least its wait on the lock less SHARE_SLACK; its time on a CPU and waiting for one, its own
    clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    ex = truth["exporter"]
    etids = set(ex.get("tids") or []) | ({ex["tid"]} if ex.get("tid") else set())
    ecomm = ex.get("comm") or ex.get("name") or "metrics_export"
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = (_waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
              or (own.get("exporter_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE)
    absent, allowed = _rates(own, waited)
    absent |= NEVER | STEADY | {"io-wait"}
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]

    def is_exporter(k: Culprit) -> bool:
        return bool(etids & set(k.tids)) or k.comm == ecomm

    def on_exporter(c: CausalChain) -> bool:
        return any(is_exporter(k) for k in _people(c))

    for c in top:
        if c.root_cause in THREAD_WAIT:
            assert on_exporter(c) or on_autograd(c), (c.summary, c.culprits, sorted(etids), atid)
    lock_wait = own["lock_wait_s"]
    cost = own["export_overhead_s"]
    assert cost is not None, "the script did not measure the loop without the exporter"
    waits = _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s")
    blamed = [c for c in top if on_exporter(c)]
    _capped(blamed, {c.root_cause for c in blamed}, max(lock_wait, cost) + waits, own)
    rest = [c for c in top if not on_exporter(c)]
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(rest, THREAD_WAIT, own["backward_s"], own)
    _capped(top, COPIES, own["read_s"], own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(rest, {"own-threads-cpu", "cpu-contention"}, waits, own)
    lead = THREAD_WAIT
    share = own["lock_wait_share"]
    if share >= THIRD:
        _own_lead(top, lead, pid, own)
        c0 = top[0]
        assert on_exporter(c0), (c0.summary, c0.culprits, sorted(etids))
        _high_if(c0, share)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds([c for c in blamed if c.root_cause in lead]) >= 0.5 * lock_wait, (_said(blamed), own)
        text = _words_without(c0, REGISTRY_SCRIPT).replace(ecomm, "")
        assert REGISTRY_WORDS.search(text), (c0.summary, c0.explanation, own)
        assert LOCK_FIX.search(" ".join(c0.recommendations)), (c0.summary, c0.recommendations)
    if share >= WAITED_SHARE:
        seen = [c for c in _shown(report, truth) if c.root_cause in THREAD_WAIT and on_exporter(c)]
        assert seen, (_said(report.chains), own)
    elif cost < WAITED_SHARE * wall:
        assert not blamed, [(c.summary, c.culprits) for c in blamed]
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= share - SHARE_SLACK, (shares, own)


def check_pool_map_augment(report: Report, truth: dict, store: Path) -> None:
    """A ResNet-34-style classifier (128 crops of 128 px a step, channels_last, bf16 autocast, SGD, loss.item() each
    step) whose every batch is made by multiprocessing.Pool(3).map(augment, [images[i] for i in idx]), synchronously:
    the batch's decoded images pickled by the pool's task-handler thread to three pool processes (truth `pool`: pids;
    forked at start-up, before the run), each augmenting images in numpy (truth `augment`: a random resized crop,
    a flip, colour jitter), the crops pickled back and unpickled by the pool's result-handler thread (truth
    `pool.handler_tids`: threads of the main process), while the main thread sleeps in pool.map() and the GPU idles;
    then the crops stacked and copied to the GPU from pageable memory. The job on CPUs 2-5; no DataLoader, no other
    children, no IO, no lock of its own, no sleep. No HIGH or MEDIUM finding (in the measured run) says a cause the job
    did not have: NEVER, STARTED (the pool was forked before the run), IO; the pool's CPUs (own-workers-cpu) only where
    a pool process waited for a CPU STARVED_SHARE of the run; churn, faults and own-threads-cpu or cpu-contention only
    at the rates (natural_checks_23's _rates: the main or autograd thread waiting for a CPU CPU_WAIT_SHARE of the run or
    more); with the main thread's time in pool.map() off its CPU (`map_off_cpu_s`) under a tenth of the run, no input
    wait. Every culprit is the job's process or a pool process. A wait on the pool (on a process or workers, or
    own-workers-cpu) names a pool process or one of the pool's handler threads; a wait on a thread or a lock names the
    pool (its processes or handler threads, which unpickle the results under the GIL) or PyTorch's autograd thread.
    Findings naming the pool explain no more than the main thread's time in pool.map(); a wait on the autograd thread no
    more than its time in loss.backward(); pageable copies and excess-sync no more than the batch's copy and .item();
    host-bound and launch-bound no more than its time on a CPU and in loss.backward(); own-threads-cpu and
    cpu-contention naming no pool no more than the main, autograd and handler threads' wait for a CPU; each plus half
    a second (over the findings' longest window). With the pool's cost (`pool_overhead_s`: the run's time beyond its
    steps at the rate of the same loop on one augmented batch kept on the GPU) and the main thread's time in pool.map()
    (`map_share`) both a third of the run or more, the report leads, said of the job's process, with the wait on the
    pool (an input wait, or own-workers-cpu where true) naming a pool process or handler thread, HIGH where the main
    thread spent half the run or more in pool.map() off its CPU, with a fix on the input side (POOL_FIX: a DataLoader
    with workers, the map made asynchronous or prefetched ahead so it overlaps the GPU, less pickling), nothing
    gpu-bound, the findings naming the pool explain at least half the main thread's time in pool.map() off its CPU, and
    some finding naming the pool (any severity, in the run) says where, in its words or in the code behind it
    (POOL_WORDS: multiprocessing, the pool and its map, pickling, augment() or its numpy; the script's file name taken
    out): a report that says only "the main thread waits for another process" leaves the reader to find which. GPU busy
    (a step's kernels measured) under 40%: the lead is that wait or the host side, nothing gpu-bound; 80% or more:
    those explain no more than the GPU's idle time plus half a second. The main thread's sleep outside CUDA calls and
    wait for a CPU are at least its time in pool.map() off its CPU less SHARE_SLACK; its time on a CPU and waiting for
    one, its own clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    pool = truth["pool"]
    ppids = set(pool["pids"])
    ptids = {t for p in pool["processes"] for t in p["tids"]} | ppids
    htids = set(pool.get("handler_tids") or [])
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = _waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _rates(own, waited)
    starved = (own["pool_cpu_wait_max_share"] or 0.0) >= STARVED_SHARE
    absent |= NEVER | STARTED | {"io-wait"}
    absent |= set() if starved else {"own-workers-cpu"}
    allowed |= {"own-workers-cpu"} if starved else set()
    map_off = own["map_off_cpu_s"]
    if map_off < WAITED_SHARE * wall:
        absent |= INPUT - THREAD_WAIT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or k.pid in ppids for c in top for k in _people(c)), \
        [(c.summary, c.culprits) for c in top]

    def is_pool(k: Culprit) -> bool:
        return k.pid in ppids or bool((ptids | htids) & set(k.tids))

    def on_pool(c: CausalChain) -> bool:
        return any(is_pool(k) for k in _people(c))

    for c in top:
        if c.root_cause in THREAD_WAIT:
            assert on_pool(c) or on_autograd(c), (c.summary, c.culprits, sorted(ppids), sorted(htids), atid)
        elif c.root_cause in INPUT | {"own-workers-cpu"}:
            assert on_pool(c), (c.summary, c.culprits, sorted(ppids), sorted(htids))
    on_p = [c for c in top if on_pool(c)]
    _capped(on_p, {c.root_cause for c in on_p}, own["map_s"], own)
    rest = [c for c in top if not on_pool(c)]
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(rest, THREAD_WAIT, own["backward_s"], own)
    _capped(top, COPIES, own["h2d_s"] + own["item_s"], own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(rest, {"own-threads-cpu", "cpu-contention"},
            _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s", "handlers_cpu_wait_s"), own)
    lead = (INPUT | ({"own-workers-cpu"} if starved else set())) - absent
    overhead = own["pool_overhead_s"]
    assert overhead is not None, "the script did not measure the loop with its batch already on the GPU"
    if overhead >= THIRD * wall and own["map_share"] >= THIRD:
        _own_lead(top, lead, pid, own)
        c0 = top[0]
        assert on_pool(c0), (c0.summary, c0.culprits, sorted(ppids), sorted(htids))
        _high_if(c0, map_off / wall)
        assert POOL_FIX.search(" ".join(c0.recommendations)), (c0.summary, c0.recommendations)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds([c for c in on_p if c.root_cause in lead]) >= 0.5 * map_off, (_said(on_p), own)
        seen = [c for c in _shown(report, truth) if on_pool(c)
                and POOL_WORDS.search(_words_without(c, POOL_SCRIPT))]
        assert seen, (_said(report.chains), own)
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= map_off / wall - SHARE_SLACK, (shares, own)


def check_healthy_shard_verify_thread(report: Report, truth: dict, store: Path) -> None:
    """A control: the zoo's MLP made larger (512-4096, three 4096x4096 layers, batch 8192, fp32 without TF32, fused
    AdamW: tens of ms of GPU work a step, loss.item() each step its one wait for the GPU) fed from a page-cached memmap
    of float16 features, nanoGPT's way (the next batch gathered, pinned and copied while the GPU runs the step), whose
    process runs a thread it started before the measured run (truth `decoys`, `shard_verify`: comm shard_verify) that
    scrubs the dataset's 4 shards of 128 MB against their crc32 over and over (readinto in 8 MB chunks, zlib.crc32,
    posix_fadvise DONTNEED after each shard, so every pass reads them from storage again: `verify_disk_read_bytes`),
    flat out the whole run, on the job's CPUs 2-4 beside the main and autograd threads. It shares no lock, queue or
    file with the loop; the script measures the steps per second alone (4 s before the thread started) and beside it
    (`with_over_alone`; the run's time beyond its steps at the rate alone, `verify_overhead_s`). No workers, no
    children, no sleep in the loop, no copies but the pinned batch and .item()'s 4 bytes. No HIGH or MEDIUM finding (in
    the measured run) says a cause it did not have: NEVER, STARTED (the thread was started before the run), a wait on
    workers or a process, the workers' CPUs, pageable copies (the batch is pinned); IO, a wait on a thread or a lock,
    contention or own-threads-cpu naming the scrub only where it cost the steps a tenth of the run or more
    (`verify_overhead_s`); IO not naming it only where the run had major page faults; a wait on a thread or a lock
    otherwise only naming PyTorch's autograd thread; churn, faults and own-threads-cpu or cpu-contention only at the
    rates (natural_checks_23's _rates: the main or the autograd thread waiting for a CPU CPU_WAIT_SHARE of the run or
    more). No culprit outside the job's process. Any finding naming the scrub explains no more than its cost and the
    main and autograd threads' wait for a CPU; a wait on the autograd thread no more than the main thread's time in
    loss.backward(); host-bound and launch-bound no more than its time on a CPU and queueing; excess-sync no more than
    its .item() time; own-threads-cpu and cpu-contention naming no scrub no more than the two threads' wait for a CPU;
    each plus half a second. The job measured itself GPU-bound (busy GPU_BOUND or more: a step's kernels measured) and
    the scrub cost under a tenth of the run: no HIGH or MEDIUM finding but gpu-bound and the churn or page faults the
    rates make true, none naming the scrub (its tid or name), and no finding at all (any severity, in the run) blames
    it (VERIFY_BLAME naming it) for more than the main and autograd threads' wait for a CPU plus half a second: a
    report that sends the reader to stop the scrub (or move its IO elsewhere) promises time the job never lost. GPU
    busy under 40% (the premise wrong): the lead is the host side or those allowed, nothing gpu-bound; 80% or more:
    those explain no more than the GPU's idle time plus half a second. The main thread's time inside CUDA calls
    (asleep or spinning in .item()'s wait for the GPU) is at least half its .item() share less SHARE_SLACK; its time
    on a CPU and waiting for one, its own clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    dec = truth["shard_verify"]
    vtids = set(dec.get("tids") or []) | ({dec["tid"]} if dec.get("tid") else set())
    vcomm = dec.get("comm") or dec.get("name") or "shard_verify"
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = _waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _rates(own, waited)
    cost = own["verify_overhead_s"]
    assert cost is not None, "the script did not measure the loop alone"
    kept = cost < WAITED_SHARE * wall
    absent |= NEVER | STARTED | (INPUT - THREAD_WAIT) | {"own-workers-cpu", "pageable-copies"}
    if atid is None and kept:
        absent |= THREAD_WAIT

    def is_decoy(k: Culprit) -> bool:
        return bool(vtids & set(k.tids)) or k.comm == vcomm

    def on_decoy(c: CausalChain) -> bool:
        return any(is_decoy(k) for k in _people(c))

    waits = _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s")
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    for c in top:
        if on_decoy(c):
            assert not kept and c.root_cause in VERIFY_BLAME, (c.summary, c.culprits, sorted(vtids), own)
        elif c.root_cause in THREAD_WAIT:
            assert on_autograd(c), (c.summary, c.culprits, atid)
        elif c.root_cause == "io-wait":
            assert own["major_faults"], (c.summary, c.culprits, own)
    blamed = [c for c in top if on_decoy(c)]
    _capped(blamed, {c.root_cause for c in blamed}, cost + waits, own)
    rest = [c for c in top if not on_decoy(c)]
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(rest, THREAD_WAIT, own["backward_s"], own)
    _capped(top, HOST_WORK, main_run + own["issue_s"] + own["batch_s"], own)
    _capped(top, {"excess-sync"}, own["item_s"], own)
    _capped(rest, {"own-threads-cpu", "cpu-contention"}, waits, own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= GPU_BOUND and kept:
        ok = {"gpu-bound"} | (allowed - {"own-threads-cpu"})
        assert all(c.root_cause in ok for c in top), (_said(top), own)
        assert not any(on_decoy(c) for c in top), [(c.summary, c.culprits) for c in top]
        shown = [c for c in _shown(report, truth) if c.root_cause in VERIFY_BLAME and on_decoy(c)]
        _capped(shown, VERIFY_BLAME, waits, own)
    lead = HOST_SIDE | (allowed - absent) | (THREAD_WAIT if atid is not None else set()) | (
        set() if kept else VERIFY_BLAME - absent)
    _gpu_busy_rules(top, own, lead, lead)
    shares = clocks_agree(report, truth)
    inside = shares["sleep_inside_ns"] + shares["run_inside_ns"]
    assert inside >= 0.5 * own["item_share"] - SHARE_SLACK, (shares, own)


CHECKS_31 = {"natural_registry_lock_export": check_registry_lock_export,
             "natural_pool_map_augment": check_pool_map_augment,
             "natural_healthy_shard_verify_thread": check_healthy_shard_verify_thread}
