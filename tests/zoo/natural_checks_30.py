"""The group natural30 (bench/gpu/zoo/device_zoo.sh natural30): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, by a helper that read no analysis code and no recorded report, from
what each script measures of itself (its truth's `self`) and what it cannot have had. One job's main thread waits in
next() on DataLoader workers that are on their CPUs inflating gzip streams (a map-style Dataset that seeks in
gzip-compressed token shards: GzipFile.seek decompresses up to the target, from the file's start after a backward
seek); one's main thread computes a progress line every step with numpy over Python lists of every sample's loss and
hit of the epoch so far (work that grows through each epoch, the GPU idle meanwhile: about a third of the run); the
third is a GPU-bound control that starts two background processes at nice 19 on its own CPUs, busy flat out, the
decoys. tests/zoo/test_zoo_natural.py merges CHECKS_30 into its CHECKS; the ways of reading findings it shares with
earlier groups are natural_shares', natural_checks_13's, natural_checks_22's, natural_checks_23's,
natural_checks_25's, natural_checks_26's and natural_checks_27's."""

from __future__ import annotations

import re
from pathlib import Path

from natural_checks_13 import DISK_SHARE
from natural_checks_22 import GPU_BOUND, NEVER, THIRD, THREAD_WAIT, WAITED_SHARE
from natural_checks_22 import _ours, _shown, _waited
from natural_checks_23 import COPIES, HOST_WORK, OWN_WORK, _autograd, _cpu_cost, _rates
from natural_checks_25 import DECOY_BLAME, _cpu_waits
from natural_checks_26 import STARTED, _words
from natural_checks_27 import HALF, LOADER_FIX, _high_if
from natural_shares import CPU_WAIT_SHARE, HOST_SIDE, INPUT, SHARE_SLACK, STARVED_SHARE, clocks_agree
from natural_shares import capped as _capped, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import own_lead as _own_lead, people as _people, said as _said, seconds as _seconds

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

GZIP_SCRIPT = "natural_gzip_seek_getitem"
# Where the workers' time goes, said in words or in the code behind a finding naming a worker: gzip (Python's gzip
# module, its GzipFile and reader), zlib and inflating, _compression's DecompressReader (whose seek() reads and drops
# up to the target), the seek and the rewinds, the Dataset's class or __getitem__. The script's file name holds
# "gzip", "seek" and "getitem": it is taken out of the text before the search (a frame in the script says nothing of
# gzip); its shards' folder is "zoo_gzshards_", which none of these words matches.
GZIP_WORDS = re.compile(r"\bgzip|GzipFile|_GzipReader|\bzlib|libz\b|_compression|DecompressReader|\binflat|"
                        r"decompress|\bseek|\brewind|GzipTokenWindows|__getitem__", re.IGNORECASE)
# A fix on the loader's side (natural_checks_27's) or the storage's: the shards decompressed once or stored
# uncompressed (in memory, np.memmap), a seekable or indexed format, reading them in order (an IterableDataset,
# sequential or per-shard access), caching.
GZIP_FIX = re.compile(rf"{LOADER_FIX.pattern}|uncompress|decompress|memmap|in memory|seekable|random access|"
                      r"sequential|in order|IterableDataset|\bindex|\bcach|\bonce\b", re.IGNORECASE)
STATS_SCRIPT = "natural_epoch_loss_list_stats"
# Where the progress line's time goes, said in words or in the code behind a finding: numpy's mean and percentile (and
# their internals: _methods, the quantile, the partition), the conversion of a Python list to an array, the growing
# lists of per-sample values, the progress line or its function. The script's file name holds "epoch", "loss",
# "list" and "stats": it is taken out of the text before the search.
STATS_WORDS = re.compile(r"numpy|np\.mean|np\.percentile|\bmean\b|percentile|quantile|partition|_methods|asarray|"
                         r"asanyarray|PyArray|list to (an )?array|python lists?|lists? of (python )?(floats|bools|"
                         r"values|losses)|growing|lists? (that )?grows?|per[- ]sample|epoch_losses|epoch_correct|"
                         r"progress|postfix", re.IGNORECASE)
