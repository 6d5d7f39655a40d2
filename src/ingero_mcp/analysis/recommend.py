"""Recommendations keyed by root cause; each one is filled in with the numbers it rests on."""

from __future__ import annotations

from collections.abc import Mapping

# Root-cause ids used by the chain engine.
CPU_CONTENTION = "cpu-contention"
BLOCKED = "blocked"
GPU_SHARED = "gpu-shared"
PAGE_ALLOC_STORM = "page-alloc-storm"
COLD_START = "cold-start"
MEMCPY_BANDWIDTH = "memcpy-bandwidth"
UNEXPLAINED = "unexplained"
HOST_BOUND = "host-bound"
DRIVER_LOCK = "driver-lock"
QUEUED_COPY = "queued-copy"
INPUT_WAIT = "waiting-on-workers"
# Causes read off the time accounting (causes.py).
OWN_WORKERS_CPU = "own-workers-cpu"
OWN_THREADS_CPU = "own-threads-cpu"
LOCK_OR_GIL = "gil-or-lock"
IO_WAIT = "io-wait"
SLEEP_KERNEL = "kernel-wakeup"
WAITING_ON_PROCESS = "waiting-on-process"
SLEEP_UNKNOWN = "sleeping"
PAGEABLE_COPIES = "pageable-copies"
ALLOCATOR_CHURN = "allocator-churn"
GPU_SLOWER = "gpu-slower"
LAUNCH_OVERHEAD = "launch-overhead"
PAGE_FAULTS = "page-faults"

