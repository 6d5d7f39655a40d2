"""Recommendations keyed by root cause; each one is filled in with the numbers it rests on."""

from __future__ import annotations

from collections.abc import Mapping

# Root-cause ids (causes/, chains.py).
CPU_CONTENTION = "cpu-contention"
GPU_SHARED = "gpu-shared"
COLD_START = "cold-start"
UNEXPLAINED = "unexplained"
HOST_BOUND = "host-bound"
INPUT_WAIT = "waiting-on-workers"
# Causes read off the time accounting (causes/).
OWN_WORKERS_CPU = "own-workers-cpu"
OWN_THREADS_CPU = "own-threads-cpu"
LOCK_OR_GIL = "gil-or-lock"
IO_WAIT = "io-wait"
# Not a root cause: the fix for an io-wait whose sleeps were the thread's own writes being flushed (fsync, a write
# to a full device queue), not reads: reading ahead does not help a checkpoint (the narration picks it, io_fix).
IO_WRITE_FIX = "io-wait-write-fix"
# The catalogue entry (not a root cause) for an io-wait spent reclaiming memory: the fix is the memory, not the disk.
IO_RECLAIM_FIX = "io-wait-reclaim-fix"
WRITE_SYSCALLS = frozenset({"fsync", "fdatasync", "sync_file_range", "msync", "sync", "syncfs", "write", "pwrite64",
                            "writev", "pwritev", "pwritev2"})
SLEEP_KERNEL = "kernel-wakeup"
WAITING_ON_PROCESS = "waiting-on-process"
SLEEP_UNKNOWN = "sleeping"
PAGEABLE_COPIES = "pageable-copies"
ALLOCATOR_CHURN = "allocator-churn"
GPU_SLOWER = "gpu-slower"
# A slow phase in which the GPU was saturated: its own work set the pace, no host-side cause (never above LOW).
GPU_BOUND = "gpu-bound"
LAUNCH_OVERHEAD = "launch-overhead"
PAGE_FAULTS = "page-faults"
TIMED_SLEEP = "timed-sleep"
DRIVER_LOCK = "driver-lock"
# Causes named by the wait-for graph, the progress per iteration and the cgroup samples.
WAITING_ON_THREAD = "waiting-on-thread"
SLOW_CONSUMER = "slow-consumer"
NETWORK_WAIT = "network-wait"
CPU_THROTTLED = "cpu-throttled"
LAUNCH_BOUND = "launch-bound"
EXCESS_SYNC = "excess-sync"
CPU_IDLE_WAIT = "runnable-while-idle"
# Not a root cause: the fix for allocator churn that is host memory pinned and unpinned (chains.churn_chains).
PINNING_FIX = "pinning-churn-fix"
# Not a root cause: the fix for a lock (gil-or-lock) whose holder slept while it held it, in any process.
LOCK_HELD_FIX = "lock-held-asleep-fix"
# Not a root cause: the fix for a lock of the program's own that another thread held over its work (causes.locks).
LOCK_OVER_WORK_FIX = "lock-held-over-work-fix"
# Not a root cause: the fix for a pool queued for one lock whose stacks show a lock of the program's own, not the GIL.
LOCK_CONVOY_FIX = "lock-convoy-fix"
# Not a root cause: the fix for a wait on a worker process whose own thread held its GIL (causes.sleeps).
WORKER_GIL_FIX = "worker-gil-fix"
# Not a root cause: the fix for a wait on worker processes that are not a PyTorch DataLoader's (narration: no worker
# named pt_data_*): a server over a socket, a pool of its own; the DataLoader's knobs are said only as a conditional.
WORKERS_FIX = "workers-fix"
# Not a root cause: the fix for a wait on worker processes that took turns at something they share (causes.turns).
WORKERS_TURNS_FIX = "workers-turns-fix"
WORKERS_SERVER_FIX = "workers-server-fix"
# Not a root cause: the fix for a wait on a thread or process that sleeps on its own timer between what it hands over.
PACED_FIX = "paced-by-timer-fix"
CHILD_RUN_FIX = "child-run-to-exit-fix"
COPIES_FIX = "copies-in-pieces-fix"
# Not a root cause: the fix for host-bound whose host time went mostly to turning tensors into text (causes.culprits).
TENSOR_TEXT_FIX = "tensor-text-fix"
# Not a root cause: the fix for host-bound whose many copies an iteration were mostly reads back to the host.
READS_FIX = "reads-back-fix"
# Not a root cause: the fix for host-bound whose samples were in PyTorch's data loading on the feeding thread.
LOADING_FIX = "loading-fix"
# Not a root cause: the fix for host-bound whose data loading was a DataLoader's sampler (causes.sampler).
SAMPLER_FIX = "sampler-fix"
# Not a root cause: the fix for gpu-slower whose process was in cuDNN's autotuning (causes.autotune).
AUTOTUNE_FIX = "autotune-fix"
# Not a root cause: the fix for own-threads-cpu behind PyTorch's autograd thread (the backward pass's launches).
AUTOGRAD_CPU_FIX = "autograd-cpu-fix"
# Not a root cause: the fix for host-bound whose host time went mostly to compiling GPU code (causes.culprits).
COMPILE_FIX = "runtime-compile-fix"
# Not a root cause: the fix for host-bound whose host time went mostly to importing modules (causes.culprits).
IMPORTING_FIX = "importing-fix"
# Not a root cause: the fix for host-bound whose host time went mostly to talking to another process (multiprocessing).
IPC_FIX = "ipc-fix"
# Not a root cause: the fix for host-bound whose host time went mostly to a profiler (causes.culprits.host_work).
PROFILER_FIX = "profiler-fix"
# Not a root cause: the fix for host-bound whose host time went mostly to PyTorch's own code (causes.in_calls).
MODEL_HOST_FIX = "model-host-fix"
# Not a root cause: the fix for host-bound whose host time went mostly to PyTorch's CPU kernels (causes.in_calls).
CPU_OPS_FIX = "cpu-ops-fix"
# Not a root cause: the fix for host-bound whose host time went mostly to serialising data (causes.culprits.host_work).
SERIALISING_FIX = "serialising-fix"
DECOMPRESS_FIX = "decompress-fix"
COMPRESS_FIX = "compress-fix"
# Not a root cause: the fix for a network wait in sending (the peer slow to take the data), not in receiving.
NETWORK_SEND_FIX = "network-send-fix"
SEND_SYSCALLS = frozenset({"sendto", "sendmsg", "sendmmsg", "sendfile", "write", "writev"})  # on a socket
# Not a root cause: the fix for any wait whose wait-for path ran through a process group's communication thread.
COLLECTIVE_FIX = "collective-fix"
# Named from the process lifecycle: children started again and again in a slow phase.
SPAWNING = "spawning-processes"

