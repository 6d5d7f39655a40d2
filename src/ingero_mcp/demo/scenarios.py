"""Synthetic trace scenarios: each one a host problem that a real collector would record, with its ground truth.

`generate(name, db)` writes a complete session through `TraceWriter` (no root, no GPU): every
table filled as the collector fills it. `EXPECTED[name]` says which causal chain the analysis
must give for it (the root cause, the culprit, the window), so the scenarios are test fixtures as well as
the `ingero-mcp demo` command. `scale` stretches the trace in time (events grow linearly), which
is how the benchmarks make 1M- and 10M-event traces.
"""

from __future__ import annotations

import math
from itertools import pairwise
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ingero_mcp.demo.synth import (
    MS,
    SEC,
    T0_NS,
    US,
    Calls,
    OpSpec,
    Proc,
    TraceBuilder,
    Wakers,
    irq_waker,
    lognormal,
    loop_calls,
    pick,
    task_waker,
)
from ingero_mcp.store import TraceWriter

GiB = 1 << 30
MiB = 1 << 20
CHUNK_NS = 60 * SEC  # calls are generated a minute of trace at a time, to bound memory


@dataclass(frozen=True)
class Expected:
    """Ground truth of a scenario: what is staged, and what a report on it must say."""

    op: str  # the CUDA op the staged problem shows on (its tail or its total)
    pid: int  # the process making those calls (the job)
    cause: str  # short id of the staged problem
    root_cause: str  # the root-cause id (analysis/recommend.py) the report's top HIGH/MEDIUM chain must give
    window_s: tuple[float, float]  # when the problem is staged, seconds since the trace start (scale 1)
    competitor: str | None = None  # the culprit the chain must name: its comm, or "<pid>" when comms tie
    description: str = ""


EXPECTED: dict[str, Expected] = {
    "dataloader": Expected(
        op="cudaStreamSynchronize", pid=4100, cause="cpu-contention", root_cause="own-workers-cpu",
        window_s=(0.0, 30.0), competitor="pt_data_worker",
        description="4 DataLoader workers + the main thread on 4 CPUs: the main thread waits for a CPU behind its "
        "own workers, inside its calls and after every wakeup (CPU 100 %, GPU ~15 %).",
    ),
    "cold-start": Expected(
        op="cudaMalloc", pid=5300, cause="cold-start", root_cause="cold-start", window_s=(1.2, 3.5),
        description="A server starts inside the trace: its first cudaMalloc (context creation) takes "
        "~1.4 s and the first launch of each kernel ~2-25 ms (lazy module loading); then all is normal.",
    ),
    "memcpy-bottleneck": Expected(
        op="cudaMemcpy", pid=6100, cause="memcpy-bandwidth", root_cause="pageable-copies", window_s=(0.0, 30.0),
        description="Each step copies a 256 MiB batch host-to-device from pageable memory at ~3 GB/s "
        "with a synchronous cudaMemcpy; the thread sleeps (blocked), it is not preempted.",
    ),
    "allocator-spike": Expected(
        op="cudaMalloc", pid=7100, cause="page-alloc-storm", root_cause="allocator-churn", window_s=(1.0, 2.0),
        description="Every 5 s (from +1 s) the caching allocator is emptied and refilled: bursts of cudaMalloc "
        "calls of 20-60 ms, each with tens of thousands of page allocations during the call.",
    ),
    "cpu-contention": Expected(
        op="cudaStreamSynchronize", pid=8100, cause="cpu-contention", root_cause="cpu-contention",
        window_s=(8.0, 22.0), competitor="ffmpeg",
        description="An unrelated ffmpeg transcode (not traced) takes all 4 CPUs for the middle half of "
        "the trace; the inference loop's calls made then are preempted by it.",
    ),
    "gpu-shared": Expected(
        op="cudaStreamSynchronize", pid=9100, cause="gpu-shared", root_cause="gpu-shared", window_s=(3.4, 4.0),
        competitor="9200",
        description="A second process (serve.py) runs inference bursts (0.6 s every 4 s) on the same GPU; the "
        "trainer's syncs wait for the GPU (blocked, no preemption, CPUs idle).",
    ),
}

SCENARIOS: tuple[str, ...] = tuple(EXPECTED)

_SYSTEM = [
    (1, 0, "systemd", "/sbin/init", 2.0, 40.0),
    (190, 2, "kworker/u8:2", "", 35.0, 0.0),
    (812, 1, "sshd", "sshd: /usr/sbin/sshd -D", 3.0, 20.0),
    (905, 1, "containerd", "/usr/bin/containerd", 25.0, 60.0),
    (1210, 1, "nvidia-persiste", "/usr/bin/nvidia-persistenced --user nvidia-persistenced", 1.0, 0.0),
]


