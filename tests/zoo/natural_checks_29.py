"""The group natural29 (bench/gpu/zoo/device_zoo.sh natural29): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, by a helper that read no analysis code and no recorded report, from
what each script measures of itself (its truth's `self`) and what it cannot have had. One job is slowed by cuDNN's
benchmark mode timing candidate kernels at every new input shape (multi-scale training with
torch.backends.cudnn.benchmark=True: the main thread and PyTorch's autograd thread in cuDNN's find, the GPU running
trial kernels, synchronisations); one's main thread builds every batch itself (a Dataset over a pyarrow Table sliced
and converted to Python a row at a time, then torch.tensor() over the rows, DataLoader(num_workers=0)); the third is a
GPU-bound control whose DataLoader workers sleep in a simulated remote fetch of every image, the decoys.
tests/zoo/test_zoo_natural.py merges CHECKS_29 into its CHECKS; the ways of reading findings it shares with earlier
groups are natural_shares', natural_checks_22's, natural_checks_23's, natural_checks_25's, natural_checks_26's and
natural_checks_27's."""

from __future__ import annotations

import re
from pathlib import Path

from natural_checks_22 import GPU_BOUND, NEVER, THIRD, THREAD_WAIT, WAITED_SHARE
from natural_checks_22 import _ours, _shown, _waited
from natural_checks_23 import HOST_WORK, OWN_WORK, _autograd, _cpu_cost, _rates
from natural_checks_25 import DECOY_BLAME, _cpu_waits
from natural_checks_26 import KEPT_LOOSE, STARTED, _words
from natural_checks_27 import _high_if
from natural_shares import CPU_WAIT_SHARE, HOST_SIDE, INPUT, SHARE_SLACK, clocks_agree
from natural_shares import capped as _capped, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import own_lead as _own_lead, people as _people, said as _said, seconds as _seconds

from ingero_mcp.analysis.models import CausalChain, Culprit, Report

# What the autotuning at a new input shape may truly be said as: the first launches at a shape not seen before
# (cold-start), the GPU work of a step that grew (gpu-slower: the candidates cuDNN times), the synchronisations of the
# timing (excess-sync), the host's own work building and choosing plans (host-bound, launch-bound); and a wait on
# PyTorch's autograd thread, which autotunes the backward's convolutions (THREAD_WAIT naming it).
AUTOTUNE = {"cold-start", "gpu-slower", "excess-sync", "host-bound", "launch-bound"}
NEW_SHAPE = {"cold-start", "gpu-slower"}  # causes that say what changed at the new shapes' steps, nothing else
# Where the time goes, said in words or in the code behind a finding (its frames): cuDNN, its benchmark mode or find,
# autotuning, new input shapes or sizes, multi-scale inputs. The script's own file name holds "cudnn", "benchmark" and
# "multiscale": it is taken out of the text before the search (a frame in the script says nothing of cuDNN).
AUTOTUNE_WORDS = re.compile(r"cudnn|autotun|auto-tun|benchmark|get_plans_from_find|time_sorted_plan|\bfind\b|"
                            r"new (input )?(shape|size|side|resolution)s?|input (shape|size|side|resolution)s?|"
                            r"(shape|size|resolution)s? (change|var)|multi-?scale|dynamic shape", re.IGNORECASE)
# A fix for it: cuDNN's benchmark mode off, a few fixed sizes or buckets (padding to them), the shapes warmed up or
# tuned once before training.
AUTOTUNE_FIX = re.compile(r"benchmark|cudnn|fixed (input )?(size|shape|side|resolution)|bucket|\bpad|static shape|"
                          r"same (size|shape)|few(er)? (distinct )?(size|shape|side|resolution)s|warm[- ]?up|pre-?tun|"
                          r"tune (them |each )?once", re.IGNORECASE)
CUDNN_SCRIPT = "natural_cudnn_benchmark_multiscale"
# Where the row access is, said in words or in the code behind a finding: pyarrow (libarrow, pyarrow's own frames),
# the slice and its conversion to Python, the Dataset's class or __getitem__, the collate function and its
# torch.tensor() over the rows, the row-at-a-time access. The script's file name holds "arrow": taken out first.
ARROW_WORDS = re.compile(r"arrow|to_pylist|as_py|\bslice\b|ArrowRows|__getitem__|collate|torch\.tensor|tensor\(|"
                         r"per[- ]row|row[- ]by[- ]row|a row at a time|each row|python objects?|python floats?|"
                         r"tensor_new|recursive_store|internal_new_from_data", re.IGNORECASE)
