"""natural_stream_prefetcher_thread (natural, nothing staged; a control): a healthy, well-written input pipeline in
front of a GPU-heavy conv net. The data: 2,048 images (3x128x128 uint8) and their labels held in page-locked (pinned)
host memory. A Python thread of the job's process (threading's name and OS name `h2d_prefetch`) prepares the batches
ahead: for each it draws 256 random indices, gathers those images with torch.index_select into one of six pinned staging
buffers (after waiting on the CUDA event of that buffer's last copy, so that a buffer is never overwritten while it is
being copied), copies the batch and its labels to the GPU with non_blocking=True on a torch.cuda.Stream of its own,
records a CUDA event on that stream and puts (images, labels, event) on a queue.Queue(maxsize=3). The main thread get()s
a batch, makes its compute stream wait for the copy (torch.cuda.current_stream().wait_event, and record_stream on the
tensors so that the allocator keeps them until the step is done), converts and normalises the images on the GPU and
trains a ResNet-style conv net (a 3x3 stem to 64 channels, then four stages of two 3x3 conv+BatchNorm+ReLU blocks with
residuals at 64, 128, 256, 512 channels, strided at each stage, global pooling, a linear head; bf16 autocast,
channels_last, SGD with momentum and Nesterov), reading the loss with loss.item() every 10 steps. The prefetcher keeps
up easily (a batch's gather is a few ms of CPU, its copy ~13 MB over PCIe, against tens of ms of GPU work a step), so
the GPU stays busy and the main thread waits on the GPU, not on the queue. One process on CPUs 2-3, no workers, no
children, no IO, no sleep of its own (get() and put() wait without a timeout). 20 s. The script measures itself: the
steps per second; the main thread's time in get() (wall, and its CPU time there), queueing the steps and in loss.item();
its time on a CPU and waiting for one (/proc/thread-self/schedstat) over the run; the prefetch thread's CPU time and
run-queue wait (its schedstat), its time gathering, queueing copies, waiting on a staging buffer's event and blocked in
put() (the queue full: it is ahead); the process's minor page faults and the device allocator's cudaMalloc calls; and a
step's GPU time queued (common.gpu_seconds_queued: the normalisation, forward, backward and optimiser step from a batch
already on the GPU), so that the GPU's busy share is known. Truth `prefetcher` names the thread (pid, tid, comm)."""

import os
import queue
import resource
import threading
import time

from common import Scenario, gpu_seconds_queued, set_thread_name

sc = Scenario("natural_stream_prefetcher_thread", "natural", "a ResNet-style conv net (bf16) fed by a prefetch thread "
              "gathering batches from pinned memory and copying them on its own CUDA stream, a queue of 3, GPU-bound, "
              "20 s, nothing staged: a control", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

nn = torch.nn
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
NIMG, SIDE, BATCH, WIDTHS, DEPTH_Q, STAGING, LOG_EVERY = (
    (2048, 128, 256, (64, 128, 256, 512), 3, 6, 10) if sc.cuda else (256, 32, 16, (8, 16, 16, 32), 3, 6, 10))
NCLASS = 1000

torch.manual_seed(0)
images = torch.randint(0, 256, (NIMG, 3, SIDE, SIDE), dtype=torch.uint8)
labels = torch.randint(0, NCLASS, (NIMG,))
if sc.cuda:
    images, labels = images.pin_memory(), labels.pin_memory()
mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255


class Prefetcher:
    """Gathers batches into pinned staging buffers and copies them to the GPU on its own stream, DEPTH_Q ahead."""

    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue(maxsize=DEPTH_Q)
        self.stream = torch.cuda.Stream() if sc.cuda else None
        self.bufs = [(torch.empty((BATCH, 3, SIDE, SIDE), dtype=torch.uint8, pin_memory=sc.cuda),
                      torch.empty((BATCH,), dtype=torch.long, pin_memory=sc.cuda)) for _ in range(STAGING)]
        self.done: list = [None] * STAGING  # the event of each buffer's last copy
        self.stats = {"batches": 0, "gather_s": 0.0, "copy_s": 0.0, "buf_wait_s": 0.0, "put_s": 0.0}
        self.info: dict = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="h2d_prefetch", daemon=True)

    def run(self) -> None:
        set_thread_name("h2d_prefetch")
        self.info.update(tid=threading.get_native_id(), comm="h2d_prefetch")
        gen = torch.Generator().manual_seed(1)
        k = 0
        while not self.stop.is_set():
            slot = k % STAGING
            k += 1
            t0 = time.perf_counter()
            if self.done[slot] is not None:
                self.done[slot].synchronize()
            t1 = time.perf_counter()
            idx = torch.randint(0, NIMG, (BATCH,), generator=gen)
            xb, yb = self.bufs[slot]
            torch.index_select(images, 0, idx, out=xb)
            torch.index_select(labels, 0, idx, out=yb)
            t2 = time.perf_counter()
            if self.stream is not None:
                with torch.cuda.stream(self.stream):
                    x = xb.to(dev, non_blocking=True)
                    y = yb.to(dev, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(self.stream)
                self.done[slot] = ev
            else:
                x, y, ev = xb.clone(), yb.clone(), None
            t3 = time.perf_counter()
            while not self.stop.is_set():
                try:
                    self.q.put((x, y, ev), timeout=1.0)  # the timeout only so that stop() is seen at the end
                    break
                except queue.Full:
                    continue
            t4 = time.perf_counter()
            s = self.stats
            s["batches"] += 1
            s["buf_wait_s"] += t1 - t0
            s["gather_s"] += t2 - t1
            s["copy_s"] += t3 - t2
            s["put_s"] += t4 - t3

    def get(self) -> tuple:
        x, y, ev = self.q.get()
        if ev is not None:
            cur = torch.cuda.current_stream()
            cur.wait_event(ev)
            x.record_stream(cur)
            y.record_stream(cur)
        return x, y


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(h)) + self.skip(x))


