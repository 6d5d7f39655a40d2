"""The group natural23 (bench/gpu/zoo/device_zoo.sh natural23): three jobs with nothing staged, whose checks were
written before the jobs were recorded or read, from what each script measures of itself (its truth's `self`) and what
it cannot have had. tests/zoo/test_zoo_natural.py merges CHECKS_23 into its CHECKS; the ways of reading findings it
shares with groups 8 to 21 are natural_shares', and those natural22's checks defined, natural_checks_22's."""

from __future__ import annotations

from pathlib import Path

from natural_checks_22 import GPU_BOUND, NEVER, STEADY, THIRD, THREAD_WAIT, WAITED_SHARE
from natural_checks_22 import _by_rates, _ours, _shown, _waited
from natural_shares import CHURN, CPU_WAIT_SHARE, HOST_ALLOCS_PER_S, HOST_SIDE, INPUT, SHARE_SLACK, clocks_agree
from natural_shares import capped as _capped, gpu_busy_rules as _gpu_busy_rules, in_run as _in_run
from natural_shares import own_lead as _own_lead, people as _people, said as _said, seconds as _seconds

from ingero_mcp.analysis.models import CausalChain, Report

HOST_WORK = {"host-bound", "launch-bound"}  # the thread's own running, said as its code or as issuing kernels
# The two host-cost jobs' cost is the main thread's own work on the CPU (torch's CPU kernels, Python and numpy), not
# its launches, its copies or its waits: the lead that says it is host-bound.
OWN_WORK = {"host-bound"}
COPIES = {"pageable-copies", "excess-sync"}  # the step's copies and synchronising calls


def _rates(own: dict, waited: bool) -> tuple[set[str], set[str]]:
    """natural_checks_22's (absent, allowed) by the truth's rates, the caching host allocator's cudaHostAlloc calls
    (HOST_ALLOCS_PER_S) counted as churn too."""
    absent, allowed = _by_rates(own, waited)
    if (own.get("host_allocs_per_s") or 0.0) >= HOST_ALLOCS_PER_S:
        absent, allowed = absent - CHURN, allowed | CHURN
    return absent, allowed


def _autograd(truth: dict):
    """(the autograd thread's tid or None, a test of whether a finding names it)."""
    atid = (truth.get("autograd") or {}).get("tid")

    def on_autograd(c: CausalChain) -> bool:
        return any((atid is not None and atid in k.tids) or (k.comm or "").startswith("pt_autograd")
                   for k in _people(c))

    return atid, on_autograd


