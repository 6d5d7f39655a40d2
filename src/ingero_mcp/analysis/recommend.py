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

CATALOGUE: dict[str, list[str]] = {
    CPU_CONTENTION: [
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
        "The GPU sat idle ({gpu_in}% busy vs {gpu_out}% otherwise) for {gaps_s} s ({share}% of {scope}) while {thread} "
        "of {who} ran on the CPU {on_pct}% of that time between its CUDA calls: batch preparation (indexing, collate) "
        "on the thread that feeds the GPU, with about {spare_cpus} of {cpus} CPUs idle. Move it to DataLoader workers: "
        "num_workers=N (N up to {cpus} - 1), "
        "persistent_workers=True, prefetch_factor=2-4.",
        "If the dataset is a tensor in memory, skip per-sample Python work: index it with a whole batch of indices "
        "(x[idx] with idx from torch.randperm, ideally on the GPU) instead of Dataset.__getitem__ + collate; keep it on "
        "the GPU when it fits. {who} allocated {own_pages} pages ({own_gib} GiB) in the seconds holding the gaps.",
    ],
    INPUT_WAIT: [
        "The {thread} of {who} slept {blk_pct}% of {gaps_s} s of gaps ({share}% of {scope}, GPU {gpu_in}% busy then) "
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