# A fix for it: column-wise or batched access (numpy arrays made once, a take or an index a batch, __getitems__),
# vectorising, caching, or the work moved off the main thread (DataLoader workers).
ARROW_FIX = re.compile(r"vectori[sz]|numpy|to_numpy|\btake\b|__getitems__|column|batch(ed)?[- ](fetch|read|access|"
                       r"gather|index|level)|whole batch|\bonce\b|precomput|\bcach|from_numpy|worker|num_workers|"
                       r"main thread", re.IGNORECASE)
ARROW_SCRIPT = "natural_arrow_row_access_main"


def _words_without(c: CausalChain, script: str) -> str:
    """natural_checks_26's _words (a finding's words and its frames), the job's own file name taken out."""
    return _words(c).replace(script, "")


def check_cudnn_benchmark_multiscale(report: Report, truth: dict, store: Path) -> None:
    """A ResNet-18-style classifier (fp32 without TF32, batch 32 held on the GPU, SGD, loss.item() each step) trained
    on multi-scale batches, YOLOv5's way (a random side of 41, 160-480 px in steps of 8, each batch, the batch resized
    on the GPU), with torch.backends.cudnn.benchmark=True: at every side not seen before each convolution first has
    cuDNN time its candidate kernels (the forward's on the main thread, the backward's on PyTorch's autograd thread,
    truth `autograd`, while the main thread waits in loss.backward()), a synchronisation each, before the step goes
    on. The sides keep appearing through the run (truth `autotune`). One process on CPUs 2-3; no threads of the job's
    own, no workers, no children, no IO, no lock, no sleep; the data on the GPU (no copy from the host). No HIGH or
    MEDIUM finding (in the measured run) says a cause the job did not have: NEVER, a timed sleep, a spawn, a wait on a
    process or workers, the workers' CPUs, IO, pageable copies; churn, faults and own-threads-cpu or cpu-contention
    only at the rates (natural_checks_23's _rates: the main or the autograd thread waiting for a CPU CPU_WAIT_SHARE of
    the run or more); a wait on a thread or a lock only naming the autograd thread. No culprit outside the process.
    cold-start and gpu-slower (what changed at a new shape) explain no more than the new shapes' steps (`new_shape_s`);
    excess-sync no more than those and .item(); a wait on the autograd thread no more than the main thread's time in
    loss.backward(); host-bound and launch-bound no more than its time on a CPU and in loss.backward(); own-threads-cpu
    and cpu-contention no more than the two threads' wait for a CPU; gpu-bound no more than the steps' own GPU time and
    the autotuning's cost; each plus half a second (over the findings' longest window). With the autotuning's cost
    (`autotune_overhead_s`: the new shapes' steps beyond their time at the same side once tuned, measured after the run)
    a third of the run or more, the report leads, said of the job's process, with what the autotuning is (AUTOTUNE, a
    wait on the autograd thread, or the churn, faults or wait for a CPU the rates make true; not gpu-bound: the steps'
    own kernels are not what holds it), HIGH where that cost is half the run or more, and those explain at least half
    that cost; and some finding of those causes (any severity, in the run) of the process says where, in its words or
    in the code behind it (AUTOTUNE_WORDS: cuDNN, its benchmark mode or find, autotuning, new input shapes or sizes,
    multi-scale), with a fix for it (AUTOTUNE_FIX: benchmark off, fixed sizes or buckets, shapes warmed up or tuned
    once): a report that says only "synchronisations" or "the GPU got slower" leaves the reader to hunt for a
    synchronising call the script does not make. GPU busy (the steps' own kernels at their sides, measured queued after
    the run, not the candidates cuDNN timed) under 40%: the lead is that, nothing gpu-bound; 80% or more: those explain
    no more than the GPU's idle time plus half a second. The main thread's time inside CUDA calls is at least half its
    .item() share less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    wall = own["wall_s"]
    waited = _waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _rates(own, waited)
    absent |= NEVER | {"timed-sleep", "spawning-processes", "waiting-on-process", "waiting-on-workers",
                       "own-workers-cpu", "io-wait", "pageable-copies"}
    if atid is None:
        absent |= THREAD_WAIT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in THREAD_WAIT:
            assert on_autograd(c), (c.summary, c.culprits, atid)
    new_s = own["new_shape_s"]
    overhead = own["autotune_overhead_s"]
    assert overhead is not None, "the script did not measure the sides once tuned"
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    _capped(top, NEW_SHAPE, new_s, own)
    _capped(top, {"excess-sync"}, new_s + own["item_s"], own)
    _capped(top, THREAD_WAIT, own["backward_s"], own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, _cpu_waits(own, "main_cpu_wait_s", "autograd_cpu_wait_s"),
            own)
    if own["gpu_busy_s"] is not None:
        _capped(top, {"gpu-bound"}, own["gpu_busy_s"] + overhead, own)
    lead = AUTOTUNE | (THREAD_WAIT if atid is not None else set()) | (allowed - absent)
    if overhead >= THIRD * wall:
        _own_lead(top, lead, pid, own)
        _high_if(top[0], overhead / wall)
        assert _seconds(top, lead) >= 0.5 * overhead, (_said(top), sorted(lead), own)
        said_where = [c for c in _shown(report, truth) if c.root_cause in lead and _ours(c, pid)
                      and AUTOTUNE_WORDS.search(_words_without(c, CUDNN_SCRIPT))]
        assert said_where, (_said(report.chains), own)
        assert any(AUTOTUNE_FIX.search(" ".join(c.recommendations)) for c in said_where), \
            [(c.summary, c.recommendations) for c in said_where]
    _gpu_busy_rules(top, own, lead | HOST_SIDE, lead | HOST_SIDE)
    shares = clocks_agree(report, truth)
    inside = shares["sleep_inside_ns"] + shares["run_inside_ns"]
    assert inside >= 0.5 * own["item_share"] - SHARE_SLACK, (shares, own)


def check_arrow_row_access_main(report: Report, truth: dict, store: Path) -> None:
    """A tabular MLP (64-2048-2048-2048-100 with LayerNorm, fp32 without TF32, fused AdamW, batch 512, loss.item() each
    step: a millisecond or two of GPU work) trained from an in-memory pyarrow Table (300,000 rows, a list<float> column
    of 64 and a label) through a Dataset (truth `dataset`: ArrowRows.__getitem__) that does
    `self.table.slice(i, 1).to_pylist()[0]` for every row and a collate function that calls torch.tensor() over the
    rows' lists of Python floats, DataLoader(num_workers=0): every batch made on the main thread inside next(), in
    Arrow's C++ and Python object conversion, then PyTorch's C++ walking 32,768 floats; the GPU waits. One process on
    CPUs 2-3, no threads of the job's own (truth `threads` lists the process's), no workers, no children, no IO (the
    table is built in memory before the run), no lock, no sleep; every batch has the same shape. Read as
    natural_checks_23's _cpu_cost says: no HIGH or MEDIUM finding says a cause the job did not have (NEVER, STEADY: no
    worker to wait on, nothing started in the run; IO), churn, faults or a wait for a CPU only at the rates, a wait on a
    thread only naming the autograd thread, nothing blamed outside the process; the findings' seconds within the job's
    own clocks; with the cost the run's time beyond its steps at the rate measured with the fix (the feature column one
    numpy array made once, a batch gathered with one index: `arrow_overhead_s`) a third of the run or more, the lead
    said of the process is the main thread's own work (host-bound, or what the rates make true), nothing gpu-bound,
    explaining at least half that cost; with the row access and the conversion (`getitem_s` and `collate_s`) a tenth of
    the run or more some finding says host-bound of the process; GPU busy under 40% the lead is that own work, 80% or
    more the host side no more than the GPU's idle time; the main thread's time running outside CUDA calls at least the
    row access's CPU time (`getitem_cpu_share`) less SHARE_SLACK. The copies and synchronising calls are the batch's
    copy and .item() (`h2d_s`, `item_s`). Besides: launch-bound explains no more than the main thread's time queueing
    the step and in loss.backward() (`step_s`, `backward_s`) plus half a second (the work is not issuing kernels); no
    HIGH or MEDIUM finding (in the run) names a DataLoader worker (there is none: pt_data_worker); with the cost half
    the run or more the lead is HIGH; and with it a third or more, some host-bound finding of the process (any severity,
    in the run) says where, in its words or in the code behind it (ARROW_WORDS: pyarrow, the slice and to_pylist, the
    Dataset's class or __getitem__, the collate function and torch.tensor(), row-at-a-time access), with a fix for it
    (ARROW_FIX: columnar or batched access, numpy arrays made once, caching, or DataLoader workers): a report that says
    only "the main thread is busy in Python" leaves the reader to profile the job again."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    overhead = own["arrow_overhead_s"]
    _cpu_cost(report, truth, overhead, own["getitem_s"] + own["collate_s"], own["getitem_cpu_share"],
              own["h2d_s"] + own["item_s"])
    top = _in_run(report, truth)
    _capped(top, {"launch-bound"}, own["step_s"] + own["backward_s"], own)
    assert not any((k.comm or "").startswith("pt_data_worker") for c in top for k in _people(c)), \
        [(c.summary, c.culprits) for c in top]
    wall = own["wall_s"]
    if overhead >= THIRD * wall:
        _high_if(top[0], overhead / wall)
        seen = [c for c in _shown(report, truth) if c.root_cause in OWN_WORK and _ours(c, pid)
                and ARROW_WORDS.search(_words_without(c, ARROW_SCRIPT))]
        assert seen, (_said(report.chains), own)
        assert any(ARROW_FIX.search(" ".join(c.recommendations)) for c in seen), \
            [(c.summary, c.recommendations) for c in seen]


def check_healthy_sleepy_fetch_workers(report: Report, truth: dict, store: Path) -> None:
    """A control: a ViT-B/16 classifier (64 images of 224 px a step, normalised on the GPU, fp32 without TF32, fused
    AdamW, loss.item() each step its one wait for the GPU: ~100 ms of GPU work a step) fed by DataLoader(num_workers=8,
    pin_memory=True, persistent_workers=True, prefetch_factor=4) over an infinite random sampler, whose workers (truth
    `workers`) sleep in a simulated rate-limited remote fetch of every image (truth `fetch`: time.sleep a sample, sized
    so that the workers sleep about half the run, `workers_sleep_share`) and PyTorch's pin-memory thread (truth
    `pin_thread`) pins each batch; truth `decoys` lists them. The loader keeps ~32 batches ready: the main thread's
    next() returns at once. The main process and its workers on CPUs 2-7, no threads of the job's own, no children but
    the workers (started before the run), no IO (the images are in memory), no lock; the sleeps are the workers' alone
    (the main thread never sleeps of its own). No HIGH or MEDIUM finding (in the measured run) says a cause it did not
    have: NEVER, a slower GPU, a spawn, a cold start, pageable copies (the batches are pinned), IO (only where the run
    had major page faults); a timed sleep, a wait on the workers or a process or the workers' CPUs only where the
    loader cost the steps (the main thread in next() a tenth of the run or more, or the run's time beyond its steps at
    the rate of the same loop on one batch kept on the GPU, `loader_overhead_s`, KEPT_LOOSE of the run or more), naming
    a decoy; a wait on a thread or a lock naming PyTorch's autograd thread, or a decoy where the loader cost the steps;
    churn, faults and own-threads-cpu or cpu-contention only at the rates (the main, autograd or pin-memory thread
    waiting for a CPU CPU_WAIT_SHARE of the run or more). No culprit outside the job's process but the workers, and the
    workers only where the loader cost the steps. The job measured itself GPU-bound (busy GPU_BOUND or more) and the
    loader cost nothing: no HIGH or MEDIUM finding but gpu-bound and the churn or page faults the rates make true, none
    naming a decoy (a worker's pid or tids or pt_data_worker, the pin-memory thread's tid or pt_data_pin). Any finding
    naming a decoy explains no more than the main thread's time in next() and its and the autograd thread's wait for a
    CPU; a wait on the autograd thread no more than the main thread's time in loss.backward(); host-bound and
    launch-bound no more than its time on a CPU and in loss.backward(); excess-sync no more than its .item() time;
    own-threads-cpu and cpu-contention naming no decoy no more than the main and autograd threads' wait for a CPU; each
    plus half a second. GPU busy under 40% (the premise wrong): the lead is the host side or those allowed, nothing
    gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second. The main thread's time
    inside CUDA calls (asleep or spinning in .item()'s wait, or in launches behind a full queue) is at least half its
    .item() share less SHARE_SLACK; its time on a CPU and waiting for one, its own clocks'."""
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
    absent |= NEVER | (STARTED - {"timed-sleep"}) | {"pageable-copies"}
    absent |= set() if own["major_faults"] else {"io-wait"}
    if kept:
        absent |= (INPUT - THREAD_WAIT) | {"own-workers-cpu", "timed-sleep"}
    if atid is None and kept:
        absent |= THREAD_WAIT
    decoy_blame = DECOY_BLAME | {"timed-sleep"}

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
        if c.root_cause in decoy_blame:
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
        set() if kept else decoy_blame - absent)
    _gpu_busy_rules(top, own, lead, lead)
    shares = clocks_agree(report, truth)
    inside = shares["sleep_inside_ns"] + shares["run_inside_ns"]
    assert inside >= 0.5 * own["item_share"] - SHARE_SLACK, (shares, own)


CHECKS_29 = {"natural_cudnn_benchmark_multiscale": check_cudnn_benchmark_multiscale,
             "natural_arrow_row_access_main": check_arrow_row_access_main,
             "natural_healthy_sleepy_fetch_workers": check_healthy_sleepy_fetch_workers}
