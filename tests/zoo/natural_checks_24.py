"""The group natural24 (bench/gpu/zoo/device_zoo.sh natural24): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_24 into its CHECKS; the ways of reading findings it
shares with groups 8 to 21 are natural_shares', and those natural22's and natural23's checks defined, theirs."""

from __future__ import annotations

from pathlib import Path

from natural_checks_22 import GPU_BOUND, NEVER, STEADY, THIRD, THREAD_WAIT, WAITED_SHARE
from natural_checks_22 import _ours, _shown, _waited
from natural_checks_23 import COPIES, HOST_WORK, _autograd, _cpu_cost, _rates
from natural_shares import CPU_WAIT_SHARE, HOST_SIDE, INPUT, SHARE_SLACK, clocks_agree
from natural_shares import capped as _capped, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import own_lead as _own_lead, people as _people, said as _said, seconds as _seconds

from ingero_mcp.analysis.models import Report

# What the hooks' job is: the main thread's own work on the CPU (the histograms: PyTorch's CPU kernel), its copies of
# the activations to pageable memory and its reads of two scalars a layer (a synchronisation each): any of them is
# true of it, and the lead may be any (not a launch: it queues few kernels; not a wait on a thread).
STATS_WORK = {"host-bound", "pageable-copies", "excess-sync"}
COPIES_SHOWN = 0.2  # the activations' copies this share of the run or more: the copies are worth naming


def check_bpe_collate_main_thread(report: Report, truth: dict, store: Path) -> None:
    """A GPT-2-small (12 layers, d 768, 8 x 1,024 tokens, bf16, fused AdamW, loss.item() each step) trained from a
    DataLoader with num_workers=0 (the default) whose collate function encodes each batch's raw documents with a
    pure-Python BPE tokenizer (minbpe's RegexTokenizer.encode: a regex split, then for every chunk a Python loop of
    get_stats, min over the merges and merge) on the main thread, pads, stacks and copies the ids (64 KB, pageable) to
    the GPU. One process on CPUs 2-3, no threads of its own, no workers (the loader's work is the main thread's), no
    children, no IO, no lock, no sleep; every batch has the same shape. Read as natural_checks_23's _cpu_cost says: no
    HIGH or MEDIUM finding says a cause the job did not have (NEVER, STEADY: no worker to wait on, IO), churn, faults or
    a wait for a CPU only at the rates, a wait on a thread only naming the autograd thread, nothing blamed outside the
    process; the findings' seconds within the job's own clocks; with the cost the run's time beyond its steps at the
    rate measured from ids tokenised once (`encode_overhead_s`) a third of the run or more, the lead said of the process
    is the main thread's own work (host-bound, or what the rates make true), nothing gpu-bound, explaining at least half
    that cost; with the encoding (`encode_s`) a tenth of the run or more some finding says host-bound of the process;
    GPU busy under 40% the lead is that own work, 80% or more the host side no more than the GPU's idle time; the main
    thread's time running outside CUDA calls at least the encoding's CPU time (`encode_cpu_share`) less SHARE_SLACK. The
    copies and synchronising calls are the batch's copy and .item() (`h2d_s`, `item_s`)."""
    own = truth["self"]
    _cpu_cost(report, truth, own["encode_overhead_s"], own["encode_s"], own["encode_cpu_share"],
              own["h2d_s"] + own["item_s"])


