"""natural_two_thread_serving (natural, nothing staged): a naive multi-model inference service: two small models served
from two Python threads of one process, one thread per model, each on a torch.cuda.Stream of its own, under
torch.no_grad, batch sizes small (a tabular MLP 256-1024-1024-1024-16 with LayerNorm and GELU at batch 8; a small conv
net on 3x32x32 images, 32-64-128 channels with BatchNorm, at batch 4), so that each request is a dozen or two short
kernels: the input copied to the GPU (non_blocking, from pageable memory), the forward pass, a softmax, the result
copied back with .cpu() (the thread waits for its stream there, as a server must before it answers). Each model has a
request queue.Queue(maxsize=64) that a generator thread of its own (gen_mlp, gen_cnn: the load generator of a benchmark
run, blocked in put() while its queue is full) keeps full: the servers never wait for input. The threads' names
(threading's and the OS's) are serve_mlp, serve_cnn, gen_mlp and gen_cnn.
Both serving threads launch their kernels from Python, so they contend for CPython's GIL (and, with the generator, for
the job's 2 CPUs). The main thread starts the threads and waits out the phases (threading.Event().wait(seconds): it
issues no CUDA work in the run). CPUs 2-3. First ~3 s with serve_mlp alone (serve_cnn not started):
its requests per second alone (truth `self.alone_mlp_rps`); then both, warm-up, then 20 s measured. The script measures
itself over the 20 s: each model's requests per second; each serving thread's tid and name, its time on a CPU and
waiting for one (/proc/thread-self/schedstat), its time in get() (wall and CPU), in the input copy, in queueing the
forward pass and in .cpu() (wall and CPU: its wait for its stream, and for the GIL after it); the generators' CPU
time; the process's minor page faults and cudaMalloc calls; and each model's GPU time per request queued
(common.gpu_seconds_queued), so that the GPU's busy share (the two models' sum, an upper bound where the streams'
kernels overlap) is known. Truth `servers` names the two serving threads, `generators` the two generators; the feeder
is serve_mlp."""

import contextlib
import os
import queue
import resource
import sys
import threading
import time

from common import Scenario, gpu_seconds_queued, set_thread_name

sc = Scenario("natural_two_thread_serving", "natural", "two small models (an MLP, a conv net) served from two Python "
              "threads on their own CUDA streams, request queues kept full by a generator thread, batch 8 and 4, "
              "20 s, nothing staged", job_cpus=[2, 3], control=True)
import torch  # noqa: E402

nn = torch.nn
PID = os.getpid()
dev = torch.device(sc.device)
MLP_BATCH, CNN_BATCH, QDEPTH = 8, 4, 64
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(256, 1024), nn.LayerNorm(1024), nn.GELU(), nn.Linear(1024, 1024), nn.LayerNorm(1024),
                    nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 16)).to(dev).eval()