def _cpu_cost(report: Report, truth: dict, overhead: float | None, cost_s: float, cost_cpu_share: float,
              copies_s: float) -> None:
    """What the two jobs whose main thread works on the CPU in every step share (check_word2vec_cpu_negatives and
    check_triplet_mining_cpu say each one's numbers): no HIGH or MEDIUM finding (in the measured run) says a cause the
    job did not have: NEVER, STEADY, IO; churn only at the rates (cudaMalloc CUDA_MALLOCS_PER_S, cudaHostAlloc
    HOST_ALLOCS_PER_S a second), page faults only at PAGE_FAULTS_PER_S; own-threads-cpu and cpu-contention only where
    the main thread or the autograd thread waited for a CPU CPU_WAIT_SHARE of the run or more; a wait on a thread or a
    lock only naming PyTorch's autograd thread (the main thread's wait in loss.backward()). No culprit outside the
    process. A wait on the autograd thread explains no more than the main thread's time in loss.backward(); the copies
    and synchronisations (pageable-copies, excess-sync) no more than its time in the step's copies and synchronising
    calls (`copies_s`); host-bound and launch-bound no more than its time on a CPU and in loss.backward();
    own-threads-cpu and cpu-contention no more than the two threads' wait for a CPU; each plus half a second (over the
    findings' longest window). With the CPU work's cost (`overhead`: the run's time beyond its steps at the rate of the
    fix, measured before the run) a third of the run or more, the report leads, said of the job's process, with the
    main thread's own work (host-bound, or the churn, faults or wait for a CPU the rates make true; not a copy, a
    synchronisation, a launch or a wait), nothing gpu-bound, and those explain at least half that cost. With the CPU
    work (`cost_s`) a tenth of the run or more, some finding (any severity, in the run) says host-bound of the process.
    GPU busy (a step's kernels measured queued) under 40%: the lead is that own work, nothing gpu-bound; 80% or more:
    the host side explains no more than the GPU's idle time plus half a second. The main thread's time running outside
    CUDA calls is at least the CPU work's CPU time (`cost_cpu_share`) less SHARE_SLACK; its time on a CPU and waiting
    for one is its own clocks' (SHARE_SLACK)."""
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
    _capped(top, THREAD_WAIT, own["backward_s"], own)
    _capped(top, COPIES, copies_s, own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"},
            (own["main_cpu_wait_s"] or 0.0) + (own.get("autograd_cpu_wait_s") or 0.0), own)
    lead = OWN_WORK | (allowed - absent)
    assert overhead is not None, "the script did not measure the steps with the fix"
    if overhead >= THIRD * wall:
        _own_lead(top, lead, pid, own)
        assert not any(c.root_cause == "gpu-bound" for c in top), (_said(top), own)
        assert _seconds(top, lead) >= 0.5 * overhead, (_said(top), sorted(lead), own)
    if cost_s >= WAITED_SHARE * wall:
        host = [c for c in _shown(report, truth) if c.root_cause in OWN_WORK and _ours(c, pid)]
        assert host, (_said(report.chains), own)
    _gpu_busy_rules(top, own, lead, HOST_SIDE | allowed)
    shares = clocks_agree(report, truth)
    assert shares["run_outside_ns"] >= cost_cpu_share - SHARE_SLACK, (shares, own)


def check_word2vec_cpu_negatives(report: Report, truth: dict, store: Path) -> None:
    """word2vec SGNS (vocabulary 300,000, dimension 300, dense embeddings, Adam, 4,096 centre words with 4 context words
    each, pairs held on the GPU) whose module draws 5 negatives per context word every step with torch.multinomial over
    the unigram^0.75 table kept as a CPU tensor (81,920 draws by binary search in a cumulative table of 300,000: the
    main thread's own work in PyTorch's CPU kernels), then copies them to the GPU (655 KB, pageable), and reads the
    loss with loss.item() each step. One process on CPUs 2-3, no threads of its own, no workers, no children, no IO,
    no lock, no sleep. Read as _cpu_cost says, with the cost the run's time beyond its steps at the rate measured with
    the table on the GPU (`sampling_overhead_s`), the CPU work the sampling (`sample_s`, its CPU time
    `sample_cpu_share`) and the copies and synchronising calls the negatives' copy and .item() (`h2d_s`, `item_s`)."""
    own = truth["self"]
    _cpu_cost(report, truth, own["sampling_overhead_s"], own["sample_s"], own["sample_cpu_share"],
              own["h2d_s"] + own["item_s"])


def check_triplet_mining_cpu(report: Report, truth: dict, store: Path) -> None:
    """A ResNet-18-style embedding net (fp32 without TF32, 32 identities x 4 images of 3x128x64 a batch, held on the
    GPU) trained with siamese-triplet's OnlineTripletLoss, whose selector copies the embeddings and labels to the host
    (embeddings.cpu() waiting for the forward), computes the distance matrix with torch CPU ops and loops in Python over
    the 192 anchor-positive pairs with torch indexing and numpy (a random hard negative each), then copies the
    triplets to the GPU; the triplet loss, the backward, Adam and loss.item() follow. The GPU idles while the CPU mines.
    One process on CPUs 2-3, no threads of its own, no workers, no children, no IO, no lock, no sleep. Read as _cpu_cost
    says, with the cost the run's time beyond its steps at the rate measured with batch-hard mining on the GPU
    (`mining_overhead_s`), the CPU work the mining (`select_s`, its CPU time `select_cpu_share`) and the copies and
    synchronising calls the sampler's index copies, the selector's copies to the host, the triplets' copy and .item()
    (`sample_s`, `d2h_s`, `h2d_s`, `item_s`: their waits for the forward in them)."""
    own = truth["self"]
    _cpu_cost(report, truth, own["mining_overhead_s"], own["select_s"], own["select_cpu_share"],
              own["sample_s"] + own["d2h_s"] + own["h2d_s"] + own["item_s"])


