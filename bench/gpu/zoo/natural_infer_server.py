"""natural_infer_server (natural, nothing staged): an online inference server as one is first written: a client thread
in the same process makes requests (one 512-feature sample each, Poisson arrivals at ~250/s, a rate the GPU serves
with ease) and puts them on a queue.Queue; the main thread takes the first request that arrived (queue.get), waits at
most 2 ms for more (dynamic batching, up to 32), runs an MLP's forward pass under torch.inference_mode on the GPU,
copies the probabilities back and completes each request's Future. CPUs 2-3, 20 s. The script measures itself: the
server thread's time waiting for a first request (idle), in its batching window, and serving (with the forward passes'
GPU time from CUDA events), the requests served and their latency. Steps are requests served. Nothing is slow: the
server waits for input most of the time, and a true report blames nothing else."""

import queue
import threading
import time
from concurrent.futures import Future

import numpy as np

from common import Scenario

sc = Scenario("natural_infer_server", "natural", "an online inference server with dynamic batching, fed by a client "
              "thread's Poisson arrivals (~250/s), 20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

dev = torch.device(sc.device)
DIM, WIDTH, NCLASS = 512, (2048 if sc.cuda else 64), 10
RATE, MAX_BATCH, MAX_WAIT, SECONDS = 250.0, 32, 0.002, 20.0 * sc.scale
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(DIM, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, WIDTH),
                            torch.nn.GELU(), torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(),
                            torch.nn.Linear(WIDTH, NCLASS)).to(dev).eval()
requests: queue.Queue = queue.Queue()
go = threading.Event()
own = {"idle_s": 0.0, "batch_wait_s": 0.0, "serve_s": 0.0, "gpu_s": 0.0, "requests": 0, "batches": 0}
latencies: list[float] = []
client_out: dict = {}


class Request:
    __slots__ = ("x", "t", "future")

    def __init__(self, x: np.ndarray) -> None:
        self.x, self.t, self.future = x, time.perf_counter(), Future()


def client() -> None:
    """Open loop: a request at each Poisson arrival for SECONDS after go, then None (the end)."""
    client_out["tid"] = threading.get_native_id()
    rng = np.random.default_rng(1)
    futures = []
    go.wait()
    t = time.perf_counter()
    end = t + SECONDS
    while True:
        t += rng.exponential(1.0 / RATE)
        if t >= end:
            break
        delay = t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        r = Request(rng.standard_normal(DIM, dtype=np.float32))
        futures.append(r.future)
        requests.put(r)
    requests.put(None)
    client_out["futures"] = futures


def serve(batch: list) -> None:
    """One batch: stack, to the GPU, forward under inference_mode, probabilities back, each Future completed."""
    x = torch.from_numpy(np.stack([r.x for r in batch])).to(dev)
    with torch.inference_mode():
        if sc.cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        logits = model(x)
        if sc.cuda:
            e1.record()
        probs = logits.softmax(-1).cpu()
    if sc.cuda:
        own["gpu_s"] += e0.elapsed_time(e1) / 1e3
    done = time.perf_counter()
    for r, p in zip(batch, probs):
        r.future.set_result(p)
        latencies.append(done - r.t)


for n in list(range(1, MAX_BATCH + 1)) * 3:  # every batch size the server may see, before the client starts
    serve([Request(np.zeros(DIM, np.float32)) for _ in range(n)])
if sc.cuda:
    torch.cuda.synchronize()
own["gpu_s"] = 0.0
latencies.clear()
thread = threading.Thread(target=client, name="client", daemon=True)
thread.start()
b0 = sc.mark("baseline")
t = time.perf_counter()
go.set()
closing = False
while not closing:
    t0 = time.perf_counter()
    first = requests.get()
    t1 = time.perf_counter()
    own["idle_s"] += t1 - t0
    if first is None:
        break
    batch, deadline = [first], t1 + MAX_WAIT
    while len(batch) < MAX_BATCH:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        try:
            r = requests.get(timeout=left)
        except queue.Empty:
            break
        if r is None:
            closing = True
            break
        batch.append(r)
    t2 = time.perf_counter()
    serve(batch)
    t3 = time.perf_counter()
    own["batch_wait_s"] += t2 - t1
    own["serve_s"] += t3 - t2
    own["requests"] += len(batch)
    own["batches"] += 1
    sc.step(len(batch))
b1 = sc.mark("end")
wall = time.perf_counter() - t
thread.join(5.0)
futures = client_out.get("futures", [])
mid = b0 + (b1 - b0) // 2
sc.marks["half"] = mid
lat = np.array(latencies) * 1e3 if latencies else np.zeros(1)
wait = own["idle_s"] + own["batch_wait_s"]
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "wait_share": round(wait / wall, 4), "idle_share": round(own["idle_s"] / wall, 4),
                    "batch_wait_share": round(own["batch_wait_s"] / wall, 4),
                    "serve_share": round(own["serve_s"] / wall, 4),
                    "gpu_share": round(own["gpu_s"] / wall, 4) if sc.cuda else None,
                    "mean_batch": round(own["requests"] / max(own["batches"], 1), 3),
                    "latency_ms_p50": round(float(np.percentile(lat, 50)), 3),
                    "latency_ms_p99": round(float(np.percentile(lat, 99)), 3),
                    "rate_per_s": RATE, "max_batch": MAX_BATCH, "max_wait_ms": MAX_WAIT * 1e3}
sc.extra["client"] = {"pid": sc.feeder["pid"], "tid": client_out.get("tid"), "thread": "client",
                      "sent": len(futures), "answered": sum(f.done() for f in futures)}
sc.note(f"natural: measured by the script: {own['requests']} requests in {own['batches']} batches; the server thread "
        f"{own['idle_s']:.2f} s waiting for a first request, {own['batch_wait_s']:.2f} s in its batching window, "
        f"{own['serve_s']:.2f} s serving (forward passes {own['gpu_s']:.2f} s on the GPU), of {wall:.2f} s. Steps are "
        f"requests served; the client thread (same process) is no culprit.")
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