def conv_bn(cin: int, cout: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


cnn = nn.Sequential(*conv_bn(3, 32, 1), *conv_bn(32, 64, 2), *conv_bn(64, 128, 2), nn.AdaptiveAvgPool2d(1),
                    nn.Flatten(), nn.Linear(128, 10)).to(dev).eval()
SHAPES = {"mlp": (MLP_BATCH, 256), "cnn": (CNN_BATCH, 3, 32, 32)}
MODELS = {"mlp": mlp, "cnn": cnn}
queues = {k: queue.Queue(maxsize=QDEPTH) for k in MODELS}
running = threading.Event()  # cleared: the servers hold (before the run starts and while the truth is written)
info: dict[str, dict] = {}
KEYS = ("requests", "get_s", "get_cpu_s", "h2d_s", "issue_s", "fetch_s", "fetch_cpu_s")
stats = {k: dict.fromkeys(KEYS, 0.0) for k in MODELS}


def generator(kind: str) -> None:
    """A model's load generator: a request is a small CPU tensor; it blocks on put() while the queue is full."""
    name = f"gen_{kind}"
    set_thread_name(name)
    info[name] = {"tid": threading.get_native_id(), "comm": name}
    g = torch.Generator().manual_seed(1 + len(name) + ord(kind[0]))
    q, shape = queues[kind], SHAPES[kind]
    while True:
        q.put(torch.randn(shape, generator=g))


def infer(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(model(x), dim=-1)


def serve(kind: str) -> None:
    name = f"serve_{kind}"
    set_thread_name(name)
    info[kind] = {"tid": threading.get_native_id(), "comm": name}
    model, q, s = MODELS[kind], queues[kind], stats[kind]
    stream = torch.cuda.Stream() if sc.cuda else None
    with torch.no_grad(), torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        while True:
            running.wait()
            t0, c0 = time.perf_counter(), time.thread_time()
            x = q.get()
            t1, c1 = time.perf_counter(), time.thread_time()
            x = x.to(dev, non_blocking=True)
            t2 = time.perf_counter()
            out = infer(model, x)
            t3, c3 = time.perf_counter(), time.thread_time()
            result = out.cpu()  # waits for this stream's kernels: the answer goes back to the client
            t4, c4 = time.perf_counter(), time.thread_time()
            del result
            s["requests"] += 1
            s["get_s"] += t1 - t0
            s["get_cpu_s"] += c1 - c0
            s["h2d_s"] += t2 - t1
            s["issue_s"] += t3 - t2
            s["fetch_s"] += t4 - t3
            s["fetch_cpu_s"] += c4 - c3
            sc.step()


def schedstat(tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


def reset() -> None:
    for s in stats.values():
        for k in s:
            s[k] = 0.0


def hold(seconds: float) -> None:
    """The main thread waits for the phase's end on its own clock (a condition nobody sets: no CUDA call of its own)."""
    threading.Event().wait(seconds)


# The GPU's time per request of each model, measured queued before any thread serves.
gpu_req_s: dict[str, float | None] = {"mlp": None, "cnn": None}
if sc.cuda:
    with torch.no_grad():
        for kind, model in MODELS.items():
            xs = torch.randn(SHAPES[kind], device=dev)
            infer(model, xs)
            reqs = 50

            def work(_, model=model, xs=xs) -> None:
                for _i in range(reqs):
                    infer(model, xs)

            runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
            gpu_req_s[kind] = runs[len(runs) // 2] / reqs if runs else None
for kind in MODELS:
    threading.Thread(target=generator, args=(kind,), name=f"gen_{kind}", daemon=True).start()
threads = {"mlp": threading.Thread(target=serve, args=("mlp",), name="serve_mlp", daemon=True),
           "cnn": threading.Thread(target=serve, args=("cnn",), name="serve_cnn", daemon=True)}
threads["mlp"].start()
running.set()
hold(1.0 * sc.scale)  # warm-up of serve_mlp alone
reset()
a0 = time.perf_counter()
hold(3.0 * sc.scale)
alone_s = time.perf_counter() - a0
alone_rps = stats["mlp"]["requests"] / alone_s
threads["cnn"].start()
hold(2.0 * sc.scale)  # warm-up of both
while not {"cnn", "gen_mlp", "gen_cnn"} <= info.keys():
    hold(0.05)
tids = {k: info[k]["tid"] for k in ("mlp", "cnn", "gen_mlp", "gen_cnn")}
sc.feeder = {"pid": PID, "tid": tids["mlp"], "comm": info["mlp"]["comm"]}
sc.steps.clear()
reset()
ss0 = {k: schedstat(t) for k, t in tids.items()}
f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
hold(10.0 * sc.scale)
mid = sc.mark("half")
hold(10.0 * sc.scale)
running.clear()  # the servers finish the request in hand and hold
wall = time.perf_counter() - t
ss1 = {k: schedstat(t) for k, t in tids.items()}
f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
b1 = sc.mark("end")
hold(0.2)
st = {k: dict(v) for k, v in stats.items()}


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


own: dict = {"wall_s": round(wall, 4), "alone_s": round(alone_s, 4), "alone_mlp_rps": round(alone_rps, 2)}
gpu_busy = 0.0 if all(gpu_req_s.values()) else None
for kind in MODELS:
    s, a, b = st[kind], ss0[kind], ss1[kind]
    run = round(b[0] - a[0], 4) if a and b else None
    wait = round(b[1] - a[1], 4) if a and b else None
    asleep = max(0.0, wall - run - wait) if run is not None else None
    get_off = max(0.0, s["get_s"] - s["get_cpu_s"])
    fetch_off = max(0.0, s["fetch_s"] - s["fetch_cpu_s"])
    # asleep outside get() and .cpu(): off a CPU, not waiting for one, nor for input or the GPU: the GIL's wait
    gil_lb = max(0.0, asleep - get_off - fetch_off) if asleep is not None else None
    n = int(s["requests"])
    own[kind] = {"tid": tids[kind], "comm": info[kind]["comm"], "requests": n, "rps": round(n / wall, 2),
                 **{k: round(v, 4) for k, v in s.items() if k != "requests"},
                 "get_share": share(s["get_s"]), "get_off_s": round(get_off, 4),
                 "fetch_share": share(s["fetch_s"]), "fetch_off_s": round(fetch_off, 4),
                 "issue_share": share(s["issue_s"]), "h2d_share": share(s["h2d_s"]),
                 "run_s": run, "cpu_share": share(run), "cpu_wait_s": wait, "cpu_wait_share": share(wait),
                 "asleep_s": round(asleep, 4) if asleep is not None else None, "asleep_share": share(asleep),
                 "gil_wait_lb_s": round(gil_lb, 4) if gil_lb is not None else None, "gil_wait_lb_share": share(gil_lb),
                 "gpu_req_ms": round(gpu_req_s[kind] * 1e3, 4) if gpu_req_s[kind] else None}
    if gpu_busy is not None:
        gpu_busy += n * gpu_req_s[kind]
gens = [(ss0[k], ss1[k]) for k in ("gen_mlp", "gen_cnn")]
gen_run = round(sum(b[0] - a[0] for a, b in gens), 4) if all(a and b for a, b in gens) else None
gil = getattr(sys, "_is_gil_enabled", lambda: True)()
own.update(main_cpu_share=own["mlp"]["cpu_share"], main_cpu_wait_share=own["mlp"]["cpu_wait_share"],
           main_run_s=own["mlp"]["run_s"], main_cpu_wait_s=own["mlp"]["cpu_wait_s"],
           mlp_with_over_alone=round(own["mlp"]["rps"] / alone_rps, 4) if alone_rps else None,
           total_rps=round((own["mlp"]["requests"] + own["cnn"]["requests"]) / wall, 2),
           generator_run_s=gen_run, generator_cpu_share=share(gen_run), gil_enabled=bool(gil),
           minor_faults_per_s=round((f1 - f0) / wall, 1), cuda_mallocs_per_s=round((m1 - m0) / wall, 3),
           gpu_busy_s=round(gpu_busy, 4) if gpu_busy is not None else None,
           gpu_busy_share=round(min(1.0, gpu_busy / wall), 4) if gpu_busy is not None else None,
           mlp_batch=MLP_BATCH, cnn_batch=CNN_BATCH, queue_depth=QDEPTH)
sc.extra["self"] = own
sc.extra["servers"] = [{"pid": PID, "tid": tids[k], "comm": info[k]["comm"], "model": k} for k in MODELS]
sc.extra["generators"] = [{"pid": PID, "tid": tids[k], "comm": k} for k in ("gen_mlp", "gen_cnn")]
if not sc.cuda:
    sc.note("on the CPU: no streams, no GPU timings.")
sc.note(f"natural: measured by the script over {wall:.2f} s: serve_mlp {own['mlp']['rps']} req/s (alone before: "
        f"{alone_rps:.1f}/s), serve_cnn {own['cnn']['rps']} req/s; on a CPU {own['mlp']['cpu_share']} and "
        f"{own['cnn']['cpu_share']} of the run, waiting for one {own['mlp']['cpu_wait_share']} and "
        f"{own['cnn']['cpu_wait_share']}, asleep outside get() and .cpu() (the GIL) at least "
        f"{own['mlp']['gil_wait_lb_share']} and {own['cnn']['gil_wait_lb_share']}; "
        + (f"the GPU busy {own['gpu_busy_share']:.0%} of the run (both models' requests' GPU time queued, summed)."
           if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