CATALOGUE: dict[str, list[str]] = {
    OWN_WORKERS_CPU: [
        "{who} waited for a CPU {share}% of the time ({window}) behind the job's own worker processes ({holders}): "
        "run fewer workers than the CPUs the job may use (num_workers <= CPUs - 1, counting the main thread and the "
        "pin-memory thread), or give the job more CPUs; check the CPU mask (taskset -p, the container's cpuset).",
    ],
    OWN_THREADS_CPU: [
        "{who} waited for a CPU {share}% of the time ({window}) behind other threads of its own process ({holders}): "
        "cap intra-op threads (torch.set_num_threads, OMP_NUM_THREADS) below the CPUs the job may use.",
    ],
    LOCK_OR_GIL: [
        "{who} slept {share}% of the time ({window}) until {waker} woke it; {waker} was {doing}: pure-Python work in "
        "another thread holds the GIL. Move it to a process (multiprocessing) or release the GIL (numpy/torch ops, "
        "C extensions), or make it yield (time.sleep(0) in its loop).",
    ],
    IO_WAIT: [
        "{who} slept in IO {share}% of the time ({window}): read the data ahead of the loop (DataLoader workers with "
        "prefetch_factor, a page-cache-warm or local copy of the dataset, larger sequential reads).",
    ],
    SLEEP_KERNEL: [
        "{who} slept {share}% of the time ({window}) until the kernel woke it (in {syscall}()): look at what that "
        "system call waits for (a device, a timer, the network).",
    ],
    WAITING_ON_PROCESS: [
        "{who} slept {share}% of the time ({window}) until {waker} woke it; {waker} was {doing}: that process sets the "
        "pace; speed it up or decouple the two (a deeper queue).",
    ],
    SLEEP_UNKNOWN: [
        "{who} slept {share}% of the time ({window}) and the store does not say on what: record with a v2 collector "
        "(wakers are recorded) to name it.",
    ],
    PAGEABLE_COPIES: [
        "Copy from pinned host memory: pin_memory=True in the DataLoader, tensor.pin_memory() once for reused "
        "buffers, and .to('cuda', non_blocking=True); pageable copies ran at {gbs} GB/s here.",
    ],
    ALLOCATOR_CHURN: [
        "Keep the caching allocator warm: remove torch.cuda.empty_cache() from the loop, reuse buffers, use fixed or "
        "bucketed shapes, or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
    ],
    GPU_SLOWER: [
        "The host waited longer for the GPU and no other process was seen using it: profile the GPU side of the "
        "window ({window}) with nsys or torch.profiler to see which kernels grew.",
    ],
    LAUNCH_OVERHEAD: [
        "The CPU time is spent inside CUDA calls: fewer, larger launches (fuse ops, torch.compile, CUDA graphs).",
    ],
    PAGE_FAULTS: [
        "Reuse host buffers instead of allocating fresh memory every step (preallocate, then fill in place); for "
        "large arrays consider huge pages.",
    ],
    CPU_CONTENTION: [
        "{who} waited for a CPU {share}% of the time ({window}) behind {holders}: give the training loop CPUs of its "
        "own (taskset / cpuset for the other work, or for the job), or lower the others' priority (nice -n 19, "
        "cgroup cpu.weight).",
    ],
    "cpu-contention-legacy": [
        "Give the thread that feeds the GPU its own CPU: {subject} spent {preempted_pct}% of {span} "
        "runnable but not running, the CPU taken by {competitors}. Run fewer busy processes than the {cpus} CPUs "
        "(e.g. DataLoader num_workers <= {cpus} - 1) or pin them away from the main thread (taskset / os.sched_setaffinity).",
        "Lower the priority of the competing work (nice -n 19 / a cgroup cpu.weight) so that it stops preempting "
        "the training loop; CPU was {cpu_at_slow}% {moment} vs {cpu_mean}% on average.",
    ],
    BLOCKED: [
        "{subject_cap} slept {blocked_pct}% of {span} (blocked, not preempted): the thread waits on the "
        "GPU, a lock or IO. Check what the GPU runs at those moments (nsys / torch.profiler) and avoid "
        "synchronising every step (e.g. .item() or .cpu() in the loop).",
    ],
    GPU_SHARED: [
        "Another process uses the GPU {during} ({others}): run it on "
        "another GPU, or isolate them with MPS / MIG, or schedule the two jobs apart.",
        "GPU utilisation {moment}: {gpu_at_slow}% (vs {gpu_mean}% over the trace).",
    ],
    PAGE_ALLOC_STORM: [
        "The slow {op} calls allocated {pages_per_call} pages each (vs {pages_per_call_all} per other call): the allocator's pool is being emptied and refilled. Keep the PyTorch caching allocator warm "
        "(no torch.cuda.empty_cache() in the loop), use fixed / bucketed input sizes, or set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
        "Pin and pre-allocate host buffers once (pin_memory=True) rather than per step.",
    ],
    COLD_START: [
        "The {op} tail is start-up cost: the slowest call ({slowest_ms} ms) is call #{call_index} of that op by "
        "pid {pid}. Warm up before timing or serving (run one step / a dummy batch first) and exclude it from "
        "latency figures.",
        "If start-up itself matters: initialise CUDA early and once (torch.cuda.init()), enable lazy loading "
        "(CUDA_MODULE_LOADING=LAZY) or keep the process alive between jobs.",
    ],
    MEMCPY_BANDWIDTH: [
        "The slow {op} calls ({copies} copies, {bytes_total} bytes in {copies_ms} ms) moved {gb_per_call} GB each at "
        "{bandwidth_gbs} GB/s, the calling thread on-CPU {on_cpu_pct}% of that time: use pinned host memory "
        "(pin_memory=True / tensor.pin_memory() / cudaHostAlloc) and non_blocking copies on a side stream so they "
        "overlap compute.",
        "Move less data per step (keep data on the GPU, transfer compressed or lower-precision tensors).",
    ],
    DRIVER_LOCK: [
        "The slow {op} call{s_plural} ({top_ms} ms) overlapped {other_op} on thread {other_tid} for {overlap_ms} ms "
        "({overlap_pct}%): pinned-memory allocation (cudaHostAlloc / cuMemHostAlloc) and other driver calls take a "
        "context-wide lock, so launches and copies on other threads wait behind them. Allocate pinned buffers once, up "
        "front, and reuse them (warm the pinned pool before the loop, persistent_workers=True with pin_memory, or a "
        "pre-pinned staging buffer), rather than while the GPU is being fed.",
    ],
    QUEUED_COPY: [
        "The slow {op} calls wait for the copy queued just before them ({copy_bytes} bytes {copy_kind} at {copy_gbs} GB/s; "
        "{queued_pct}% of their time): that is the transfer, not the host. To hide it, copy the next batch on a side "
        "stream with non_blocking=True while the current one computes, and synchronise only when the data is needed.",
    ],
    HOST_BOUND: [
        "The GPU sat idle ({gpu_in}% busy vs {gpu_out}% otherwise) for {gaps_s} s ({share}% of the trace) while {thread} "
        "of {who} ran on the CPU {on_pct}% of that time between its CUDA calls: batch preparation (indexing, collate) "
        "on the thread that feeds the GPU, with about {spare_cpus} of {cpus} CPUs idle. Move it to DataLoader workers: "
        "num_workers=N (N up to {cpus} - 1), "
        "persistent_workers=True, prefetch_factor=2-4.",
        "If the dataset is a tensor in memory, skip per-sample Python work: index it with a whole batch of indices "
        "(x[idx] with idx from torch.randperm, ideally on the GPU) instead of Dataset.__getitem__ + collate; keep it on "
        "the GPU when it fits. {who} allocated {own_pages} pages ({own_gib} GiB) in the seconds holding the gaps.",
    ],
    INPUT_WAIT: [
        "The {thread} of {who} slept {blk_pct}% of {gaps_s} s of gaps ({share}% of the trace, GPU {gpu_in}% busy then) "
        "waiting for batches while {workers} were on-CPU {kids_on_pct}%: the workers cannot keep up. Add workers "
        "(up to {cpus} - 1 CPUs), keep them alive between epochs (persistent_workers=True), raise prefetch_factor, "
        "and make per-sample work cheaper (a batch sampler with vectorised indexing/collate).",
        "The workers allocated {kid_pages} pages ({kid_gib} GiB) in the seconds holding the gaps: every batch is built "
        "in fresh memory and handed to the main process through shared memory{pin_note}.",
    ],
    UNEXPLAINED: [
        "The host evidence does not explain the {op} tail (off-CPU {off_cpu_pct}% of the slow calls' time, "
        "no start-up pattern): look at the GPU side (nsys, torch.profiler) around {first_slow}.",
    ],
}


def slow_call_words(op: str) -> dict[str, str]:
    """The wording of recommendations about an op's slow calls."""
    return {"subject": f"the slow {op} calls", "subject_cap": f"The slow {op} calls", "span": "their time",
            "moment": "in the snapshots at the slow calls", "during": f"during the slow {op} calls"}


def drop_words() -> dict[str, str]:
    """The wording of recommendations about a throughput drop."""
    return {"subject": "the calling thread", "subject_cap": "The calling thread", "span": "the drop",
            "moment": "during the drop", "during": "more than usual during the drop"}


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def recommend(cause: str, numbers: Mapping[str, object]) -> list[str]:
    """The catalogue's recommendations for a root cause, citing the given numbers."""
    return [text.format_map(_Missing(numbers)) for text in CATALOGUE.get(cause, [])]
