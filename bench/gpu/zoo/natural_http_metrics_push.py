"""natural_http_metrics_push (natural, nothing staged): a training loop that pushes its metrics to a local collector
over HTTP after every step, as a team whose dashboard reads a sidecar writes it: the zoo's MLP (512-2048-2048-2048-10,
batch 8192, fp32 without TF32, fused AdamW, batches on the GPU, a cosine lr schedule) reads the loss with loss.item()
each step and then POSTs a small JSON body (step, loss, lr, the step's time, wall time) with urllib.request.urlopen to
http://127.0.0.1:PORT/metrics, synchronously, waiting for the reply before the next step (one TCP connection a request:
HTTP/1.0, as urllib does). The collector is a child process the job starts before the run (common.spawn_python,
`metricsd`, on CPU 4: the sidecar's own CPU): a single-threaded http.server (HTTPServer with a BaseHTTPRequestHandler)
whose handler parses the JSON, appends it to a list and, every 100 requests, aggregates the last 100 (mean loss, the
step time's median and 95th percentile) and writes that summary to a file, then answers 200 with a small JSON body. CPUs
2-3 for the job, 20 s. The script measures itself: the steps per second, the main thread's time queueing the step, in
loss.item(), and in the POSTs (wall, and its CPU time there by thread_time: what urllib and http.client cost it; the
rest is its wait for the collector's reply), the requests a second; the main thread's time on a CPU and waiting for one
(/proc/thread-self/schedstat) over the run; the process's minor page faults and the device allocator's cudaMalloc calls;
a step's GPU time queued (common.gpu_seconds_queued), so that the GPU's busy share is known; and the collector's CPU
time and run-queue wait over the run (its tasks' schedstat) and the requests it counted. Truth `collector` names the
child (pid, tids, comm, CPUs)."""

import json
import os
import resource
import shutil
import tempfile
import threading
import time
import urllib.request

from common import Scenario, Trainer, gpu_seconds_queued, map_cpus, spawn_python, stop, tids_of

sc = Scenario("natural_http_metrics_push", "natural", "the MLP POSTing its metrics (loss via .item(), lr, step time) "
              "to a local http.server collector in a child process after every step, synchronously, 20 s, "
              "nothing staged", job_cpus=[2, 3], control=True)
tr = Trainer(sc)
torch = tr.torch
model, opt, loss_fn = tr.model, tr.opt, tr.loss_fn
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20000)
PID, MAIN = os.getpid(), threading.get_native_id()
WORK = tempfile.mkdtemp(prefix="zoo_metricsd_")
PORT_FILE, SUMMARY, COUNT = (os.path.join(WORK, n) for n in ("port", "summary.jsonl", "count"))
COLLECTOR_CPUS = [c for c in map_cpus([4]) if c not in sc.job_cpus] or map_cpus([4])
COLLECTOR = f"""
import json, os, statistics, time
from http.server import BaseHTTPRequestHandler, HTTPServer
JOB, PORT_FILE, SUMMARY, COUNT = {PID}, {PORT_FILE!r}, {SUMMARY!r}, {COUNT!r}
records = []
state = {{"n": 0}}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        records.append(json.loads(body))
        state["n"] += 1
        if len(records) >= 100:
            times = sorted(r["step_time_s"] for r in records)
            summary = {{"step": records[-1]["step"], "n": len(records),
                        "loss_mean": statistics.fmean(r["loss"] for r in records),
                        "step_time_p50": times[len(times) // 2], "step_time_p95": times[int(len(times) * 0.95)],
                        "lr": records[-1]["lr"], "received": state["n"]}}
            with open(SUMMARY, "a") as fh:
                fh.write(json.dumps(summary) + "\\n")
            with open(COUNT + ".tmp", "w") as fh:
                fh.write(str(state["n"]))
            os.replace(COUNT + ".tmp", COUNT)
            records.clear()
        reply = b'{{"ok": true}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Handler)
server.timeout = 1.0
with open(PORT_FILE + ".tmp", "w") as fh:
    fh.write(str(server.server_address[1]))
os.replace(PORT_FILE + ".tmp", PORT_FILE)
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    try:
        os.kill(JOB, 0)
    except OSError:
        break
    server.handle_request()
"""
collector = spawn_python(COLLECTOR, "metricsd", COLLECTOR_CPUS)
for _ in range(200):
    if os.path.exists(PORT_FILE):
        break
    time.sleep(0.05)
URL = f"http://127.0.0.1:{open(PORT_FILE).read().strip()}/metrics"
own = {"steps": 0, "issue_s": 0.0, "item_s": 0.0, "post_s": 0.0, "post_cpu_s": 0.0, "posts": 0, "post_errors": 0}
last = {"t": time.perf_counter()}