# A fix for it: running sums or means (incremental, accumulated), the statistics less often or once an epoch, a bounded
# window, values kept in an array or on the GPU, the work vectorised or moved off the main thread.
STATS_FIX = re.compile(r"running|incremental|accumulat|less often|less frequent|every \d+|once (an|per|each|a)|"
                       r"end of (the |each )?epoch|bounded|window|deque|preallocat|\barray\b|on the GPU|vectori[sz]|"
                       r"precomput|\bcach|numpy|main thread|off the (main|loop)|background", re.IGNORECASE)
STATS_SHOWN = 0.2  # the progress line this share of the run or more: a finding must say where it is
# What the control's steps must not be charged to: its two nice-19 background processes on its own CPUs, by a wait on
# them, their CPUs (contention, workers' CPUs, own threads'), a spawn, a slow consumer, or the files they write.
PREP_BLAME = DECOY_BLAME | {"cpu-contention", "own-threads-cpu", "io-wait"}


def _words_without(c: CausalChain, script: str) -> str:
    """natural_checks_26's _words (a finding's words and its frames), the job's own file name taken out."""
    return _words(c).replace(script, "")


def check_gzip_seek_getitem(report: Report, truth: dict, store: Path) -> None:
    """A GPT-style LM (6 blocks, d 512, 16 x 1024 tokens a step, bf16 autocast, fused AdamW, loss.item() each step) fed
    by DataLoader(num_workers=4, persistent_workers=True, shuffle=True) whose Dataset (truth `dataset`:
    GzipTokenWindows.__getitem__) reads each 1,025-token window from one of 16 gzip-compressed token shards (16 MB
    uncompressed each, in the page cache) with f.seek() and f.read() on a gzip.open() file each worker keeps: a gzip
    stream cannot seek, so GzipFile decompresses from where it is to the window, or from the file's start after a
    backward seek (half the seeks): megabytes inflated to read 2 KB. The workers (truth `workers`, forked before the
    measured run) are on their CPUs in zlib and gzip.py's read loop, the main thread waits in next() and the GPU idles.
    The main process and its workers on CPUs 2-7; no threads of the job's own, no children but the workers, no IO but
    the page cache's, no lock, no sleep. No HIGH or MEDIUM finding (in the measured run) says a cause the job did not
    have: NEVER, STARTED; IO only where the workers read DISK_SHARE of their bytes from storage (shards in the page
    cache are not IO); the workers' CPUs (own-workers-cpu) only where a worker waited for a CPU STARVED_SHARE of the
    run; a lock only naming PyTorch's autograd thread (the workers share nothing to take turns at: each has its own
    files), a wait on a thread only naming it or a worker's thread (the queue's feeder that hands a batch over); churn,
    faults and own-threads-cpu or cpu-contention only at the rates (natural_checks_23's _rates: the main or the
    autograd thread waiting for a CPU CPU_WAIT_SHARE of the run or more); with the main thread's time in next() off its
    CPU (`wait_off_cpu_s`) under a tenth of the run, no input wait. Every culprit is the job's process or one of its
    workers. A wait on the workers or a process or own-workers-cpu names a worker (its pid, a tid of it, or
    pt_data_worker). Those naming the workers explain no more than the main thread's time in next(); a wait on the
    autograd thread no more than its time in loss.backward(); pageable copies and excess-sync no more than the batch's
    copy and .item(); host-bound and launch-bound no more than its time on a CPU and in loss.backward();
    own-threads-cpu and cpu-contention no more than the two threads' wait for a CPU; each plus half a second (over the
    findings' longest window). With the seeks' cost (`gzip_overhead_s`: the run's time beyond its steps at the rate
    measured with every shard decompressed once into memory before the workers start) and the main thread's time in
    next() (`wait_share`) both a third of the run or more, the report leads, said of the job's process, with the wait
    on the loader (an input wait, or own-workers-cpu where true) naming a worker, HIGH where the main thread spent half
    the run or more in next() off its CPU, with a fix on the loader's or the storage's side (GZIP_FIX: the workers, the
    Dataset, the shards decompressed once or stored seekable, read in order), nothing gpu-bound, and the findings naming
    the workers explain at least half the main thread's time in next() off its CPU; and with the workers in the seeks
    half their time or more (`seek_share_of_workers`), some finding naming a worker (any severity, in the run) says
    where, in its words or in the code behind it (GZIP_WORDS: gzip, zlib, inflating, _compression's DecompressReader,
    the seek or the rewinds, the Dataset's class or __getitem__; the script's file name taken out): a report that says
    only that the workers do not keep up sends the reader to add workers or CPUs, when each seek inflates megabytes to
    read 2 KB. GPU busy (a step's kernels measured queued) under 40%: the lead is that wait or the host side, nothing
    gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second. The main thread's sleep
    outside CUDA calls and wait for a CPU are at least its time in next() off its CPU less SHARE_SLACK; its time on a
    CPU and waiting for one, its own clocks'."""
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
    overhead = own["gzip_overhead_s"]
    assert overhead is not None, "the script did not measure the loop with the shards decompressed once"
    if overhead >= THIRD * wall and own["wait_share"] >= THIRD:
        _own_lead(top, lead, pid, own)
        c0 = top[0]
        assert on_workers(c0), (c0.summary, c0.culprits, sorted(wpids))
        _high_if(c0, wait_off / wall)
        assert GZIP_FIX.search(" ".join(c0.recommendations)), (c0.summary, c0.recommendations)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds([c for c in on_w if c.root_cause in lead]) >= 0.5 * wait_off, (_said(on_w), own)
        if own["seek_share_of_workers"] >= HALF:
            seen = [c for c in _shown(report, truth) if on_workers(c)
                    and GZIP_WORDS.search(_words_without(c, GZIP_SCRIPT))]
            assert seen, (_said(report.chains), own)
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= wait_off / wall - SHARE_SLACK, (shares, own)


