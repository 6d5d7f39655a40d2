"""The group natural28 (bench/gpu/zoo/device_zoo.sh natural28): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, by a helper that read no analysis code and no recorded report, from
what each script measures of itself (its truth's `self`) and what it cannot have had. One job's main thread stalls on
its own CPU at the start of every short epoch, inside PyTorch's native code (WeightedRandomSampler's torch.multinomial
without replacement over 4,000,000 weights, drawn anew at each iter(loader)), while its DataLoader workers and the GPU
wait; one's main thread waits in next() on workers that are on their CPUs inside libsqlite3 (a full table scan per
sample: the Dataset's lookup key has no index); the third is a GPU-bound control fed by a producer process of its own
(numpy FFT simulations through a torch.multiprocessing Queue), busy on a CPU of the job and always ahead: the decoy.
tests/zoo/test_zoo_natural.py merges CHECKS_28 into its CHECKS; the ways of reading findings it shares with earlier
groups are natural_shares', natural_checks_13's, natural_checks_16's, natural_checks_22's, natural_checks_23's,
natural_checks_25's, natural_checks_26's and natural_checks_27's."""

from __future__ import annotations

import re
from pathlib import Path

from natural_checks_13 import DISK_SHARE
from natural_checks_22 import GPU_BOUND, NEVER, THIRD, THREAD_WAIT, WAITED_SHARE
from natural_checks_22 import _ours, _shown, _waited
from natural_checks_23 import COPIES, HOST_WORK, OWN_WORK, _autograd, _rates
from natural_checks_25 import DECOY_BLAME, _cpu_waits
from natural_checks_26 import KEPT_LOOSE, STARTED, _words
from natural_checks_27 import HALF, LOADER_FIX, _high_if
from natural_shares import CPU_WAIT_SHARE, HOST_SIDE, INPUT, SECOND, SHARE_SLACK, STARVED_SHARE, clocks_agree
from natural_shares import capped as _capped, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import own_lead as _own_lead, people as _people, said as _said, seconds as _seconds

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

# The epochs' draw, said in words or in the code behind a finding: the sampler's class, torch.multinomial (its top-k
# without replacement), the list it makes, the sampler (a whole word, or PyTorch's sampler.py: the script's file name,
# which holds "_sampler_", says nothing of where the time went), its arguments.
DRAW_WORDS = re.compile(r"WeightedRandomSampler|multinomial|\btopk\b|\bsampler\b|\btolist\b|num_samples|"
                        r"replacement", re.IGNORECASE)
# A fix for the draw: draw fewer (num_samples, what an epoch uses), with replacement, ahead of the loop or once
# (precompute, cache, a permutation reused, sliced), off the main thread; or a word of the sampler or its draw.
DRAW_FIX = re.compile(r"num_samples|replacement|precomput|ahead|\bonce\b|\bcach|permut|re-?use|fewer|slic|"
                      r"background|off the (main|loop)|sampler|multinomial|\bdraw", re.IGNORECASE)
# That the stall comes back at each epoch's start, said in words or in the code behind a finding: the epochs (a whole
# word: the script's file name holds "_epochs"), each new pass over the loader (DataLoader.__iter__, its iterator's
# _reset), a recurring or periodic stall.
EPOCH_WORDS = re.compile(r"\bepoch(s|'s)?\b|each (new )?(pass|iteration over)|new iterator|iter\(loader\)|"
                         r"DataLoader\.__iter__|\b_reset\b|recurr|periodic|every \d", re.IGNORECASE)
EPOCH_SHOWN = 0.2  # the epochs' starts this share of the run or more (each 0.2 s or more, 3 or more): their recurrence
# SQLite's lookup, said in words or in the code behind a finding naming a worker: SQLite (its library, sqlite3_step,
# Python's _sqlite3 and sqlite3), SQL, the query and its calls, the scan, the missing index (whole words: the script's
# file name holds "_sqlite_unindexed_", its folder "zoo_sqliteds_").
SQL_WORDS = re.compile(r"\bsqlite|libsqlite|_sqlite3|\bSQL\b|\bSELECT\b|\bquer(y|ies)\b|\bexecute\b|fetchone|"
                       r"table scan|full scan|\bunindexed\b|no index|missing index|CREATE INDEX|without an index",
                       re.IGNORECASE)
# A fix on the loader's side (natural_checks_27's) or the lookup's: an index, the table loaded once or cached.
QUERY_FIX = re.compile(rf"{LOADER_FIX.pattern}|\bindex|sqlite|\bquer|\bcach|preload|in memory|lookup|\bonce\b",
                       re.IGNORECASE)