def post(record: dict) -> None:
    req = urllib.request.Request(URL, data=json.dumps(record).encode(), headers={"Content-Type": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def step() -> None:
    t0 = time.perf_counter()
    i = tr.i
    tr.i += 1
    x, y = tr.xs[i % len(tr.xs)], tr.ys[i % len(tr.ys)]
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    loss_v = loss.item()
    t2 = time.perf_counter()
    c2 = time.thread_time()
    record = {"step": i, "loss": loss_v, "lr": sched.get_last_lr()[0], "step_time_s": t2 - last["t"],
              "wall_time": time.time()}
    try:
        post(record)
    except OSError:  # a metrics push must never stop training
        own["post_errors"] += 1
    t3 = time.perf_counter()
    last["t"] = t3
    own["issue_s"] += t1 - t0
    own["item_s"] += t2 - t1
    own["post_s"] += t3 - t2
    own["post_cpu_s"] += time.thread_time() - c2
    own["posts"] += 1
    own["steps"] += 1


def thread_schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), by schedstat; (thread_time, None) without."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def process_schedstat(pid: int) -> dict[int, tuple[int, int]]:
    got = {}
    for t in tids_of(pid):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as fh:
                run, wait = fh.read().split()[:2]
            got[t] = (int(run), int(wait))
        except (OSError, ValueError):
            pass
    return got


def delta_s(a: dict, b: dict, k: int) -> float:
    return round(sum(v[k] - (a.get(t) or (0, 0))[k] for t, v in b.items()) / 1e9, 4)


def received() -> int | None:
    try:
        with open(COUNT) as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


try:
    for _ in range(200):  # warm-up: the allocator, the collector's first summaries
        step()
    tr.sync()
    gpu_step_s = None
    if sc.cuda:
        def work(_) -> None:
            """One step's GPU work (forward, backward, the optimiser), nothing read back."""
            loss_fn(model(tr.xs[0]), tr.ys[0]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the run
    while time.perf_counter() < warm_end:
        step()
    tr.sync()
    for k in own:
        own[k] = 0 if isinstance(own[k], int) else 0.0
    col_tids = tids_of(collector.pid)
    col0 = process_schedstat(collector.pid)
    run0, wait0 = thread_schedstat()
    f0, m0, r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs(), received()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    tr.sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    run1, wait1 = thread_schedstat()
    f1, m1, r1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs(), received()
    col1 = process_schedstat(collector.pid)
    col_alive = collector.poll() is None
    col_tids = sorted(set(col_tids) | set(col1))
finally:
    stop([collector])
summaries = 0
if os.path.exists(SUMMARY):
    with open(SUMMARY) as fh:
        summaries = sum(1 for _ in fh)
shutil.rmtree(WORK, ignore_errors=True)
n = own["steps"]
main_run = round(run1 - run0, 4)
main_wait = round(wait1 - wait0, 4) if wait0 is not None and wait1 is not None else None
main_asleep = max(0.0, wall - main_run - (main_wait or 0.0))
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
col_run, col_wait = delta_s(col0, col1, 0), delta_s(col0, col1, 1)
post_off = max(0.0, own["post_s"] - own["post_cpu_s"])


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


sc.extra["collector"] = {"pid": collector.pid, "tids": col_tids or [collector.pid], "comm": "metricsd",
                         "cpus": [4], "cpus_used_here": COLLECTOR_CPUS, "alive_at_end": col_alive}
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "posts_per_s": round(own["posts"] / wall, 2),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "post_ms_mean": round(own["post_s"] / max(own["posts"], 1) * 1e3, 4),
                    "issue_share": share(own["issue_s"]), "item_share": share(own["item_s"]),
                    "post_share": share(own["post_s"]), "post_cpu_share": share(own["post_cpu_s"]),
                    "post_off_cpu_s": round(post_off, 4), "post_off_cpu_share": share(post_off),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "main_asleep_s": round(main_asleep, 4), "main_asleep_share": share(main_asleep),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy),
                    "collector_pid": collector.pid, "collector_run_s": col_run, "collector_cpu_share": share(col_run),
                    "collector_cpu_wait_s": col_wait,
                    "collector_received": (r1 - r0) if r0 is not None and r1 is not None else None,
                    "collector_summaries": summaries,
                    "collector_shares_job_cpus": bool(set(COLLECTOR_CPUS) & set(sc.job_cpus)), "batch": tr.batch}
if not sc.cuda:
    sc.note("the MLP shrunk on the CPU: no GPU timings, no allocator counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {own['issue_s']:.2f} s "
        f"queueing the steps, {own['item_s']:.2f} s in .item(), {own['post_s']:.2f} s in {own['posts']} POSTs "
        f"({own['post_cpu_s']:.2f} s of the main thread's CPU in them); the main thread ran {main_run} s, waited for a "
        f"CPU {main_wait} s; metricsd (pid {collector.pid}) ran {col_run:.2f} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