def check_epoch_loss_list_stats(report: Report, truth: dict, store: Path) -> None:
    """A ResNet-18-style classifier (64 px images held on the GPU, batch 256, bf16 autocast, SGD, per-sample
    cross-entropy; the step read back with two .tolist() calls, the per-sample losses and hits) whose main thread, every
    step, extends two Python lists with the batch's values and computes a progress line over them (truth `stats`:
    progress(), np.mean and np.percentile of the epoch's losses so far and np.mean of its hits): each call converts the
    whole list to an array, so the work grows by a batch every step and falls back at each epoch's start (truth
    `epochs_ns`), the GPU idle meanwhile. The epoch's length was set at start-up so that the line costs about a third
    of the run (`stats_share`; its growth: `stats_ms_first_tenth`, `stats_ms_last_tenth`). One process on CPUs 2-3, no
    threads of its own, no workers, no children, no IO, no lock, no sleep; every batch has the same shape and the
    same GPU work (so no GPU that got slower, though the steps slow through each epoch). Read as natural_checks_23's
    _cpu_cost says: no HIGH or MEDIUM finding says a cause the job did not have (NEVER, STEADY, IO), churn, faults or a
    wait for a CPU only at the rates, a wait on a thread only naming the autograd thread, nothing blamed outside the
    process; the findings' seconds within the job's own clocks; with the cost the run's time beyond its steps at the
    rate measured with the fix (running sums and the batch's own percentile, the same lists kept:
    `stats_overhead_s`) a third of the run or more, the lead said of the process is the main thread's own work
    (host-bound, or what the rates make true), nothing gpu-bound, explaining at least half that cost; with the progress
    line (`stats_s`) a tenth of the run or more some finding says host-bound of the process; GPU busy under 40% the lead
    is that own work, 80% or more the host side no more than the GPU's idle time; the main thread's time running
    outside CUDA calls at least the line's CPU time (`stats_cpu_share`) less SHARE_SLACK. The copies and synchronising
    calls are the two .tolist() reads (`sync_s`: the wait for the step's kernels in them). Besides: launch-bound
    explains no more than the main thread's time making the batch, queueing the step and in loss.backward() (`batch_s`,
    `step_s`, `backward_s`) plus half a second (the work is not issuing kernels); with the cost half the run or more the
    lead is HIGH; and with the progress line a fifth of the run or more (STATS_SHOWN), some host-bound finding of the
    process (any severity, in the run) says where, in its words or in the code behind it (STATS_WORDS: numpy's mean,
    percentile or partition, the conversion of Python lists to arrays, the growing per-sample lists, the progress line;
    the script's file name taken out), with a fix for it (STATS_FIX: running sums, less often or once an epoch, a
    bounded window, an array or the GPU, off the main thread): a report that says only "the main thread is busy in
    Python" leaves the reader to profile the job again, and one that says the GPU got slower as each epoch goes on
    sends them to the model."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    overhead = own["stats_overhead_s"]
    _cpu_cost(report, truth, overhead, own["stats_s"], own["stats_cpu_share"], own["sync_s"])
    top = _in_run(report, truth)
    _capped(top, {"launch-bound"}, own["batch_s"] + own["step_s"] + own["backward_s"], own)
    wall = own["wall_s"]
    if overhead >= THIRD * wall:
        _high_if(top[0], overhead / wall)
    if own["stats_s"] >= STATS_SHOWN * wall:
        seen = [c for c in _shown(report, truth) if c.root_cause in OWN_WORK and _ours(c, pid)
                and STATS_WORDS.search(_words_without(c, STATS_SCRIPT))]
        assert seen, (_said(report.chains), own)
        assert any(STATS_FIX.search(" ".join(c.recommendations)) for c in seen), \
            [(c.summary, c.recommendations) for c in seen]


def check_healthy_niced_shard_prep(report: Report, truth: dict, store: Path) -> None:
    """A control: a DDPM U-Net (~61 M parameters, 64 images of 64 px a step drawn on the GPU, bf16 autocast, fused
    AdamW, loss.item() each step its one wait for the GPU: tens of milliseconds of GPU work a step against a few of
    queueing) on CPUs 2-3, with two background processes it started before the measured run (truth `decoys`,
    `shard_prep`: comm shard_prep, os.nice(19)) on the same two CPUs, drawing token streams with numpy, compressing them
    with zlib, hashing them and writing them to /var/tmp flat out the whole run: they keep the job's CPUs busy, yet at
    nice 19 they run only when the trainer's threads do not want a CPU. They share no file, pipe, lock or GPU with the
    loop; the script measures the steps per second alone (4 s before they started) and beside them (`with_over_alone`;
    the run's time beyond its steps at the rate alone, `prep_overhead_s`). No threads of the job's own, no workers, no
    lock, no sleep in the loop, no copies but .item()'s 4 bytes. No HIGH or MEDIUM finding (in the measured run) says a
    cause it did not have: NEVER, STARTED (the decoys were started before the run), pageable copies, IO (only where the
    run had major page faults: the decoys' writes are theirs, the loop never waits for them); a wait on a process or
    workers, the workers' CPUs, a slow consumer, contention or own-threads-cpu naming a decoy only where they cost the
    steps a tenth of the run or more (`prep_overhead_s`); a wait on a thread or a lock only naming PyTorch's autograd
    thread, or a decoy where they cost the steps; churn, faults and own-threads-cpu or cpu-contention only at the rates
    (natural_checks_23's _rates: the main or the autograd thread waiting for a CPU CPU_WAIT_SHARE of the run or more).
    No culprit outside the job's process but the decoys, and those only where they cost the steps a tenth of the run.
    Any finding naming a decoy explains no more than their cost and the main and autograd threads' wait for a CPU; a
    wait on the autograd thread no more than the main thread's time queueing the steps (`issue_s`, its wait in
    loss.backward() among it); host-bound and launch-bound no more than its time on a CPU and queueing; excess-sync no
    more than its .item() time; own-threads-cpu and cpu-contention naming no decoy no more than the two threads' wait
    for a CPU; each plus half a second. The job measured itself GPU-bound (busy GPU_BOUND or more: a step's kernels
    measured queued) and the decoys cost under a tenth of the run: no HIGH or MEDIUM finding but gpu-bound and the
    churn or page faults the rates make true, none naming a decoy (a shard_prep pid, a tid of it, or the name), and no
    finding at all (any severity, in the run) blames the decoys (PREP_BLAME naming one) for more than the main and
    autograd threads' wait for a CPU plus half a second: a report that sends the reader to stop the background job (or
    lower its priority further) promises time the job never lost. GPU busy under 40% (the premise wrong): the lead is
    the host side or those allowed, nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus
    half a second. The main thread's time inside CUDA calls (asleep or spinning in .item()'s wait for the GPU) is at
    least half its .item() share less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    dpids = {d["pid"] for d in truth["decoys"]}
    dtids = {t for d in truth["decoys"] for t in d["tids"]} | dpids
    dcomm = truth["shard_prep"]["comm"]
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = _waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _rates(own, waited)
    cost = own["prep_overhead_s"]
    assert cost is not None, "the script did not measure the loop alone"
    kept = cost < WAITED_SHARE * wall
    absent |= NEVER | STARTED | {"pageable-copies"}
    absent |= set() if own["major_faults"] else {"io-wait"}
    if kept:
        absent |= (INPUT - THREAD_WAIT) | {"own-workers-cpu"}
    if atid is None and kept:
        absent |= THREAD_WAIT

    def is_decoy(k: Culprit) -> bool:
        return k.pid in dpids or bool(dtids & set(k.tids)) or k.comm == dcomm

    def on_decoy(c: CausalChain) -> bool:
        return any(is_decoy(k) for k in _people(c))

    waits = _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s")
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or (not kept and is_decoy(k)) for c in top for k in _people(c)), \
        [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in DECOY_BLAME:
            ok = on_decoy(c) or (c.root_cause in THREAD_WAIT and on_autograd(c))
            assert ok and (not kept or not on_decoy(c)), (c.summary, c.culprits, sorted(dpids))
        if on_decoy(c):
            assert not kept and c.root_cause in PREP_BLAME, (c.summary, c.culprits, sorted(dpids), own)
    blamed = [c for c in top if on_decoy(c)]
    _capped(blamed, {c.root_cause for c in blamed}, cost + waits, own)
    rest = [c for c in top if not on_decoy(c)]
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(rest, THREAD_WAIT, own["issue_s"], own)
    _capped(top, HOST_WORK, main_run + own["issue_s"], own)
    _capped(top, {"excess-sync"}, own["item_s"], own)
    _capped(rest, {"own-threads-cpu", "cpu-contention"}, waits, own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= GPU_BOUND and kept:
        ok = {"gpu-bound"} | (allowed - {"own-threads-cpu"})
        assert all(c.root_cause in ok for c in top), (_said(top), own)
        assert not any(on_decoy(c) for c in top), [(c.summary, c.culprits) for c in top]
        shown = [c for c in _shown(report, truth) if c.root_cause in PREP_BLAME and on_decoy(c)]
        _capped(shown, PREP_BLAME, waits, own)
    lead = HOST_SIDE | (allowed - absent) | (THREAD_WAIT if atid is not None else set()) | (
        set() if kept else PREP_BLAME - absent)
    _gpu_busy_rules(top, own, lead, lead)
    shares = clocks_agree(report, truth)
    inside = shares["sleep_inside_ns"] + shares["run_inside_ns"]
    assert inside >= 0.5 * own["item_share"] - SHARE_SLACK, (shares, own)


CHECKS_30 = {"natural_gzip_seek_getitem": check_gzip_seek_getitem,
             "natural_epoch_loss_list_stats": check_epoch_loss_list_stats,
             "natural_healthy_niced_shard_prep": check_healthy_niced_shard_prep}