def _system_processes(b: TraceBuilder) -> None:
    """The usual background of a host: counted in host_aggregates, never traced."""
    for pid, ppid, comm, cmd, sched_rate, mm_rate in _SYSTEM:
        b.proc(Proc(pid, comm, cmd, ppid=ppid))
        b.background(pid, "sched_switch", sched_rate)
        if mm_rate:
            b.background(pid, "mm_page_alloc", mm_rate)


def _chunks(b: TraceBuilder, start_ns: int, end_ns: int, cuts: list[int] | None = None) -> list[tuple[int, int]]:
    """[start, end) split at `cuts` (phase changes of a scenario) and into pieces of at most CHUNK_NS.

    Calls are laid out from the start of each piece, so a phase change is exact in time even though
    stalls lengthen the calls before it.
    """
    edges = sorted({start_ns, end_ns, *(c for c in (cuts or []) if start_ns < c < end_ns)})
    out = []
    for a, z in pairwise(edges):
        out.extend((s, min(s + CHUNK_NS, z)) for s in range(a, z, CHUNK_NS))
    return out


def _mask(calls_spec: np.ndarray, rng: np.random.Generator, probs: dict[int, float]) -> dict[int, np.ndarray]:
    u = rng.random(calls_spec.size)
    return {i: (calls_spec == i) & (u < p) for i, p in probs.items()}


def _noise(calls: Calls, rng: np.random.Generator, prob: float = 0.002) -> None:
    """Rare short preemptions between calls (kworkers, daemons): every real thread has some."""
    hit = rng.random(calls.spec_idx.size) < prob
    calls.gap_pre[hit] += lognormal(rng, 60 * US, 0.6, int(hit.sum())).astype(np.int64)


def _secs(b: TraceBuilder) -> np.ndarray:
    """Seconds since the trace start at the middle of each snapshot bucket."""
    return np.arange(b.n_buckets) + 0.5