def check_healthy_nanogpt_memmap(report: Report, truth: dict, store: Path) -> None:
    """A control: nanoGPT's GPT-2 (124M: 12 layers, d 768, 12 x 1024 tokens a micro-step, bf16, flash attention, fused
    AdamW, 5 micro-steps an iteration, clip_grad_norm_, loss.item() and a print every iteration) with its get_batch as
    it is: np.memmap of the token file opened anew for every batch (a mapping made and unmapped, minor page faults on
    the page cache's pages), 24 slices turned into int64 and stacked, pinned and copied with non_blocking=True, the next
    batch fetched behind each forward. One process on CPUs 2-3, no threads of its own, no workers, no children, no lock,
    no sleep; the token file was written at set-up (the page cache). No HIGH or MEDIUM finding (in the measured run)
    says a cause it did not have: NEVER, STEADY, an input wait, pageable copies (the batches are pinned; .item() reads
    4 bytes), IO (only where the run had major page faults); churn only at the rates (cudaMalloc CUDA_MALLOCS_PER_S,
    cudaHostAlloc HOST_ALLOCS_PER_S a second), page faults only at PAGE_FAULTS_PER_S; own-threads-cpu and
    cpu-contention only where the main thread waited for a CPU CPU_WAIT_SHARE of the run or more; a wait on a thread or
    a lock only naming PyTorch's autograd thread. No culprit outside the process. A wait on the autograd thread explains
    no more than the main thread's time in loss.backward(); excess-sync no more than its .item() time; host-bound and
    launch-bound no more than its time on a CPU and in loss.backward(); page faults no more than its time in get_batch;
    own-threads-cpu and cpu-contention no more than its wait for a CPU; each plus half a second (over the findings'
    longest window). The job measured itself GPU-bound (busy GPU_BOUND or more: an iteration's kernels, measured queued
    in parts): no HIGH or MEDIUM finding but gpu-bound and the churn or page faults the rates make true, none of them
    blaming the host (its work, its copies, its waits on the autograd thread or for the GPU). GPU busy under 40% (the
    premise wrong): the lead is the host side or those allowed, nothing gpu-bound; 80% or more: those explain no more
    than the GPU's idle time plus half a second. The main thread's time on a CPU and waiting for one is its own clocks'
    (SHARE_SLACK)."""
    own, pid = truth["self"], truth["feeder"]["pid"]
    atid, on_autograd = _autograd(truth)
    top = _in_run(report, truth)
    waited = _waited(own["main_cpu_wait_share"])
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
    _capped(top, {"excess-sync"}, own["item_s"], own)
    _capped(top, HOST_WORK, main_run + own["backward_s"], own)
    _capped(top, {"page-faults"}, own["get_batch_s"], own)
    _capped(top, {"own-threads-cpu", "cpu-contention"}, own["main_cpu_wait_s"] or 0.0, own)
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy >= GPU_BOUND:
        ok = {"gpu-bound"} | (allowed - {"own-threads-cpu"})
        assert all(c.root_cause in ok for c in top), (_said(top), own)
    lead = HOST_SIDE | (allowed - absent) | (THREAD_WAIT if atid is not None else set())
    _gpu_busy_rules(top, own, lead, lead)
    clocks_agree(report, truth)


CHECKS_23 = {"natural_word2vec_cpu_negatives": check_word2vec_cpu_negatives,
             "natural_triplet_mining_cpu": check_triplet_mining_cpu,
             "natural_healthy_nanogpt_memmap": check_healthy_nanogpt_memmap}