CATALOGUE: dict[str, list[str]] = {
    OWN_WORKERS_CPU: [
        "{who} waited for a CPU {share}% of the time ({window}) behind the job's own worker processes ({holders}): "
        "run fewer workers than the CPUs the job may use (num_workers <= CPUs - 1, counting the main thread and the "
        "pin-memory thread), or give the job more CPUs; check the CPU mask (taskset -p, the container's cpuset).",
    ],
    OWN_THREADS_CPU: [
        "{who} waited for a CPU {share}% of the time ({window}) behind other threads of its own process ({holders}): "
        "size the thread pools that hold the CPUs to the CPUs the job may use, counting the feeding thread (the "
        "code line says which pool): PyTorch's intra-op threads (torch.set_num_threads; an explicit call overrides "
        "OMP_NUM_THREADS), a BLAS library's (OPENBLAS_NUM_THREADS or MKL_NUM_THREADS set before numpy is imported, "
        "or threadpoolctl).",
    ],
    AUTOGRAD_CPU_FIX: [
        "{who} waited for a CPU {share}% of the time ({window}) behind PyTorch's autograd thread ({holders}), which "
        "runs the backward pass and launches its kernels, the two taking turns on the CPUs the job may use: give "
        "the job another CPU (its CPU mask: taskset -p, the container's cpuset), or launch fewer kernels a step (a "
        "larger batch, fused ops with torch.compile, a CUDA graph); no thread pool to shrink here.",
    ],
    LOCK_OR_GIL: [
        "{who} slept {share}% of the time ({window}) waiting on {waker}, which was {doing}: pure-Python work in "
        "another thread holds the GIL (a GIL wait times out every 5 ms and asks again, so the holder seldom wakes "
        "it). Move it to a process (multiprocessing) or release the GIL (numpy/torch ops, C extensions), or make it "
        "yield (time.sleep(0) in its loop).",
    ],
    LOCK_CONVOY_FIX: [
        "{who} slept {share}% of the time ({window}) waiting on {waker}, whose pool takes one lock of the program's "
        "own in turn ({lock_own}) and holds it over its work: hold that lock only around the shared state's update "
        "(the lookup, the insert), do the slow work (decoding, inflating, IO) outside it, or split it (a lock per key "
        "or shard, a cache per thread).",
    ],
    LOCK_OVER_WORK_FIX: [
        "{who} slept {share}% of the time ({window}) on a lock of the program's own ({lock_own}) that {waker} held "
        "while it was {doing}: hold that lock only around the shared state's update (copy or swap what the slow work "
        "needs under it) and do the slow work (serialising, compressing, IO) outside it, or give each side its own "
        "copy so that neither waits on the other.",
    ],
    LOCK_HELD_FIX: [
        "{who} slept {share}% of the time ({window}) waiting on {waker}, which was {doing} while it held the lock "
        "(or the queue) the thread needed: hold a lock only around the shared state's update (never across a sleep, IO "
        "or a wait for others), or give each side its own copy so that neither waits on the other.",
    ],
    IO_WAIT: [
        "{who} slept in IO {share}% of the time ({window}): read the data ahead of the loop (DataLoader workers with "
        "prefetch_factor, a page-cache-warm or local copy of the dataset, larger sequential reads).",
    ],
    IO_WRITE_FIX: [
        "{who} slept in IO {share}% of the time ({window}) waiting for writes to reach the disk (fsync, or writes the "
        "device queue could not take): "
        "write from another thread or process (a checkpoint saved in the background, an async writer), write less "
        "often, or drop an fsync (or a rename over the old file, after which ext4 writes the new one's data out "
        "first) where durability at every write is not needed.",
    ],
    IO_RECLAIM_FIX: [
        "{who} slept {share}% of the time ({window}) while the kernel reclaimed memory for it or throttled it: "
        "give its cgroup more memory (memory.high / memory.max, the container's limit) or free host memory, and "
        "allocate less per step (reuse buffers and pinned staging memory instead of new ones each step).",
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
        "Copy through pinned host memory: pin_memory=True where a DataLoader makes the batches, tensor.pin_memory() "
        "once for buffers reused every step, a pinned buffer (torch.empty(..., pin_memory=True)) as the target of "
        "copies back from the GPU, filled with .copy_(x, non_blocking=True); pageable copies took {gbs} GB/s of "
        "call time here (a call's time includes any wait for the work queued before it).",
    ],
    PINNING_FIX: [
        "Pin host memory once and reuse it: allocate the staging buffer pinned (torch.empty(..., pin_memory=True), "
        "DataLoader pin_memory=True) or register it once before the loop (cudaHostRegister), instead of pinning and "
        "unpinning it around every transfer.",
    ],
    ALLOCATOR_CHURN: [
        "Keep the caching allocator warm: remove torch.cuda.empty_cache() from the loop, reuse buffers, use fixed or "
        "bucketed shapes, or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
    ],
    GPU_SLOWER: [
        "The host waited longer for the GPU and no other process was seen using it: profile the GPU side of the "
        "window ({window}) with nsys or torch.profiler to see which kernels grew.",
    ],
    AUTOTUNE_FIX: [
        "The GPU was busy with cuDNN's autotuning ({autotuning}, {window}): with torch.backends.cudnn.benchmark on, "
        "each convolution times its candidate kernels at every input shape not seen before, and shapes that keep "
        "changing (multi-scale inputs, variable lengths) keep it tuning. Where shapes vary, turn it off "
        "(torch.backends.cudnn.benchmark = False), or give the model a few fixed shapes (pad or bucket the inputs) so "
        "that each is tuned once, early.",
    ],
    GPU_BOUND: [
        "The GPU was busy all through {window}: the host was not the limit, and nothing on the host will make it "
        "faster. Profile the GPU side of that window (nsys, torch.profiler) to see which kernels took the time"
        "{more_work}.",
    ],
    LAUNCH_OVERHEAD: [
        "The CPU time is spent inside CUDA calls: fewer, larger launches (fuse ops, torch.compile, CUDA graphs).",
    ],
    DRIVER_LOCK: [
        "Allocate pinned host memory once, before the loop, and reuse it ({other} was in {other_op}): warm the "
        "pinned pool (a first batch through pin_memory), persistent_workers=True, or a pre-pinned staging buffer.",
    ],
    TIMED_SLEEP: [
        "{who} slept on a timer {share}% of the time ({window}): the program paces itself (time.sleep, a rate limit, "
        "polling). If that is not intended, find the sleep (py-spy dump shows where the thread waits).",
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
    HOST_BOUND: [
        "{who} spent {share}% of the time ({window}) running its own code between CUDA calls while the GPU waited: "
        "make that work cheaper (vectorised over whole batches, on the GPU where it can run), do it less often, or "
        "move it off the feeding thread (batch preparation into DataLoader workers, num_workers=N; other work into a "
        "thread or process of its own).",
    ],
    LOADING_FIX: [
        "{who} spent {share}% of the time ({window}) running its own code between CUDA calls while the GPU waited "
        "({loading}): move batch preparation off the main thread (DataLoader num_workers=N, persistent_workers=True, "
        "prefetch_factor=2-4), or vectorise it (index a whole batch at once, keep tensors on the GPU).",
    ],
    SAMPLER_FIX: [
        "{who} spent {share}% of the time ({window}) running its own code between CUDA calls while the GPU waited "
        "({sampling}): a DataLoader's sampler runs in the main process whatever num_workers, so more workers do not "
        "help; make its __iter__ cheap (what it draws from computed once, before the loop; an epoch's indices drawn "
        "at once, vectorised, and reused or sliced), or pass index lists made ahead as the batch_sampler.",
    ],
    READS_FIX: [
        "{who} spent {share}% of the time ({window}) running its own code between CUDA calls, and read {reads} "
        "values back to the host an iteration, each a copy and a wait: gather those values on the GPU (torch.stack, "
        "torch.cat) and read them at once, or every N iterations; where the loop needs each value at once (a "
        "token's end check), check every N iterations or capture the step in a CUDA graph.",
    ],
    COPIES_FIX: [
        "{who} spent {share}% of the time ({window}) running its own code between CUDA calls, and moved each batch to "
        "the GPU in {copies} copies an iteration, each issued and waited for: build the batch on the CPU (torch.stack "
        "or a collate_fn, in pinned memory: DataLoader pin_memory=True) and copy it once with non_blocking=True; move "
        "its preparation off the main thread (DataLoader num_workers=N).",
    ],
    CHILD_RUN_FIX: [
        "{who} slept {share}% of the time ({window}) until a program it ran, {waker}, finished ({child_run}): the "
        "loop stops for the whole run of it. Start it without waiting (subprocess.Popen, collected later), run it less "
        "often, or keep one long-lived process fed over a queue instead of a new one each time.",
    ],
    PACED_FIX: [
        "{who} slept {share}% of the time ({window}) until {waker} woke it; {waker} was {doing}: it sleeps on its own "
        "timer between what it hands over, so the pace is chosen there (a rate limit, a poll interval, requests that "
        "come when they come). Shorten or remove that sleep if the pace is not meant; a server waiting for requests "
        "is idle, not slow.",
    ],
    COMPILE_FIX: [
        "{who} spent {share}% of the time ({window}) on host work while the GPU waited ({compiling}): GPU code "
        "compiled as the job runs, again for each new shape or dtype (attention and fused kernels are built per "
        "shape). Keep shapes few: pad or bucket variable lengths to a handful of sizes, warm each one up before "
        "timing, and keep the process (and its kernel caches) alive between runs.",
    ],
    IPC_FIX: [
        "{who} spent {share}% of the time ({window}) on host work while the GPU waited ({ipc}): every access to an "
        "object shared through multiprocessing (a Manager's dict or list, a Queue, a Pipe) is pickled, sent to "
        "another process and waited for. Touch it less often (keep counters and losses local, publish them every N "
        "steps in one update), or share state without a round trip (shared memory, a multiprocessing.Value).",
    ],
    TENSOR_TEXT_FIX: [
        "{who} spent {share}% of the time ({window}) on host work while the GPU waited ({tensor_text}): a GPU tensor "
        "put into text (a log message's argument, an f-string, print) is copied back to the host, a synchronisation "
        "each time, and formatted in Python, every step. Log plain numbers read once (loss.item() after the "
        "step; torch.stack(values).tolist() for several), and log every N steps; keep tensors out of log messages.",
    ],
    IMPORTING_FIX: [
        "{who} spent {share}% of the time ({window}) on host work while the GPU waited ({importing}): Python loading "
        "modules as the job runs. Import what the loop uses once, at start-up, not inside the step or a function it "
        "calls for the first time mid-run; a process started for each piece of work pays its imports each time.",
    ],
    PROFILER_FIX: [
        "{who} spent {share}% of the time ({window}) on host work while the GPU waited ({profiling}): a profiler left "
        "on charges every step for its records and every cycle for the trace it builds and writes. Profile a few "
        "steps on purpose (torch.profiler.schedule(..., repeat=1), or a short run) and train without it; where it "
        "must stay on, drop record_shapes, profile_memory and with_stack, and write traces less often.",
    ],
    MODEL_HOST_FIX: [
        "{who} spent {share}% of the time ({window}) on the model's own host work while the GPU waited ({framework}): "
        "the cost of issuing the model's many small kernels one by one. Give the GPU fewer, larger pieces: a larger "
        "batch, fused ops (torch.compile), the step captured in a CUDA graph "
        "(torch.compile(mode=\"reduce-overhead\")).",
    ],
    CPU_OPS_FIX: [
        "{who} spent {share}% of the time ({window}) on host work while the GPU waited ({cpu_ops}): math on tensors "
        "kept on the CPU (an optimiser's step, metrics, post-processing). Keep those tensors on the GPU (metrics: "
        "compute them there and read them every N steps); where they must stay on the CPU, use the fused or foreach "
        "implementation (an offloaded optimiser: a vectorised CPU Adam) and overlap it with the GPU's next step.",
    ],
    SERIALISING_FIX: [
        "{who} spent {share}% of the time ({window}) serialising data while the GPU waited ({serialising}): a "
        "checkpoint or a cache written (or read) on the thread that feeds the GPU stops the training for as long. "
        "Copy the state out and save it from another thread or process (torch.distributed.checkpoint's async_save "
        "does both), save less often, or save less (the model without the optimiser's state between full saves).",
    ],
    COMPRESS_FIX: [
        "{who} spent {share}% of the time ({window}) compressing data while the GPU waited ({compressing}): output "
        "written compressed (a PNG, a gzip file, a compressed save) on the thread that feeds the GPU. Use a lower "
        "level (PNG compress_level=1, gzip level 1) or a faster codec (lz4, zstd at a low level), write "
        "uncompressed what only the job reads back, or compress in another thread or process.",
    ],
    DECOMPRESS_FIX: [
        "{who} spent {share}% of the time ({window}) decompressing data while the GPU waited ({decompressing}): data "
        "stored compressed is inflated again each time it is read. Store it uncompressed (np.save, not savez_"
        "compressed; an uncompressed shard format) or with a fast codec (lz4, zstd at a low level), decompress it "
        "once into a local cache, or do it in DataLoader workers, off the thread that feeds the GPU.",
    ],
    COLLECTIVE_FIX: [
        "{who} spent {share}% of the time ({window}) waiting on the job's collective communication ({collective}): "
        "an all-reduce ends only when every rank's part has arrived, and gloo runs it on the CPU, so a slow or "
        "CPU-starved rank holds up all of them. For GPU tensors use the NCCL backend (the all-reduce runs on the "
        "GPU); give each rank CPUs of its own beyond its communication threads; reduce less often (gradient "
        "accumulation under DDP's no_sync(), larger buckets: bucket_cap_mb).",
    ],
    WORKER_GIL_FIX: [
        "{who} slept {share}% of the time ({window}) waiting on a process whose own thread {waker} held its GIL, most "
        "likely ({waker} was {doing}; the process's timed waits lasted the GIL's 5 ms switch interval): move that "
        "thread's pure-Python work out of the process (a thread running Python keeps "
        "the GIL from the others for the switch interval, 5 ms, at every turn) or make it release the GIL (numpy, "
        "I/O). More workers of the same kind will not help.",
    ],
    INPUT_WAIT: [
        "{who} slept {share}% of the time ({window}) waiting for its workers: the workers cannot keep up.",
    ],
    WORKERS_TURNS_FIX: [
        "{who} slept {share}% of the time ({window}) waiting for its worker processes, which took turns: each slept "
        "{workers_turns}% of that time{workers_turns_in} until another of them woke it, queued for something they "
        "share (a lock around their reads such as fcntl.flock or a multiprocessing.Lock, or one file or connection), "
        "so more of them will not help. Give each worker its own (open files and connections in each worker, e.g. in "
        "a DataLoader's worker_init_fn) and take no lock around reads of data no one writes.",
    ],
    WORKERS_SERVER_FIX: [
        "{who} slept {share}% of the time ({window}) waiting for its worker processes, which themselves waited on "
        "{workers_server}: each slept {workers_turns}% of that time{workers_turns_in} until it answered. One process "
        "that all of them ask (a multiprocessing.Manager's server behind a dict, list or queue proxy; a cache or "
        "database server) answers them in turn, so more workers will not help. Keep what they share where each reads "
        "it directly (a tensor in shared memory, a memory-mapped file, a copy in each worker), or ask for a whole "
        "batch at once rather than for each sample.",
    ],
    WORKERS_FIX: [
        "{who} slept {share}% of the time ({window}) waiting for its worker processes: they cannot keep up. "
        "Make their per-item work cheaper, or run more of them if CPUs are free; where the job asks for one item at a "
        "time (a request over a socket or a pipe), ask for the next before using this one, so that their work overlaps "
        "the step. If they are a PyTorch DataLoader's: more num_workers, a larger prefetch_factor, "
        "persistent_workers=True.",
    ],
    COLD_START: [
        "Start-up cost: warm up before timing or serving (one step or a dummy batch through every code path) and "
        "exclude it from latency figures; the slowest first launch took {slowest_ms} ms.",
        "If start-up itself matters: CUDA_MODULE_LOADING=EAGER moves module loading to context creation; keep the "
        "process alive between jobs.",
    ],
    GPU_SHARED: [
        "{who} waited longer for the GPU ({window}) while another process used it: run the other job on another GPU, "
        "isolate them (MIG, MPS), or schedule them apart.",
    ],
    WAITING_ON_THREAD: [
        "{who} slept {share}% of the time ({window}) until {waker} finished its work ({doing}): that work sets the "
        "pace. Make it smaller per step or overlap it with the main thread's (py-spy dump shows what {waker} runs).",
    ],
    SLOW_CONSUMER: [
        "{who} blocked {share}% of the time ({window}) writing to a pipe whose reader, {waker}, is slow ({doing}): "
        "log less per step, log asynchronously (a QueueHandler and a thread that drops when behind), or make the "
        "reader drain faster; a larger pipe buffer (fcntl F_SETPIPE_SZ) only delays the stall.",
    ],
    NETWORK_WAIT: [
        "{who} waited {share}% of the time ({window}) on data that came over the network ({waker}: {doing}): fetch "
        "ahead (more DataLoader workers or a deeper prefetch_factor, concurrent requests per worker), cache the data "
        "locally, or fix the slow server.",
    ],
    NETWORK_SEND_FIX: [
        "{who} waited {share}% of the time ({window}) to send over the network ({waker}: {doing}): the receiver did "
        "not take the data as fast as the thread sent it. Send from another thread or process (a queue the loop only "
        "puts to), send less often or in batches, or fix the slow receiver.",
    ],
    CPU_THROTTLED: [
        "{who} was runnable but held off the CPU {share}% of the time ({window}) by its cgroup's CPU quota "
        "({cgroup}: {quota}; {throttled}): raise the quota (cpu.max / the container's CPU limit, "
        "e.g. Kubernetes limits.cpu) or remove it; it is not other tasks taking the CPU.",
    ],
    CPU_IDLE_WAIT: [
        "{who} was runnable but not running {share}% of the time ({window}) while the CPU it waited on was idle: look "
        "for a CPU quota (cat /sys/fs/cgroup/<its cgroup>/cpu.max, the container's CPU limit) or an affinity mask "
        "(taskset -p) that keeps it off the idle CPUs; record with a collector of schema v5 to sample the quota.",
    ],
    LAUNCH_BOUND: [
        "The host issued {per_iteration} launches+copies per iteration ({window}) vs {base_per_iteration} in the "
        "healthy baseline while the GPU was {gpu}% busy: the work came in more, smaller pieces (micro-batches, a "
        "smaller batch, unfused ops). Use larger batches per step, fuse ops (torch.compile), or capture the step in "
        "a CUDA graph.",
    ],
    EXCESS_SYNC: [
        "The host synchronised with the GPU {per_iteration} times per iteration ({window}) vs {base_per_iteration} in "
        "the healthy baseline: each sync empties the GPU's queue. Remove per-layer torch.cuda.synchronize(), "
        ".item(), .cpu() and print(tensor) from the loop (log every N steps), or use CUDA events for timing.",
    ],
    SPAWNING: [
        "{who} started {spawned} child processes ({child}, {spawn_rate}/s, each living a median {life_ms} ms) in "
        "{window} and paid for each (fork, start-up, waiting for it): start them once and keep them. A DataLoader: "
        "persistent_workers=True and one iterator across epochs; a command run per step (nvidia-smi, a shell hook): "
        "read the value in-process (NVML through nvidia-ml-py, psutil) or every N steps.",
    ],
    UNEXPLAINED: [
        "The store does not say what {who} was doing off-CPU ({window}): record with the current collector (it "
        "splits every off-CPU interval into sleeping and waiting for a CPU).",
    ],
}


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def io_fix(cause: str, numbers: Mapping[str, object]) -> str:
    """The catalogue entry for a chain's fixes: a wait through a process group's communication thread the
    collective's fix; an io-wait in writes (its system call, or a wait-for walk that
    ended in fsync) gets the writing fix, one spent reclaiming memory the memory fix, a lock whose holder slept
    holding it the lock's fix (not the GIL's), a wait on workers whose own thread held their GIL the GIL's fix (not
    more workers), on workers not known to be a DataLoader's (numbers' `loader`) the workers' fix; any other cause its
    own."""
    if numbers.get("collective"):
        return COLLECTIVE_FIX
    if cause == LOCK_OR_GIL and numbers.get("lock_held") == "running":
        return LOCK_OVER_WORK_FIX
    if cause == LOCK_OR_GIL and numbers.get("lock_held") == "asleep":
        return LOCK_HELD_FIX
    if cause == LOCK_OR_GIL and numbers.get("lock_own"):
        return LOCK_CONVOY_FIX
    if cause in (WAITING_ON_THREAD, WAITING_ON_PROCESS) and numbers.get("paced"):
        return PACED_FIX
    if cause == WAITING_ON_PROCESS and numbers.get("child_run"):
        return CHILD_RUN_FIX
    if cause == GPU_SLOWER and numbers.get("autotuning"):
        return AUTOTUNE_FIX
    if cause == HOST_BOUND and numbers.get("profiling"):
        return PROFILER_FIX
    if cause == HOST_BOUND and numbers.get("compiling"):
        return COMPILE_FIX
    if cause == HOST_BOUND and numbers.get("importing"):
        return IMPORTING_FIX
    if cause == HOST_BOUND and numbers.get("ipc"):
        return IPC_FIX
    if cause == HOST_BOUND and numbers.get("tensor_text"):
        return TENSOR_TEXT_FIX
    if cause == HOST_BOUND and numbers.get("cpu_ops"):
        return CPU_OPS_FIX
    if cause == HOST_BOUND and numbers.get("compressing"):
        return COMPRESS_FIX
    if cause == HOST_BOUND and numbers.get("decompressing"):
        return DECOMPRESS_FIX
    if cause == HOST_BOUND and numbers.get("serialising"):
        return SERIALISING_FIX
    if cause == HOST_BOUND and numbers.get("reads"):
        return READS_FIX
    if cause == HOST_BOUND and numbers.get("sampling"):
        return SAMPLER_FIX
    if cause == HOST_BOUND and numbers.get("loading"):
        return LOADING_FIX
    if cause == HOST_BOUND and numbers.get("copies"):
        return COPIES_FIX
    if cause == OWN_THREADS_CPU and numbers.get("autograd"):
        return AUTOGRAD_CPU_FIX
    if cause == HOST_BOUND and numbers.get("framework"):
        return MODEL_HOST_FIX
    if cause == INPUT_WAIT and numbers.get("worker_gil"):
        return WORKER_GIL_FIX
    if cause == INPUT_WAIT and numbers.get("workers_server"):
        return WORKERS_SERVER_FIX
    if cause == INPUT_WAIT and numbers.get("workers_turns"):
        return WORKERS_TURNS_FIX
    if cause == INPUT_WAIT and not numbers.get("loader"):
        return WORKERS_FIX
    if cause == NETWORK_WAIT and numbers.get("syscall") in SEND_SYSCALLS:
        return NETWORK_SEND_FIX
    if cause == IO_WAIT and numbers.get("io_stop") == "reclaim":
        return IO_RECLAIM_FIX
    if cause == IO_WAIT and (numbers.get("syscall") in WRITE_SYSCALLS
                             or numbers.get("io_stop") in ("fsync", "writeback", "discard")):
        return IO_WRITE_FIX
    return cause


def workers_advice(numbers: Mapping[str, object]) -> str:
    """What to do about DataLoader workers that do not keep up, from what is known of them: busy all the time (a
    deeper prefetch does not help workers that never wait), idle part of it, started anew in the window (then, and
    only then, persistent_workers), decompressing data (a codec's fix), starting up (importing modules: not more of
    them, which start alike)."""
    busy = numbers.get("workers_busy")
    if numbers.get("workers_importing"):
        return ("Each new worker imports the program and its libraries before its first batch (the spawn or "
                "forkserver start method re-runs the script's imports), and more of them start alike. Keep them "
                "alive between epochs (persistent_workers=True), start them once before the loop, and keep the "
                "script's top level light (heavy imports and setup under if __name__ == '__main__':).")
    work = (f" They spent it decompressing data ({numbers['workers_decompressing']}): store the data uncompressed "
            "or with a fast codec (lz4, zstd at a low level), or decompress it once into a local cache, where every "
            "epoch inflates it again." if numbers.get("workers_decompressing") else "")
    if busy is None:
        advice = ("Add workers if CPUs are free, make per-sample work cheaper (the evidence says where the workers' "
                  "time went), or raise prefetch_factor.")
    elif float(str(busy)) >= 90:
        advice = (f"They ran {busy}% of that time, never short of work: run more of them where CPUs are free, or make "
                  "per-sample work cheaper (the evidence says where their time went); a larger prefetch_factor does "
                  "not help workers that never wait.")
    else:
        advice = (f"They ran {busy}% of that time: raise prefetch_factor (batches made ahead while they would idle), "
                  "run more of them where CPUs are free, or make per-sample work cheaper.")
    advice += work
    anew = int(str(numbers.get("workers_restarted") or 0))
    if anew:
        advice += (f" {anew} were started anew within the window after others exited: keep them alive between "
                   "epochs (persistent_workers=True).")
    return advice


def recommend(cause: str, numbers: Mapping[str, object]) -> list[str]:
    """The catalogue's recommendations for a root cause, citing the given numbers."""
    got = [text.format_map(_Missing(numbers)) for text in CATALOGUE.get(cause, [])]
    if cause == INPUT_WAIT and got:
        if numbers.get("workers_importing"):  # busy, but with their own start-up: not short of hands
            got[0] = got[0].replace("the workers cannot keep up.",
                                    f"the workers were starting up ({numbers['workers_importing']}).")
        got[0] += " " + workers_advice(numbers)
    return got