def _overlapping(spans: list[list[int]], windows: list) -> int:
    """How many of `spans` ([start_ns, end_ns]) some window overlaps, within half a second."""
    return sum(any(w.start_ns < b + SECOND // 2 and a - SECOND // 2 < w.end_ns for w in windows) for a, b in spans)


def check_weighted_sampler_epochs(report: Report, truth: dict, store: Path) -> None:
    """A DLRM-style click-through model (fp32 without TF32, 8,192 impressions a step, fused Adam, loss.item() each
    step) on 4,000,000 impressions held in memory, fed by DataLoader(num_workers=4, persistent_workers=True,
    batch_size=8192, a batch gathered in one __getitems__) through PyTorch's WeightedRandomSampler(weights,
    num_samples=4,000,000, replacement=False) (truth `sampler`), its "epochs" 200 steps each (a break, then a new
    iter(loader)). At each epoch's iter(loader) the sampler's __iter__ draws every index at once, on the main thread:
    torch.multinomial without replacement (a top-k of 4,000,000 keys in native code) and .tolist(); the main thread is
    on its CPU inside PyTorch for most of a second (truth `epochs`, `epochs_ns`: each epoch start's span) while the
    four workers (truth `workers`, started before the run) and the GPU wait. The main process and its workers on CPUs
    2-7; no threads of the job's own, no children but the workers, no IO, no lock, no sleep; every batch has the same
    shape. No HIGH or MEDIUM finding (in the measured run) says a cause the job did not have: NEVER, STARTED (the
    workers persist, no kernel is new at an epoch's start), IO; the workers' CPUs (own-workers-cpu) only where a worker
    waited for a CPU STARVED_SHARE of the run; a wait on the workers or a process only where the main thread spent
    WAITED_SHARE of the run or more in the loader (iter() and next()) off its CPU (`loader_off_cpu_s`), naming a
    worker; a wait on a thread or a lock names PyTorch's autograd thread, a thread of the job's process (PyTorch's
    intra-op threads may share the draw's element-wise parts) or a worker where a wait on them is allowed; churn,
    faults and own-threads-cpu or cpu-contention only at the rates (natural_checks_23's _rates: the main or the autograd
    thread waiting for a CPU CPU_WAIT_SHARE of the run or more). Every culprit is the job's process, or a worker where a
    wait on them is allowed. Those naming the workers explain no more than the main thread's time in the loader off
    its CPU; the other waits on a thread or a lock no more than its time in loss.backward() and in the epochs' starts;
    pageable copies and excess-sync no more than the batch's copy and .item(); host-bound and launch-bound no more than
    the main thread's time on a CPU and in loss.backward(); own-threads-cpu and cpu-contention no more than the two
    threads' wait for a CPU; each plus half a second (over the findings' longest window). With the draws' cost
    (`draw_overhead_s`: the run's time beyond its steps at the rate measured with every epoch's order drawn before the
    loop) a third of the run or more, the report leads, said of the job's process, with the main thread's own work
    (host-bound, or what the rates make true; not a wait on the workers, which idle), HIGH where that cost is half the
    run or more, nothing gpu-bound, explaining at least half that cost; and some host-bound finding of the process (any
    severity, in the run) says where, in its words or in the code behind it (DRAW_WORDS: WeightedRandomSampler,
    multinomial, the sampler, the list), with a fix for the draw (DRAW_FIX): a report that says "the DataLoader" or
    "waiting on the workers" sends the reader to the workers, which have nothing to do. With the epochs' starts on the
    main thread's CPU (`epoch_start_cpu_s`) a tenth of the run or more, some finding (any severity, in the run) says
    host-bound of the process. With three epochs or more started in the run, each a stall of 0.2 s or more, together
    EPOCH_SHOWN of the run or more, the report says that it recurs: a recurrent phase (report.accounting) whose
    episodes overlap half the epochs' starts or more, or a finding of the process (any severity, in the run) that says
    the epochs or the loader's new pass, in words or in its code (EPOCH_WORDS): one stall averaged over the run is not
    where the time went. GPU busy (a step's kernels measured queued) under 40%: the lead is that own work (or the wait,
    where allowed), nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second.
    The main thread's time running outside CUDA calls is at least the epochs' starts' CPU share
    (`epoch_start_cpu_share`) less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    wpids = {w["pid"] for w in truth["workers"]}
    wtids = {t for w in truth["workers"] for t in w["tids"]}
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = _waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _rates(own, waited)
    starved = (own["workers_cpu_wait_max_share"] or 0.0) >= STARVED_SHARE
    loader_off = own["loader_off_cpu_s"]
    loader_waited = loader_off >= WAITED_SHARE * wall
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
            own_thread = any(k.pid == pid for k in _people(c))
            assert on_autograd(c) or own_thread or (workers_allowed and on_workers(c)), (c.summary, c.culprits, atid)
        if c.root_cause in (INPUT - THREAD_WAIT) | {"own-workers-cpu"}:
            assert on_workers(c), (c.summary, c.culprits, sorted(wpids))
    blamed = [c for c in top if on_workers(c)]
    _capped(blamed, {c.root_cause for c in blamed}, loader_off, own)
    rest = [c for c in top if not on_workers(c)]
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(rest, THREAD_WAIT, own["backward_s"] + own["epoch_start_s"], own)
    _capped(top, COPIES, own["h2d_s"] + own["item_s"], own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(rest, {"own-threads-cpu", "cpu-contention"}, _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s"),
            own)
    lead = OWN_WORK | (allowed - absent)
    overhead = own["draw_overhead_s"]
    assert overhead is not None, "the script did not measure the loop with the orders drawn ahead"
    if overhead >= THIRD * wall:
        _own_lead(top, lead, pid, own)
        _high_if(top[0], overhead / wall)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds(top, lead) >= 0.5 * overhead, (_said(top), sorted(lead), own)
        said_where = [c for c in _shown(report, truth) if c.root_cause in OWN_WORK and _ours(c, pid)
                      and DRAW_WORDS.search(_words(c))]
        assert said_where, (_said(report.chains), own)
        assert any(DRAW_FIX.search(" ".join(c.recommendations)) for c in said_where), \
            [(c.summary, c.recommendations) for c in said_where]
    if own["epoch_start_cpu_s"] >= WAITED_SHARE * wall:
        host = [c for c in _shown(report, truth) if c.root_cause in OWN_WORK and _ours(c, pid)]
        assert host, (_said(report.chains), own)
    spans = truth["epochs_ns"]
    if (len(spans) >= 3 and (own["epoch_stall_ms_min"] or 0.0) >= 200
            and own["epoch_start_s"] >= EPOCH_SHOWN * wall):
        assert report.accounting is not None
        recurrent = [ph for ph in report.accounting.phases if ph.kind == "recurrent"
                     and _overlapping(spans, ph.episodes) >= len(spans) / 2]
        worded = [c for c in _shown(report, truth) if _ours(c, pid) and c.root_cause in lead | HOST_SIDE
                  and EPOCH_WORDS.search(_words(c))]
        assert recurrent or worded, ([(ph.kind, len(ph.episodes)) for ph in report.accounting.phases],
                                     _said(report.chains), own)
    wait_lead = (INPUT | {"own-workers-cpu"}) - absent
    _gpu_busy_rules(top, own, lead | HOST_SIDE | wait_lead, HOST_SIDE | lead | wait_lead)
    shares = clocks_agree(report, truth)
    assert shares["run_outside_ns"] >= own["epoch_start_cpu_share"] - SHARE_SLACK, (shares, own)


def check_sqlite_unindexed_getitem(report: Report, truth: dict, store: Path) -> None:
    """A ResNet-18-style classifier (fp32 without TF32, 64 crops of 3x64x64 a step, SGD with Nesterov, loss.item() each
    step) fed by DataLoader(num_workers=4, persistent_workers=True) whose Dataset (truth `dataset`: AnnotatedCrops, its
    query and both query plans) looks each sample's annotation up in a 120,000-row SQLite table by a text key that no
    index covers (`SELECT ... WHERE ann_key = ?`, plan "SCAN annotations"): the workers (truth `workers`, forked before
    the measured run, each with a CPU to itself, a connection each) are on their CPUs inside libsqlite3 scanning the
    table (its pages read through the page cache: the database was written and synced at set-up), the main thread
    waits in next() and the GPU idles. The main process and its workers on CPUs 2-7; no threads of the job's own, no
    children but the workers, no lock between them (readers only: SQLite's shared file locks never wait), no sleep. No
    HIGH or MEDIUM finding (in the measured run) says a cause the job did not have: NEVER, STARTED; IO only where the
    workers read DISK_SHARE of their bytes from storage (pages read from the page cache are not IO); the workers' CPUs
    (own-workers-cpu) only where a worker waited for a CPU STARVED_SHARE of the run; a lock only naming PyTorch's
    autograd thread; a wait on a thread only naming it or a worker's thread (the queue's feeder that hands a batch
    over); churn, faults and own-threads-cpu or cpu-contention only at the rates (the main or the autograd thread
    waiting for a CPU CPU_WAIT_SHARE of the run or more); with the main thread's time in next() off its CPU under a
    tenth of the run, no input wait. Every culprit is the job's process or one of its workers. A wait on the workers or
    a process or own-workers-cpu names a worker (its pid, a tid of it, or pt_data_worker). Those naming the workers
    explain no more than the main thread's time in next(); a wait on the autograd thread no more than its time in
    loss.backward(); pageable copies and excess-sync no more than the batch's copy and .item(); host-bound and
    launch-bound no more than its time on a CPU and in loss.backward(); own-threads-cpu and cpu-contention no more than
    the two threads' wait for a CPU; each plus half a second (over the findings' longest window). With the scans' cost
    (`query_overhead_s`: the run's time beyond its steps at the rate measured on the indexed copy) and the main
    thread's time in next() both a third of the run or more, the report leads, said of the job's process, with the
    wait on the loader (an input wait, or own-workers-cpu where true) naming a worker, HIGH where the main thread spent
    half the run or more in next() off its CPU, with a fix on the loader's or the lookup's side (QUERY_FIX: the
    workers, the dataset, an index, the table loaded once or cached), nothing gpu-bound, and the findings naming the
    workers explain at least half the main thread's time in next() off its CPU; and with the workers in the query half
    their time or more, some finding naming a worker (any severity, in the run) says where, in its words or in the code
    behind it (SQL_WORDS: SQLite or its library, SQL, the query or its calls, the scan, the missing index): a report
    that says only that the workers are slow sends the reader to add workers, each of which would scan the table too.
    GPU busy (a step's kernels measured queued) under 40%: the lead is that wait or the host side, nothing gpu-bound;
    80% or more: those explain no more than the GPU's idle time plus half a second. The main thread's sleep outside
    CUDA calls and wait for a CPU are at least its time in next() off its CPU less SHARE_SLACK; its time on a CPU and
    waiting for one, its own clocks'."""
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
    overhead = own["query_overhead_s"]
    assert overhead is not None, "the script did not measure the loop on the indexed copy"
    if overhead >= THIRD * wall and own["wait_share"] >= THIRD:
        _own_lead(top, lead, pid, own)
        c0 = top[0]
        assert on_workers(c0), (c0.summary, c0.culprits, sorted(wpids))
        _high_if(c0, wait_off / wall)
        assert QUERY_FIX.search(" ".join(c0.recommendations)), (c0.summary, c0.recommendations)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds([c for c in on_w if c.root_cause in lead]) >= 0.5 * wait_off, (_said(on_w), own)
        if own["query_share_of_workers"] >= HALF:
            seen = [c for c in _shown(report, truth) if on_workers(c) and SQL_WORDS.search(_words(c))]
            assert seen, (_said(report.chains), own)
    _gpu_busy_rules(top, own, HOST_SIDE | lead | allowed, HOST_SIDE | lead | allowed)
    shares = clocks_agree(report, truth)
    assert shares["sleep_outside_ns"] + shares["cpu_wait_ns"] >= wait_off / wall - SHARE_SLACK, (shares, own)


def check_healthy_pde_producer_process(report: Report, truth: dict, store: Path) -> None:
    """A control: a U-Net PDE surrogate (widths 96-768, 32 fields of 128x128 a step, fp32 without TF32, fused AdamW,
    loss.item() each step its one wait for the GPU: ~100 ms of GPU work a step) fed through a torch.multiprocessing
    Queue(maxsize=6) by a producer process of its own (truth `producer`, `decoys`: forked before the run, its OS name
    the parent's) that simulates each batch with numpy FFTs, busy on a CPU of the job about half the time
    (`producer_busy_share`, `producer_cpu_share`) and blocked in put() the rest: the queue is full, the main thread's
    queue.get() finds a batch ready (`gets_ready_share`). The producer is the decoy: a second process of the job, busy
    on its CPUs, handing the trainer every batch; the loop never waits for it. The job and its producer on CPUs 2-5; no
    threads of the job's own, no workers, no IO, no lock, no sleep; the batch (4 MB) copied from the queue's shared
    memory. No HIGH or MEDIUM finding (in the measured run) says a cause it did not have: NEVER, STARTED (the producer
    was started before the run), IO (only where the run had major page faults); a wait on the producer or workers, the
    workers' CPUs or a spawn only where the producer cost the steps (the main thread in queue.get() a tenth of the run
    or more, or the run's time beyond its steps at the rate of the same loop on one batch kept on the GPU,
    `producer_overhead_s`, KEPT_LOOSE of the run or more), naming the producer; a wait on a thread or a lock naming
    PyTorch's autograd thread, or the producer where it cost the steps; churn, faults and own-threads-cpu or
    cpu-contention only at the rates (the main or the autograd thread waiting for a CPU CPU_WAIT_SHARE of the run or
    more). No culprit outside the job's process but the producer, and the producer only where it cost the steps. The
    job measured itself GPU-bound (busy GPU_BOUND or more) and the producer cost nothing: no HIGH or MEDIUM finding but
    gpu-bound and the churn or page faults the rates make true, none naming the producer (its pid or a tid of it), and
    no finding at all (any severity, in the run) that blames the producer (a wait on it or its CPUs, a spawn, a slow
    consumer: DECOY_BLAME) for more than the main thread's time in queue.get() plus half a second. Any finding naming
    the producer explains no more than its cost (the larger of the two measures) and the main and autograd threads'
    wait for a CPU; a wait on the autograd thread no more than the main thread's time in loss.backward(); host-bound
    and launch-bound no more than its time on a CPU and in loss.backward(); pageable copies no more than the batch's
    copy; excess-sync no more than its .item() time; own-threads-cpu and cpu-contention naming no decoy no more than
    the main and autograd threads' wait for a CPU; each plus half a second. GPU busy under 40% (the premise wrong): the
    lead is the host side or those allowed, nothing gpu-bound; 80% or more: those explain no more than the GPU's idle
    time plus half a second. The main thread's time inside CUDA calls (asleep or spinning in .item()'s wait for the
    GPU) is at least half its .item() share less SHARE_SLACK; its time on a CPU and waiting for one, its own
    clocks'."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    prod = truth["producer"]
    ppid, ptids = prod["pid"], set(prod["tids"]) | {prod["pid"]}
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = _waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _rates(own, waited)
    overhead = own["producer_overhead_s"]
    assert overhead is not None, "the script did not measure the loop without the producer"
    cost = max(overhead, own["get_s"])
    kept = own["wait_share"] < WAITED_SHARE and overhead < KEPT_LOOSE * wall
    absent |= NEVER | STARTED
    absent |= set() if own["major_faults"] else {"io-wait"}
    if kept:
        absent |= (INPUT - THREAD_WAIT) | {"own-workers-cpu"}
    if atid is None and kept:
        absent |= THREAD_WAIT

    def is_decoy(k: Culprit) -> bool:  # not by its name: a forked child keeps its parent's
        return k.pid == ppid or bool(ptids & set(k.tids))

    def on_decoy(c: CausalChain) -> bool:
        return any(is_decoy(k) for k in _people(c))

    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid or (not kept and is_decoy(k)) for c in top for k in _people(c)), \
        [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in DECOY_BLAME:
            ok = on_decoy(c) or (c.root_cause in THREAD_WAIT and on_autograd(c))
            assert ok and (not kept or not on_decoy(c)), (c.summary, c.culprits, ppid)
    blamed = [c for c in top if on_decoy(c)]
    _capped(blamed, {c.root_cause for c in blamed}, cost + _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s"),
            own)
    rest = [c for c in top if not on_decoy(c)]
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(rest, THREAD_WAIT, own["backward_s"], own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(top, {"pageable-copies"}, own["h2d_s"], own)
    _capped(top, {"excess-sync"}, own["item_s"], own)
    _capped(rest, {"own-threads-cpu", "cpu-contention"}, _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s"),
            own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= GPU_BOUND and kept:
        ok = {"gpu-bound"} | (allowed - {"own-threads-cpu"})
        assert all(c.root_cause in ok for c in top), (_said(top), own)
        assert not any(on_decoy(c) for c in top), [(c.summary, c.culprits) for c in top]
        shown = [c for c in _shown(report, truth) if c.root_cause in DECOY_BLAME and on_decoy(c)]
        _capped(shown, DECOY_BLAME, own["get_s"], own)
    lead = HOST_SIDE | (allowed - absent) | (THREAD_WAIT if atid is not None else set()) | (
        set() if kept else DECOY_BLAME - absent)
    _gpu_busy_rules(top, own, lead, lead)
    shares = clocks_agree(report, truth)
    inside = shares["sleep_inside_ns"] + shares["run_inside_ns"]
    assert inside >= 0.5 * own["item_share"] - SHARE_SLACK, (shares, own)


CHECKS_28 = {"natural_weighted_sampler_epochs": check_weighted_sampler_epochs,
             "natural_sqlite_unindexed_getitem": check_sqlite_unindexed_getitem,
             "natural_healthy_pde_producer_process": check_healthy_pde_producer_process}