def check_activation_hist_hooks(report: Report, truth: dict, store: Path) -> None:
    """A 6-layer CNN (fp32 without TF32, 128 CIFAR-size images a step held on the GPU, SGD, loss.item() each step) with
    fast.ai's append_stats forward hook on each of its 9 children: per layer and step outp.data.mean().cpu() and
    outp.data.std().cpu() (two synchronisations, the first waiting for the layer's kernels), outp.data.cpu() (the whole
    activation copied to pageable host memory: megabytes) and .histc(40, 0, 10) on the CPU (PyTorch's CPU kernel, the
    main thread). One process on CPUs 2-3, no threads of its own, no workers, no children, no IO, no lock, no sleep;
    the shapes never change. No HIGH or MEDIUM finding (in the measured run) says a cause the job did not have: NEVER,
    STEADY, IO; churn only at the rates (cudaMalloc CUDA_MALLOCS_PER_S, cudaHostAlloc HOST_ALLOCS_PER_S a second),
    page faults only at PAGE_FAULTS_PER_S; own-threads-cpu and cpu-contention only where the main thread or the
    autograd thread waited for a CPU CPU_WAIT_SHARE of the run or more; a wait on a thread or a lock only naming
    PyTorch's autograd thread (the main thread's wait in loss.backward()). No culprit outside the process. A wait on the
    autograd thread explains no more than the main thread's time in loss.backward(); the copies and synchronisations
    (pageable-copies, excess-sync) no more than its time in the hooks' copies and scalar reads and in .item()
    (`copy_s`, `sync_s`, `item_s`); host-bound and launch-bound no more than its time on a CPU and in loss.backward();
    own-threads-cpu and cpu-contention no more than the two threads' wait for a CPU; each plus half a second (over the
    findings' longest window). With the statistics' cost (`stats_overhead_s`: the run's time beyond its steps at the
    rate measured with the same statistics kept on the GPU) a third of the run or more, the report leads, said of the
    job's process, with what that cost is: host-bound, pageable-copies or excess-sync (or the churn, faults or wait for
    a CPU the rates make true), nothing gpu-bound, and those explain at least half that cost. With the histograms on the
    CPU (`histc_s`) a tenth of the run or more, some finding (any severity, in the run) says host-bound of the process;
    with the activations' copies (`copy_s`) COPIES_SHOWN of the run or more, some finding says pageable-copies or
    excess-sync of it. GPU busy (a step's kernels without the hooks, measured queued) under 40%: the lead is that work,
    nothing gpu-bound; 80% or more: the host side explains no more than the GPU's idle time plus half a second. The main
    thread's time running outside CUDA calls is at least the histograms' CPU time (`histc_cpu_share`) less SHARE_SLACK;
    its time inside CUDA calls (running or asleep) at least half its share in the copies and scalar reads less
    SHARE_SLACK; its time on a CPU and waiting for one is its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    waited = _waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _rates(own, waited)
    absent |= NEVER | STEADY | {"io-wait"}
    if atid is None:
        absent |= THREAD_WAIT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in THREAD_WAIT:
            assert on_autograd(c), (c.summary, c.culprits, atid)
    wall = own["wall_s"]
    main_run = own["main_run_s"] if own["main_run_s"] is not None else wall
    copies_s = own["copy_s"] + own["sync_s"] + own["item_s"]
    _capped(top, THREAD_WAIT, own["backward_s"], own)
    _capped(top, COPIES, copies_s, own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"},
            (own["main_cpu_wait_s"] or 0.0) + (own.get("autograd_cpu_wait_s") or 0.0), own)
    lead = STATS_WORK | (allowed - absent)
    overhead = own["stats_overhead_s"]
    assert overhead is not None, "the script did not measure the steps with the statistics on the GPU"
    if overhead >= THIRD * wall:
        _own_lead(top, lead, pid, own)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds(top, lead) >= 0.5 * overhead, (_said(top), sorted(lead), own)
    shown = _shown(report, truth)
    if own["histc_s"] >= WAITED_SHARE * wall:
        host = [c for c in shown if c.root_cause == "host-bound" and _ours(c, pid)]
        assert host, (_said(report.chains), own)
    if own["copy_s"] >= COPIES_SHOWN * wall:
        copies = [c for c in shown if c.root_cause in COPIES and _ours(c, pid)]
        assert copies, (_said(report.chains), own)
    _gpu_busy_rules(top, own, lead, HOST_SIDE | allowed | STATS_WORK)
    shares = clocks_agree(report, truth)
    assert shares["run_outside_ns"] >= own["histc_cpu_share"] - SHARE_SLACK, (shares, own)
    inside = shares["sleep_inside_ns"] + shares["run_inside_ns"]
    assert inside >= 0.5 * (own["copy_share"] + own["sync_share"]) - SHARE_SLACK, (shares, own)


def check_healthy_gpu_hook_stats(report: Report, truth: dict, store: Path) -> None:
    """A control: a ResNet-18-style classifier (fp32 without TF32, 256 images of 3x64x64 a step held on the GPU, SGD
    with Nesterov, OneCycleLR, loss.item() each step) with a decoy: forward hooks on 49 modules that add each
    activation's mean, mean square and a 40-bin torch.histc (on the GPU, its range given) into accumulators on the GPU,
    with nothing read back, and every 2 s one small read-back of those accumulators (a synchronisation) and a printed
    line. Per step the hooks queue a few hundred small kernels and a few milliseconds of the main thread's Python behind
    tens of milliseconds of convolutions. One process on CPUs 2-3, no threads of its own, no workers, no children, no
    lock, no sleep, no IO but its printed lines (stdout to a file). No HIGH or MEDIUM finding (in the measured run) says
    a cause it did not have: NEVER, STEADY, an input wait, pageable copies (the read-backs are 8 KB every 2 s and
    .item()'s 4 bytes), IO (only where the run had major page faults); churn only at the rates (cudaMalloc
    CUDA_MALLOCS_PER_S, cudaHostAlloc HOST_ALLOCS_PER_S a second), page faults only at PAGE_FAULTS_PER_S;
    own-threads-cpu and cpu-contention only where the main thread or the autograd thread waited for a CPU CPU_WAIT_SHARE
    of the run or more; a wait on a thread or a lock only naming PyTorch's autograd thread. No culprit outside the
    process. A wait on the autograd thread explains no more than the main thread's time in loss.backward(); excess-sync
    no more than its time in .item() and the read-backs; host-bound and launch-bound no more than its time on a CPU and
    in loss.backward(); own-threads-cpu and cpu-contention no more than the two threads' wait for a CPU; each plus half
    a second (over the findings' longest window). The job measured itself GPU-bound (busy GPU_BOUND or more: a step's
    kernels with the hooks', measured queued in two parts): no HIGH or MEDIUM finding but gpu-bound and the churn or
    page faults the rates make true, none blaming the host (its hooks, its work, its synchronisations, its waits on the
    autograd thread or for the GPU). GPU busy under 40% (the premise wrong): the lead is the host side or those allowed,
    nothing gpu-bound; 80% or more: those explain no more than the GPU's idle time plus half a second. The main thread's
    time inside CUDA calls (asleep or spinning in .item()'s wait for the GPU) is at least half its .item() share less
    SHARE_SLACK; its time on a CPU and waiting for one is its own clocks' (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    waited = _waited(own["main_cpu_wait_share"]) or (own.get("autograd_cpu_wait_share") or 0.0) >= CPU_WAIT_SHARE
    absent, allowed = _rates(own, waited)
    absent |= NEVER | STEADY | (INPUT - THREAD_WAIT) | {"pageable-copies"}
    absent |= set() if own["major_faults"] else {"io-wait"}
    if atid is None:
        absent |= THREAD_WAIT
    assert not any(c.root_cause in absent for c in top), (_said(top), own)
    assert all(k.pid == pid for c in top for k in _people(c)), [(c.summary, c.culprits) for c in top]
    for c in top:
        if c.root_cause in THREAD_WAIT:
            assert on_autograd(c), (c.summary, c.culprits, atid)
    main_run = own["main_run_s"] if own["main_run_s"] is not None else own["wall_s"]
    _capped(top, THREAD_WAIT, own["backward_s"], own)
    _capped(top, {"excess-sync"}, own["item_s"] + own["readback_s"], own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"},
            (own["main_cpu_wait_s"] or 0.0) + (own.get("autograd_cpu_wait_s") or 0.0), own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= GPU_BOUND:
        ok = {"gpu-bound"} | (allowed - {"own-threads-cpu"})
        assert all(c.root_cause in ok for c in top), (_said(top), own)
    lead = HOST_SIDE | (allowed - absent) | (THREAD_WAIT if atid is not None else set())
    _gpu_busy_rules(top, own, lead, lead)
    shares = clocks_agree(report, truth)
    inside = shares["sleep_inside_ns"] + shares["run_inside_ns"]
    assert inside >= 0.5 * own["item_share"] - SHARE_SLACK, (shares, own)


CHECKS_24 = {"natural_bpe_collate_main_thread": check_bpe_collate_main_thread,
             "natural_activation_hist_hooks": check_activation_hist_hooks,
             "natural_healthy_gpu_hook_stats": check_healthy_gpu_hook_stats}
