"""natural_thread_pool_augment (natural, nothing staged): a vision script that skips the DataLoader and augments with a
thread pool of its own: concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="augment") whose tasks each build
one sample with numpy from an in-memory pool of 256 images (3x144x144 uint8): a random 128x128 crop, a random
horizontal flip, to float32, a gamma and a colour jitter, a blur (three 3x3 box passes), sensor noise and a
normalisation (numpy releases the GIL in its loops). The main thread submits a batch's tasks (128 samples), gathers
them (f.result()), submits the next
batch's (one batch of prefetch), stacks the samples, copies the batch to the GPU (from pageable memory, as written) and
trains a small conv net (four strided 3x3 convolutions with BatchNorm, bf16 autocast, SGD with momentum, loss.item()
each step). The pool's threads are named augment_0..3 (the OS name too, set in the pool's initializer). CPUs 2-5 for
the whole process, 20 s. The script measures itself: the main thread's time in f.result() (waiting for the pool), in
stacking and copying, in its steps; the pool's tasks' wall and CPU time (thread_time); truth `pool` (the threads'
tids and names)."""

import concurrent.futures
import threading
import time

import numpy as np

from common import Scenario, set_thread_name

sc = Scenario("natural_thread_pool_augment", "natural", "a conv net fed by a 4-thread ThreadPoolExecutor augmenting "
              "images with numpy (crop, flip, gamma, jitter, blur, noise, normalise), one batch prefetched, 20 s, "
              "nothing staged", job_cpus=[2, 3, 4, 5], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
NIMG, SIDE, CROP, NCLASS, THREADS = 256, 144, 128, 100, 4
BATCH, WIDTHS = (128, (32, 64, 128, 256)) if sc.cuda else (16, (8, 16, 32, 32))
MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)

rng0 = np.random.default_rng(0)
images = [rng0.integers(0, 256, (3, SIDE, SIDE), dtype=np.uint8) for _ in range(NIMG)]
labels = rng0.integers(0, NCLASS, NIMG)
local = threading.local()
pool_threads: dict[int, str] = {}
pool_lock = threading.Lock()
task_lock = threading.Lock()
tasks = {"n": 0, "wall_s": 0.0, "cpu_s": 0.0, "measure": False}
counter = [0]


def name_thread() -> None:
    """The pool's initializer: each thread's OS name (the Python name is augment_K already), a generator of its own."""
    with pool_lock:
        k = len(pool_threads)
        pool_threads[threading.get_native_id()] = f"augment_{k}"
    set_thread_name(f"augment_{k}")
    local.rng = np.random.default_rng(1000 + k)


def make_sample(i: int) -> tuple[np.ndarray, int]:
    t0, c0 = time.perf_counter(), time.thread_time()
    rng = local.rng
    img = images[i % NIMG]
    top, left = rng.integers(0, SIDE - CROP + 1, 2)
    x = img[:, top:top + CROP, left:left + CROP]
    if rng.random() < 0.5:
        x = x[:, :, ::-1]
    x = x.astype(np.float32) * np.float32(1 / 255)
    x **= np.float32(rng.uniform(0.7, 1.4))  # gamma (contrast) jitter
    x *= rng.uniform(0.8, 1.2, (3, 1, 1)).astype(np.float32)  # brightness per channel
    x += np.float32(rng.uniform(-0.1, 0.1))
    for _ in range(3):  # a Gaussian blur, approximated by three box passes
        c = x[:, 1:-1, 1:-1]
        x[:, 1:-1, 1:-1] = (x[:, :-2, 1:-1] + x[:, 2:, 1:-1] + x[:, 1:-1, :-2] + x[:, 1:-1, 2:] + c) * 0.2
    x += rng.standard_normal(x.shape, dtype=np.float32) * np.float32(0.02)
    np.clip(x, 0.0, 1.0, out=x)
    x -= MEAN
    x /= STD
    if tasks["measure"]:
        with task_lock:
            tasks["n"] += 1
            tasks["wall_s"] += time.perf_counter() - t0
            tasks["cpu_s"] += time.thread_time() - c0
    return x, int(labels[i % NIMG])


def conv_net() -> torch.nn.Module:
    layers, cin = [], 3
    for w in WIDTHS:
        layers += [torch.nn.Conv2d(cin, w, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(w), torch.nn.ReLU()]
        cin = w
    return torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(cin, NCLASS))


torch.manual_seed(0)
model = conv_net().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="augment", initializer=name_thread)
own = {"wait_s": 0.0, "stack_copy_s": 0.0, "step_s": 0.0, "steps": 0}


def submit() -> list:
    first = counter[0]
    counter[0] += BATCH
    return [pool.submit(make_sample, i) for i in range(first, first + BATCH)]


pending = [submit()]


def step() -> None:
    t0 = time.perf_counter()
    samples = [f.result() for f in pending[0]]
    t1 = time.perf_counter()
    pending[0] = submit()  # the next batch is made while this one trains
    x = torch.from_numpy(np.stack([s[0] for s in samples])).to(dev)
    y = torch.tensor([s[1] for s in samples]).to(dev)
    t2 = time.perf_counter()
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    loss.item()
    t3 = time.perf_counter()
    own["wait_s"] += t1 - t0
    own["stack_copy_s"] += t2 - t1
    own["step_s"] += t3 - t2
    own["steps"] += 1


for _ in range(15):
    step()
if sc.cuda:
    torch.cuda.synchronize()
own.update(wait_s=0.0, stack_copy_s=0.0, step_s=0.0, steps=0)
tasks["measure"] = True
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
b1 = sc.mark("end")
wall = time.perf_counter() - t
tasks["measure"] = False
pool.shutdown(wait=True, cancel_futures=True)
nt = max(tasks["n"], 1)
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(own["steps"] / wall, 2),
                    "wait_share": round(own["wait_s"] / wall, 4),
                    "stack_copy_share": round(own["stack_copy_s"] / wall, 4),
                    "step_share": round(own["step_s"] / wall, 4),
                    "samples_made": tasks["n"], "task_wall_s": round(tasks["wall_s"], 4),
                    "task_cpu_s": round(tasks["cpu_s"], 4),
                    "task_ms_wall": round(tasks["wall_s"] / nt * 1e3, 4),
                    "task_ms_cpu": round(tasks["cpu_s"] / nt * 1e3, 4),
                    "pool_busy_share": round(tasks["wall_s"] / (THREADS * wall), 4),
                    "batch": BATCH, "threads": THREADS}
sc.extra["pool"] = {"pid": sc.feeder["pid"], "tids": sorted(pool_threads), "comms": [pool_threads[k] for k in
                                                                                       sorted(pool_threads)]}
sc.note(f"natural: measured by the script over the run: {own['steps']} steps, {own['wait_s']:.2f} s in f.result() "
        f"(waiting for the pool), {own['stack_copy_s']:.2f} s stacking and copying, {own['step_s']:.2f} s in steps, of "
        f"{wall:.2f} s; the pool's {tasks['n']} tasks took {tasks['wall_s']:.2f} s of wall and {tasks['cpu_s']:.2f} s "
        f"of CPU ({tasks['wall_s'] / nt * 1e3:.2f} ms a sample).")
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