# --------------------------------------------------------------------------------------------
def _dataloader(b: TraceBuilder) -> tuple[int, int, str | None, str]:
    rng = b.rng
    cpus = b.cpus = 4
    epoch_ns = 10 * SEC
    _system_processes(b)
    b.proc(Proc(4000, "bash", "-bash", ppid=812))
    main = b.proc(Proc(4100, "python3", "python3 train.py --epochs 3 --batch-size 64 --num-workers 4",
                       ppid=4000, traced=True))
    n_epochs = math.ceil((b.end_ns - b.start_ns) / epoch_ns)

    def worker_pid(epoch: np.ndarray | int, k: np.ndarray | int) -> np.ndarray | int:
        return 4101 + 5 * epoch + k

    for e in range(n_epochs):
        e0 = b.start_ns + e * epoch_ns
        e1 = e0 + epoch_ns
        for k in range(4):
            exit_ns = e1 - 5 * MS if e1 - 5 * MS < b.end_ns else None
            w = b.fork_exec_exit(main.pid, Proc(int(worker_pid(e, k)), "pt_data_worker",
                                                main.cmdline, traced=True, exit_ns=exit_ns,
                                                exit_code=0 if exit_ns else None),
                                 fork_ns=e0 + 2 * MS + k * 1 * MS)
            # A forked worker starts as "python3" and names itself (torch sets the thread name).
            b.process_events.append(dict(ts_ns=(w.first_seen_ns or e0) + 400 * US, event="rename", pid=w.pid, tid=w.pid,
                                         comm="pt_data_worker", old_comm=main.comm))
    b.thread(main.pid, 4160, "pt_autograd_0", b.start_ns)

    def worker_at(ts: np.ndarray, r: np.random.Generator) -> np.ndarray:
        epoch = np.clip((ts - b.start_ns) // epoch_ns, 0, n_epochs - 1)
        return np.asarray(worker_pid(epoch, r.integers(0, 4, ts.size)))

    # Workers: CPU-bound (decode + augment), preempted by each other and by the main thread.
    for pid, p in list(b.procs.items()):
        if p.comm != "pt_data_worker":
            continue
        k = (pid - 4101) % 5
        epoch = (pid - 4101) // 5

        def other(ts: np.ndarray, r: np.random.Generator, k: int = k, epoch: int = epoch) -> np.ndarray:
            slot = (k + r.integers(1, 5, ts.size)) % 5
            return np.where(slot == 4, main.pid, worker_pid(epoch, slot))

        start = (p.first_seen_ns or b.start_ns) + 1 * MS
        end = p.exit_ns or b.end_ns
        # Between batches a worker sleeps on its index queue until the main thread puts the next index there,
        # then waits for a CPU: the four workers and the main thread share four CPUs.
        b.renewal_intervals(pid, pid, start, end, on_median_ns=3 * MS, pre_median_ns=1.2 * MS,
                            blk_median_ns=300 * US, pre_frac=0.75, preemptor=other, blocked_next=other, cpus=cpus,
                            wakers=Wakers(gap=task_waker(pick([main.pid])), gap_syscall="futex"),
                            wake_wait_ns=0.8 * MS)
        b.background(pid, "mm_page_alloc", 14_000.0)

    template = [
        # The batch, from the pinned buffer of pin_memory=True, after waiting for it on the workers' result queue.
        OpSpec("cudaMemcpyAsync", 14 * US, bytes=64 * 3 * 224 * 224, kind="H2D", gap_ns=150 * US, block_ns=5 * MS,
               pinned=True),
        OpSpec("cudaMemcpyAsync", 8 * US, 0.25, bytes=512, kind="H2D", gap_ns=15 * US, pinned=True),
        OpSpec("cudaLaunchKernel", 5 * US, 0.35, gap_ns=35 * US, repeat=40),
        OpSpec("cudaMemcpyAsync", 9 * US, 0.25, bytes=4, kind="D2H", gap_ns=20 * US, pinned=False),  # loss.item()
        OpSpec("cudaStreamSynchronize", 40 * US, 0.5, gap_ns=10 * US),
    ]
    for c0, c1 in _chunks(b, b.start_ns + 200 * MS, b.end_ns):
        calls = loop_calls(rng, template, c0, c1)
        m = _mask(calls.spec_idx, rng, {0: 0.03, 2: 0.002, 4: 0.05})
        for i, med in ((0, 6 * MS), (2, 4 * MS), (4, 9 * MS)):
            k = int(m[i].sum())
            pre = np.clip(lognormal(rng, med, 0.7, k), 1.5 * MS, 90 * MS)
            calls.add_stall(m[i], pre=pre, n_pre=rng.integers(1, 4, k))
        sync_slow = m[4] & (rng.random(calls.spec_idx.size) < 0.5)
        calls.add_stall(sync_slow, blk=lognormal(rng, 150 * US, 0.5, int(sync_slow.sum())))
        gap_pre = rng.random(calls.spec_idx.size) < 0.02
        calls.gap_pre[gap_pre] = lognormal(rng, 3 * MS, 0.6, int(gap_pre.sum())).astype(np.int64)
        # Every wakeup (a batch on the result queue, the GPU's interrupt ending a sync) is followed by a wait for
        # a CPU: all four are busy with the workers.
        n = calls.spec_idx.size
        calls.wake_waits(lognormal(rng, 1.2 * MS, 0.6, n), lognormal(rng, 1.5 * MS, 0.6, n))
        calls.layout(c0)
        calls.keep(calls.ts + calls.dur <= c1)
        b.emit_calls(main.pid, main.pid, template, calls, preemptor=worker_at, blocked_next=worker_at, cpus=cpus,
                     wakers=Wakers(call=irq_waker(worker_at), gap=task_waker(worker_at), gap_syscall="poll"))
    b.background(main.pid, "mm_page_alloc", 1_500.0)

    t = _secs(b)
    in_epoch = (t % 10)
    cpu = np.where(in_epoch < 1, 72, 98.5) + rng.normal(0, 1.2, t.size)
    gpu = 15 + rng.normal(0, 3, t.size)
    mem = 0.38 + 0.02 * np.sin(t / 7)
    b.write_snapshots(cpu, cpus, 32 * GiB, mem, gpu, np.full(t.size, 9 * GiB), 24 * GiB)
    b.write_gpu_processes(main.pid, 9 * GiB, gpu)
    return cpus, 32 * GiB, "NVIDIA A10G", EXPECTED["dataloader"].description


# --------------------------------------------------------------------------------------------
def _cold_start(b: TraceBuilder) -> tuple[int, int, str | None, str]:
    rng = b.rng
    cpus = b.cpus = 8
    _system_processes(b)
    b.proc(Proc(5200, "bash", "-bash", ppid=812))
    exec_ns = b.start_ns + 300 * MS
    srv = b.fork_exec_exit(5200, Proc(5300, "python3", "python3 serve.py --model resnet50 --port 8080",
                                      traced=True), fork_ns=exec_ns - 1 * MS, exec_file="/usr/bin/python3.11",
                           exec_ns=exec_ns)
    blocked_idle = pick([0])
    first_ns = exec_ns + 900 * MS  # imports, then torch initialises CUDA
    n_kernels = 60
    # Start-up: context creation inside the first cudaMalloc, model weights allocated and copied.
    warm = [
        OpSpec("cudaMalloc", 70 * US, 0.4, bytes=8 * MiB, gap_ns=250 * US),
        OpSpec("cudaMemcpyAsync", 15 * US, 0.3, bytes=8 * MiB, kind="H2D", gap_ns=200 * US, stream=0, pinned=False),
    ]
    wc = loop_calls(rng, warm, first_ns, first_ns + 2 * SEC)
    wc.keep(np.arange(wc.spec_idx.size) < 320)
    is_malloc = wc.spec_idx == 0
    first = np.zeros(wc.spec_idx.size, bool)
    first[0] = True
    # Context creation: ~1.4 s, mostly on CPU (driver init), some of it reading files (blocked).
    wc.dur[0] = 1_150 * MS
    wc.add_stall(first, blk=np.array([230 * MS]), n_blk=np.array([24]))
    wc.pages[0] = 2_400
    # The next few allocations map fresh device memory: milliseconds each.
    early = is_malloc & (np.cumsum(is_malloc) > 1) & (np.cumsum(is_malloc) <= 6)
    wc.dur[early] = lognormal(rng, 6 * MS, 0.5, int(early.sum())).astype(np.int64)
    wc.layout(first_ns)
    b.emit_calls(srv.pid, srv.pid, warm, wc, preemptor=blocked_idle, blocked_next=blocked_idle, cpus=cpus,
                 # context creation reads the driver's and the CUDA libraries' files: D-state sleeps ended by the
                 # disk's interrupt
                 wakers=Wakers(call=irq_waker(blocked_idle), call_syscall="read", call_state="uninterruptible"))
    serve_start = int(wc.ts[-1] + wc.dur[-1] + 50 * MS)

    template = [
        # Between requests the server sleeps in epoll_wait until the NIC's softirq wakes it.
        OpSpec("cudaMemcpyAsync", 12 * US, 0.3, bytes=3 * 224 * 224 * 4 * 8, kind="H2D", gap_ns=400 * US,
               block_ns=60 * MS, pinned=False),
        # one forward pass: the model's n_kernels distinct kernels, each launched once a request
        OpSpec("cudaLaunchKernel", 6 * US, 0.35, gap_ns=40 * US, repeat=n_kernels),
        OpSpec("cudaMemcpyAsync", 10 * US, 0.3, bytes=8 * 1000 * 4, kind="D2H", gap_ns=20 * US, pinned=False),
        OpSpec("cudaStreamSynchronize", 1_800 * US, 0.25, gap_ns=10 * US),
    ]
    for n_chunk, (c0, c1) in enumerate(_chunks(b, serve_start, b.end_ns)):
        calls = loop_calls(rng, template, c0, c1)
        # The sync waits for the GPU: the thread sleeps once (blocking sync).
        sync = calls.spec_idx == 3
        blk = (calls.dur[sync] * 0.85).astype(np.int64)
        calls.dur[sync] -= blk
        calls.add_stall(sync, blk=blk)
        if n_chunk == 0:
            # Lazy module loading: the first launch of each of the model's kernels (the first request's) loads it.
            launch_pos = np.nonzero(calls.spec_idx == 1)[0]
            cold = launch_pos[: n_kernels]
            assert np.unique(calls.pos[cold]).size == n_kernels
            calls.dur[cold] = lognormal(rng, 4 * MS, 0.7, cold.size).astype(np.int64)
            calls.dur[cold[0]] = 25_800 * US
            calls.pages[cold] = rng.integers(20, 120, cold.size)
            n_io = np.zeros(calls.spec_idx.size, bool)
            n_io[cold[::6]] = True
            calls.add_stall(n_io, blk=lognormal(rng, 400 * US, 0.4, int(n_io.sum())))
        _noise(calls, rng)
        calls.layout(c0)
        calls.keep(calls.ts + calls.dur <= c1)
        b.emit_calls(srv.pid, srv.pid, template, calls, preemptor=pick([190, 905]), blocked_next=blocked_idle,
                     cpus=cpus, wakers=Wakers(call=irq_waker(blocked_idle), gap=irq_waker(blocked_idle, "softirq"),
                                   gap_syscall="epoll_wait"))
    b.background(srv.pid, "mm_page_alloc", np.where(np.arange(b.n_buckets) < 3, 60_000.0, 800.0))

    t = _secs(b)
    busy_init = (t > 0.3) & (t < 3.5)
    cpu = np.where(busy_init, 13.5, 6.0) + rng.normal(0, 0.8, t.size)
    # Serving: ~1.8 ms of GPU work per request, a request every ~63 ms.
    gpu = np.where(t < 3.5, 0.0, 3 + rng.normal(0, 0.5, t.size))
    gmem = np.where(t < 1.5, 0.3 * GiB, 3.1 * GiB)
    mem = np.where(t < 1.2, 0.21, 0.27) + 0.002 * rng.standard_normal(t.size)
    b.write_snapshots(cpu, cpus, 64 * GiB, mem, gpu, gmem, 24 * GiB)
    b.write_gpu_processes(srv.pid, int(3.1 * GiB), gpu, alive=t > (first_ns - b.start_ns) / SEC)
    return cpus, 64 * GiB, "NVIDIA L4", EXPECTED["cold-start"].description


# --------------------------------------------------------------------------------------------
def _memcpy_bottleneck(b: TraceBuilder) -> tuple[int, int, str | None, str]:
    rng = b.rng
    cpus = b.cpus = 8
    _system_processes(b)
    b.proc(Proc(6000, "bash", "-bash", ppid=812))
    main = b.proc(Proc(6100, "python3", "python3 train_tabular.py --batch 4194304", ppid=6000, traced=True))
    idle = pick([0])
    batch_bytes = 256 * MiB
    template = [
        # The batch is a numpy array turned into a tensor: pageable memory, copied through the driver's staging buffer.
        OpSpec("cudaMemcpy", 20 * US, 0.3, bytes=batch_bytes, kind="H2D", gap_ns=3 * MS, pinned=False),
        OpSpec("cudaMemcpy", 18 * US, 0.3, bytes=2048, kind="H2D", gap_ns=40 * US, pinned=False),
        OpSpec("cudaLaunchKernel", 6 * US, 0.35, gap_ns=30 * US, repeat=30),
        OpSpec("cudaDeviceSynchronize", 4 * MS, 0.2, gap_ns=10 * US),
        OpSpec("cudaMemcpy", 22 * US, 0.3, bytes=4, kind="D2H", gap_ns=20 * US, pinned=False),
        OpSpec("cudaMemcpy", 21 * US, 0.3, bytes=4, kind="D2H", gap_ns=20 * US, pinned=False),
    ]
    for c0, c1 in _chunks(b, b.start_ns + 100 * MS, b.end_ns):
        calls = loop_calls(rng, template, c0, c1)
        big = calls.spec_idx == 0
        k = int(big.sum())
        # Pageable H2D: the driver stages through a pinned bounce buffer, ~2.6-3.4 GB/s here.
        bw = rng.uniform(2.6e9, 3.4e9, k)
        total = (batch_bytes / bw * SEC).astype(np.int64)
        blk = (total * rng.uniform(0.62, 0.72, k)).astype(np.int64)
        calls.dur[big] = total - blk
        calls.add_stall(big, blk=blk, n_blk=(total // (2 * MS)).astype(np.int64))
        calls.pages[big] = rng.integers(0, 6, k)
        sync = calls.spec_idx == 3
        sblk = (calls.dur[sync] * 0.9).astype(np.int64)
        calls.dur[sync] -= sblk
        calls.add_stall(sync, blk=sblk)
        _noise(calls, rng)
        calls.layout(c0)
        calls.keep(calls.ts + calls.dur <= c1)
        b.emit_calls(main.pid, main.pid, template, calls, preemptor=pick([190, 905]), blocked_next=idle, cpus=cpus,
                     wakers=Wakers(call=irq_waker(idle)))
    b.background(main.pid, "mm_page_alloc", 2_500.0)
    t = _secs(b)
    cpu = 14 + rng.normal(0, 1, t.size)
    gpu = 7 + rng.normal(0, 1.5, t.size)
    b.write_snapshots(cpu, cpus, 128 * GiB, 0.45 + 0.003 * rng.standard_normal(t.size), gpu,
                      np.full(t.size, 6 * GiB), 80 * GiB)
    b.write_gpu_processes(main.pid, 6 * GiB, gpu)
    return cpus, 128 * GiB, "NVIDIA A100-SXM4-80GB", EXPECTED["memcpy-bottleneck"].description


# --------------------------------------------------------------------------------------------
def _allocator_spike(b: TraceBuilder) -> tuple[int, int, str | None, str]:
    rng = b.rng
    cpus = b.cpus = 8
    period_ns = 5 * SEC
    _system_processes(b)
    b.proc(Proc(7000, "bash", "-bash", ppid=812))
    main = b.proc(Proc(7100, "python3", "python3 train_seg.py --variable-size-inputs", ppid=7000, traced=True))
    idle = pick([0])
    template = [
        OpSpec("cudaMemcpyAsync", 14 * US, 0.3, bytes=16 * MiB, kind="H2D", gap_ns=2 * MS, pinned=True),
        OpSpec("cudaLaunchKernel", 6 * US, 0.35, gap_ns=40 * US, repeat=40),
        OpSpec("cudaMalloc", 90 * US, 0.5, bytes=32 * MiB, gap_ns=30 * US),
        OpSpec("cudaLaunchKernel", 6 * US, 0.35, gap_ns=40 * US, repeat=20),
        OpSpec("cudaStreamSynchronize", 9 * MS, 0.15, gap_ns=10 * US),
    ]
    spike_pages_total = np.zeros(b.n_buckets)
    spike_ns_total = np.zeros(b.n_buckets)
    cuts = list(range(b.start_ns, b.end_ns, period_ns)) + list(range(b.start_ns + SEC, b.end_ns, period_ns))
    for c0, c1 in _chunks(b, b.start_ns + 100 * MS, b.end_ns, cuts):
        calls = loop_calls(rng, template, c0, c1)
        sync = calls.spec_idx == 4
        sblk = (calls.dur[sync] * 0.9).astype(np.int64)
        calls.dur[sync] -= sblk
        calls.add_stall(sync, blk=sblk)
        # The caching allocator usually serves from its pool: only 1 step in 5 reaches cudaMalloc.
        malloc = calls.spec_idx == 2
        drop = malloc & (rng.random(calls.spec_idx.size) < 0.8)
        calls.keep(~drop)
        # 1 s into every 5 s period (after empty_cache), the next 8 cudaMallocs are slow and
        # allocate pages in a storm: the pool is refilled.
        malloc = np.nonzero(calls.spec_idx == 2)[0]
        refill = (c0 - b.start_ns) % period_ns == SEC
        first_of_cycle = np.arange(malloc.size) < (8 if refill else 0)
        spike = np.zeros(calls.spec_idx.size, bool)
        spike[malloc[first_of_cycle]] = True
        k = int(spike.sum())
        oncpu = lognormal(rng, 30 * MS, 0.35, k).astype(np.int64)
        calls.dur[spike] = oncpu
        calls.add_stall(spike, blk=(oncpu * rng.uniform(0.05, 0.15, k)).astype(np.int64), n_blk=rng.integers(2, 8, k))
        calls.pages[spike] = rng.integers(20_000, 60_000, k)
        _noise(calls, rng)
        calls.layout(c0)
        calls.keep(calls.ts + calls.dur <= c1)
        b.emit_calls(main.pid, main.pid, template, calls, preemptor=pick([190, 905]), blocked_next=idle, cpus=cpus,
                     wakers=Wakers(call=irq_waker(idle)))
        sp = calls.pages >= 20_000
        spike_pages_total += np.bincount(np.clip((calls.ts[sp] - b.start_ns) // SEC, 0, b.n_buckets - 1),
                                         weights=calls.pages[sp], minlength=b.n_buckets)
        spike_ns_total += np.bincount(np.clip((calls.ts[sp] - b.start_ns) // SEC, 0, b.n_buckets - 1),
                                      weights=calls.dur[sp], minlength=b.n_buckets)
    b.background(main.pid, "mm_page_alloc", 3_000.0)
    t = _secs(b)
    cpu = 13 + rng.normal(0, 1, t.size) + np.minimum(spike_pages_total / 50_000, 8)
    # The GPU runs the step's kernels while the thread waits in the 9 ms sync (~70% of a step), and idles while
    # the allocator refills its pool.
    gpu = 70 * (1 - spike_ns_total / SEC) + rng.normal(0, 2, t.size)
    mem = 0.30 + 0.03 * ((t % 5) > 1)
    gmem = np.where((t % 5) > 1, 14 * GiB, 6 * GiB)
    b.write_snapshots(cpu, cpus, 64 * GiB, mem, gpu, gmem, 24 * GiB)
    b.write_gpu_processes(main.pid, 14 * GiB, gpu)
    return cpus, 64 * GiB, "NVIDIA RTX A5000", EXPECTED["allocator-spike"].description


# --------------------------------------------------------------------------------------------
def _cpu_contention(b: TraceBuilder) -> tuple[int, int, str | None, str]:
    rng = b.rng
    cpus = b.cpus = 4
    span = b.end_ns - b.start_ns
    hog_start = b.start_ns + round(span * 0.27 / SEC) * SEC
    hog_end = b.start_ns + round(span * 0.73 / SEC) * SEC
    _system_processes(b)
    b.proc(Proc(8000, "bash", "-bash", ppid=812))
    main = b.proc(Proc(8100, "python3", "python3 infer.py --stream rtsp://cam1", ppid=8000, traced=True))
    b.proc(Proc(8150, "bash", "-bash", ppid=812))
    ffmpeg = b.fork_exec_exit(8150, Proc(8200, "ffmpeg", "ffmpeg -i /data/raw.mkv -c:v libx264 -preset slow out.mp4",
                                         exit_ns=hog_end, exit_code=0),
                              fork_ns=hog_start - 1 * MS, exec_file="/usr/bin/ffmpeg", exec_ns=hog_start)
    secs_start = np.arange(b.n_buckets) * SEC + b.start_ns
    hog_frac = np.clip((np.minimum(secs_start + SEC, hog_end) - np.maximum(secs_start, hog_start)) / SEC, 0, 1)
    # libx264 -preset slow: four encoder threads, each keeping a CPU busy.
    for tid in (8200, 8201, 8202, 8203):
        b.run_on_cpus(ffmpeg.pid, tid, 0.97 * hog_frac, 600.0 * hog_frac, cpus)
    b.background(ffmpeg.pid, "mm_page_alloc", 9_000.0 * hog_frac)

    def who(ts: np.ndarray, r: np.random.Generator) -> np.ndarray:
        inside = (ts >= hog_start) & (ts < hog_end)
        return np.where(inside, ffmpeg.pid, np.array([190, 905])[r.integers(0, 2, ts.size)])

    idle_or_hog = lambda ts, r: np.where((ts >= hog_start) & (ts < hog_end), ffmpeg.pid, 0)  # noqa: E731
    template = [
        # Before each frame: asleep on the camera's socket until the NIC's softirq wakes the thread.
        OpSpec("cudaMemcpyAsync", 12 * US, 0.3, bytes=3 * 640 * 640 * 4, kind="H2D", gap_ns=1_200 * US, block_ns=8 * MS,
               pinned=False),
        OpSpec("cudaLaunchKernel", 5 * US, 0.35, gap_ns=30 * US, repeat=30),
        OpSpec("cudaMemcpyAsync", 10 * US, 0.3, bytes=25_200 * 4, kind="D2H", gap_ns=15 * US),
        OpSpec("cudaStreamSynchronize", 180 * US, 0.4, gap_ns=10 * US),
    ]
    for c0, c1 in _chunks(b, b.start_ns + 100 * MS, b.end_ns, [hog_start, hog_end]):
        calls = loop_calls(rng, template, c0, c1)
        inside = np.full(calls.ts.size, hog_start <= c0 < hog_end)
        m = _mask(calls.spec_idx, rng, {0: 0.05, 1: 0.01, 3: 0.16})
        for i, med in ((0, 5 * MS), (1, 3 * MS), (3, 6 * MS)):
            sel = m[i] & inside
            k = int(sel.sum())
            calls.add_stall(sel, pre=np.clip(lognormal(rng, med, 0.6, k), 1 * MS, 60 * MS), n_pre=rng.integers(1, 4, k))
        gp = inside & (rng.random(calls.spec_idx.size) < 0.03)
        calls.gap_pre[gp] = lognormal(rng, 4 * MS, 0.5, int(gp.sum())).astype(np.int64)
        # Woken by a frame while ffmpeg holds every CPU, the thread waits for one before it runs.
        n = calls.spec_idx.size
        calls.wake_waits(np.zeros(n), np.where(inside, lognormal(rng, 3 * MS, 0.6, n), 0))
        _noise(calls, rng)
        calls.layout(c0)
        calls.keep(calls.ts + calls.dur <= c1)
        b.emit_calls(main.pid, main.pid, template, calls, preemptor=who, blocked_next=idle_or_hog, cpus=cpus,
                     wakers=Wakers(call=irq_waker(idle_or_hog), gap=irq_waker(idle_or_hog, "softirq"),
                                   gap_syscall="recvfrom"))
    b.background(main.pid, "mm_page_alloc", 900.0)
    t = _secs(b)
    cpu = 24.0 + 75.0 * hog_frac + rng.normal(0, 1, t.size)
    gpu = 38.0 - 24.0 * hog_frac + rng.normal(0, 2, t.size)
    b.write_snapshots(cpu, cpus, 16 * GiB, 0.52 + 0.004 * rng.standard_normal(t.size), gpu,
                      np.full(t.size, 2 * GiB), 16 * GiB)
    b.write_gpu_processes(main.pid, 2 * GiB, gpu)
    return cpus, 16 * GiB, "NVIDIA T4", EXPECTED["cpu-contention"].description


# --------------------------------------------------------------------------------------------
def _gpu_shared(b: TraceBuilder) -> tuple[int, int, str | None, str]:
    rng = b.rng
    cpus = b.cpus = 16
    period_ns = 4 * SEC
    burst_ns = 600 * MS
    _system_processes(b)
    b.proc(Proc(9000, "bash", "-bash", ppid=812))
    trainer = b.proc(Proc(9100, "python3", "python3 train.py --model bert-base", ppid=9000, traced=True))
    server = b.proc(Proc(9200, "python3", "python3 serve.py --model llama-7b --port 9000", ppid=1, traced=True))
    idle = pick([0])
    b.thread(trainer.pid, 9160, "pt_autograd_0", b.start_ns)

    def in_burst(ts: np.ndarray) -> np.ndarray:
        return ((ts - b.start_ns) % period_ns) >= period_ns - burst_ns

    train_t = [
        OpSpec("cudaMemcpyAsync", 13 * US, 0.3, bytes=32 * 512 * 8, kind="H2D", gap_ns=600 * US, pinned=True),
        OpSpec("cudaLaunchKernel", 5 * US, 0.35, gap_ns=25 * US, repeat=40),
        OpSpec("cudaStreamSynchronize", 3 * MS, 0.15, gap_ns=10 * US),
    ]
    serve_t = [
        OpSpec("cudaMemcpyAsync", 11 * US, 0.3, bytes=4096 * 4, kind="H2D", gap_ns=300 * US, pinned=False),
        OpSpec("cudaLaunchKernel", 5 * US, 0.35, gap_ns=20 * US, repeat=24),
        OpSpec("cudaStreamSynchronize", 6 * MS, 0.15, gap_ns=10 * US),
        OpSpec("cudaMemcpyAsync", 9 * US, 0.3, bytes=4096 * 4, kind="D2H", gap_ns=20 * US, pinned=False),
    ]
    cuts = [b.start_ns + p + off for p in range(0, b.end_ns - b.start_ns, period_ns)
            for off in (period_ns - burst_ns, period_ns)]
    for c0, c1 in _chunks(b, b.start_ns + 100 * MS, b.end_ns, cuts):
        burst = bool(in_burst(np.array([c0]))[0])
        calls = loop_calls(rng, train_t, c0, c1)
        sync = calls.spec_idx == 2
        # A sync during the other process's burst waits for its kernels too: 5-10x longer.
        slow = sync & burst
        calls.dur[slow] = (calls.dur[slow] * rng.uniform(5, 10, int(slow.sum()))).astype(np.int64)
        blk = (calls.dur[sync] * 0.92).astype(np.int64)
        calls.dur[sync] -= blk
        calls.add_stall(sync, blk=blk)
        _noise(calls, rng)
        calls.layout(c0)
        calls.keep(calls.ts + calls.dur <= c1)
        b.emit_calls(trainer.pid, trainer.pid, train_t, calls, preemptor=pick([190, 905]), blocked_next=idle, cpus=cpus,
                     wakers=Wakers(call=irq_waker(idle)))

        if not burst:
            continue
        s = loop_calls(rng, serve_t, c0, c1)
        ssync = s.spec_idx == 2
        sblk = (s.dur[ssync] * 0.9).astype(np.int64)
        s.dur[ssync] -= sblk
        s.add_stall(ssync, blk=sblk)
        s.layout(c0)
        s.keep(s.ts + s.dur <= c1)
        b.emit_calls(server.pid, server.pid, serve_t, s, preemptor=pick([190, 905]), blocked_next=idle, cpus=cpus,
                     wakers=Wakers(call=irq_waker(idle)))
    b.background(trainer.pid, "mm_page_alloc", 1_200.0)
    b.background(server.pid, "mm_page_alloc", 400.0)
    t = _secs(b)
    burst = ((t % 4) >= 3.4)
    cpu = np.where(burst, 13.0, 8.0) + rng.normal(0, 0.7, t.size)
    gpu = np.where(burst, 99.0, 58.0) + rng.normal(0, 2, t.size)
    b.write_snapshots(cpu, cpus, 256 * GiB, 0.31 + 0.002 * rng.standard_normal(t.size), gpu,
                      np.full(t.size, 61 * GiB), 80 * GiB)
    # NVML: both processes hold GPU memory all along; the server's SMs are busy only in its bursts.
    b.write_gpu_processes(trainer.pid, 22 * GiB, 58.0 + rng.normal(0, 2, t.size))
    b.write_gpu_processes(server.pid, 39 * GiB, np.where(burst, 41.0, 0.0))
    return cpus, 256 * GiB, "NVIDIA H100 80GB HBM3", EXPECTED["gpu-shared"].description


_BUILDERS: dict[str, tuple[Callable[[TraceBuilder], tuple[int, int, str | None, str]], float]] = {
    "dataloader": (_dataloader, 30.0),
    "cold-start": (_cold_start, 20.0),
    "memcpy-bottleneck": (_memcpy_bottleneck, 30.0),
    "allocator-spike": (_allocator_spike, 30.0),
    "cpu-contention": (_cpu_contention, 30.0),
    "gpu-shared": (_gpu_shared, 30.0),
}


def base_duration_s(name: str) -> float:
    """Length of the scenario's trace at scale 1.0, in seconds."""
    return _BUILDERS[name][1]


def generate(name: str, db: Path, *, seed: int = 0, scale: float = 1.0) -> int:
    """Write scenario `name` as a new session of the store at `db`; returns its session id.

    The trace starts at a fixed instant and lasts `base_duration_s(name) * scale` seconds; the
    same (name, seed, scale) always gives the same trace.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown demo scenario {name!r}; scenarios: {', '.join(SCENARIOS)}")
    if scale <= 0:
        raise ValueError("scale must be > 0")
    build, base_s = _BUILDERS[name]
    start = T0_NS
    end = start + int(base_s * scale * SEC)
    from ingero_mcp.analysis import store_derived

    # the session is complete when the writer closes: its accounting is stored with it
    with TraceWriter(db, derive=store_derived) as writer:
        b = TraceBuilder(writer, start, end, seed=seed * 1000 + SCENARIOS.index(name))
        cpus, mem, gpu, description = build(b)
        b.write_session(name, seed, scale, cpus, mem, gpu, notes=f"synthetic demo scenario {name!r}: {description}")
        return writer.session_id