def resnet() -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, WIDTHS[0], 3, 1, 1, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU()]
    cin = WIDTHS[0]
    for i, w in enumerate(WIDTHS):
        layers += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
        cin = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, NCLASS))


model = resnet().to(dev, memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-5)
own = {"steps": 0, "get_s": 0.0, "get_cpu_s": 0.0, "issue_s": 0.0, "item_s": 0.0, "running_loss": 0.0}


def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = ((x.float() - mean) / std).contiguous(memory_format=torch.channels_last)
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def step() -> None:
    t0, c0 = time.perf_counter(), time.thread_time()
    x, y = pf.get()
    t1, c1 = time.perf_counter(), time.thread_time()
    loss = train(x, y)
    t2 = t3 = time.perf_counter()
    own["steps"] += 1
    if own["steps"] % LOG_EVERY == 0:
        own["running_loss"] += loss.item()
        t3 = time.perf_counter()
    own["get_s"] += t1 - t0
    own["get_cpu_s"] += c1 - c0
    own["issue_s"] += t2 - t1
    own["item_s"] += t3 - t2


def schedstat(tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


pf = Prefetcher()
pf.thread.start()
try:
    for _ in range(30):  # warm-up: cuDNN's algorithms, the allocator, the staging buffers' first copies
        step()
    sync()
    gpu_step_s = None
    if sc.cuda:
        gx, gy = pf.get()
        gx, gy = gx.clone(), gy.clone()
        sync()

        def work(_) -> None:
            """One step's GPU work from a batch already on the GPU, nothing read back."""
            train(gx, gy)

        runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    warm_end = time.perf_counter() + 1.5 * sc.scale  # the spin kernels well before the run
    while time.perf_counter() < warm_end:
        step()
    sync()
    for k in own:
        own[k] = 0 if k == "steps" else 0.0
    for k in pf.stats:
        pf.stats[k] = 0 if k == "batches" else 0.0
    ptid = pf.info["tid"]
    main0, pre0 = schedstat(MAIN), schedstat(ptid)
    f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    main1, pre1 = schedstat(MAIN), schedstat(ptid)
    f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
    pstats = dict(pf.stats)
finally:
    pf.stop.set()
    pf.thread.join(10)
n = own["steps"]


def diff(a, b, k: int) -> float | None:
    return round(b[k] - a[k], 4) if a is not None and b is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


main_run, main_wait = diff(main0, main1, 0), diff(main0, main1, 1)
main_asleep = max(0.0, wall - main_run - (main_wait or 0.0)) if main_run is not None else None
pre_run, pre_wait = diff(pre0, pre1, 0), diff(pre0, pre1, 1)
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["prefetcher"] = {"pid": PID, "tid": pf.info.get("tid"), "comm": pf.info.get("comm")}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "get_share": share(own["get_s"]), "get_cpu_share": share(own["get_cpu_s"]),
                    "issue_share": share(own["issue_s"]), "item_share": share(own["item_s"]),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "main_asleep_s": round(main_asleep, 4) if main_asleep is not None else None,
                    "main_asleep_share": share(main_asleep),
                    "prefetch_tid": pf.info.get("tid"), "prefetch_comm": pf.info.get("comm"),
                    "prefetch_run_s": pre_run, "prefetch_cpu_share": share(pre_run),
                    "prefetch_cpu_wait_s": pre_wait, "prefetch_cpu_wait_share": share(pre_wait),
                    "prefetch_batches": pstats["batches"],
                    **{f"prefetch_{k}": round(v, 4) for k, v in pstats.items() if k != "batches"},
                    "prefetch_put_share": share(pstats["put_s"]),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": BATCH, "side": SIDE, "queue_depth": DEPTH_Q,
                    "mean_loss": round(own["running_loss"] / max(n // LOG_EVERY, 1), 4)}
if not sc.cuda:
    sc.note("a small net on the CPU: no pinned memory, no stream, no GPU timings.")
sc.note(f"natural, a control: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['get_s']:.3f} "
        f"s in get(), {own['issue_s']:.2f} s queueing the steps, {own['item_s']:.2f} s in .item(); the main thread ran "
        f"{main_run} s, waited for a CPU {main_wait} s; h2d_prefetch ran {pre_run} s, blocked in put() "
        f"{pstats['put_s']:.2f} s for {pstats['batches']} batches; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
