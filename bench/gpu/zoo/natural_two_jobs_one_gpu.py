"""natural_two_jobs_one_gpu (natural, nothing staged): a shared development box, two people's training jobs on one GPU.
The measured job is the zoo's MLP training (512-2048-2048-2048-10, batch 8192, fp32 without TF32, fused AdamW,
loss.item() each step) on CPUs 2-3. The other is a colleague's independent job, already running when ours starts: this
script started again as a second process (process name `colleague_lm`, CPU 4) that trains a small GPT-style language
model on the same GPU (an embedding of 32,000 x 768, 6 pre-norm Transformer layers with a causal mask, 12 heads,
feed-forward 3072, a tied head, bf16 autocast, fused AdamW, clip_grad_norm_(1.0), batch 16 x 512 tokens drawn from a
corpus on the GPU, its loss read with .item() each step for its progress line, a log line every 50 steps). Nothing ties
the two jobs but the GPU.

The order: the colleague's job starts, warms up, measures a step's GPU time queued (common.gpu_seconds_queued) and its
steps per second alone (2 s), says so on a pipe and trains on until it is stopped; our job waits for that line before
its first CUDA call (it starts once the colleague's is running), warms up, trains 2 s, then the measured run: 20 s with
both jobs training. Then the colleague's job is stopped (SIGTERM: it finishes its step, writes its measures and exits),
our job trains on, alone, for 1 s and then 3 s measured (mark `alone`: its steps per second alone), and measures a
step's GPU time queued alone. The script measures itself: the steps per second (with the colleague's job and alone),
the main thread's time in loss.item(), its time on a CPU and waiting for one over the measured run
(/proc/thread-self/schedstat: exec runtime and run delay), a step's GPU time queued alone, so that its own GPU busy
share is known; the colleague's steps in the measured run (each one's end, after its .item()) times its step's GPU
time alone: the colleague's GPU busy share. Truth `other` names the colleague's process (pid, comm)."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from common import Scenario, Trainer, comm_of, gpu_seconds_queued, set_thread_name, stop

COLLEAGUE_OUT = os.environ.get("ZOO_COLLEAGUE_OUT")
LOG_EVERY = 50


def schedstat() -> tuple[float, float | None]:
    """The calling thread's time on a CPU and waiting on a run queue (s), from the kernel's schedstat; where that is
    not kept, the thread's CPU clock and None."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def colleague() -> None:
    """The colleague's job: a small GPT trained until SIGTERM; its measures to ZOO_COLLEAGUE_OUT."""
    os.sched_setaffinity(0, [int(c) for c in os.environ["ZOO_COLLEAGUE_CPUS"].split(",")])
    set_thread_name("colleague_lm")
    cuda = arg("--device", "cuda") == "cuda"
    scale = float(arg("--scale", "1.0"))
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))
    import torch
    from torch import nn

    dev = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        torch.set_num_threads(1)
    vocab, d, heads, ff, layers, batch, ctx = (32_000, 768, 12, 3072, 6, 16, 512) if cuda else (
        1000, 64, 4, 128, 2, 4, 64)

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.zeros(ctx, d))
            block = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1, activation="gelu", batch_first=True,
                                               norm_first=True)
            self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight
            nn.init.normal_(self.tok.weight, std=0.02)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx), persistent=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            h = self.tok(idx) + self.pos[:idx.shape[1]]
            h = self.blocks(h, mask=self.mask, is_causal=True)
            return self.head(self.norm(h))

    torch.manual_seed(1)
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=cuda or None)
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    corpus = torch.randint(0, vocab, (512 if cuda else 32, ctx + 1), device=dev, generator=gen)

    def work(_=None) -> torch.Tensor:
        rows = torch.randint(0, corpus.shape[0], (batch,), device=dev, generator=gen)
        seq = corpus[rows]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(seq[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), seq[:, 1:].reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(10):
        work().item()
    gpu_step_s = None
    if cuda:
        torch.cuda.synchronize()
        runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(3)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    t, n = time.perf_counter(), 0
    while time.perf_counter() < t + 2.0 * scale:
        work().item()
        n += 1
    alone = n / (time.perf_counter() - t)
    print("measured", flush=True)
    ends: list[int] = []
    k = 0
    while not stopping["now"]:
        v = work().item()
        ends.append(time.time_ns())
        k += 1
        if k % LOG_EVERY == 0:
            print(f"[colleague_lm] step {k} loss {v:.4f}", file=sys.stderr, flush=True)
    out = {"pid": os.getpid(), "comm": comm_of(os.getpid()), "cpus": sorted(os.sched_getaffinity(0)),
           "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
           "alone_steps_per_s": round(alone, 3), "steps": k, "step_ends_ns": ends,
           "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2), "batch": batch, "ctx": ctx}
    with open(COLLEAGUE_OUT + ".tmp", "w") as fh:
        json.dump(out, fh)
    os.replace(COLLEAGUE_OUT + ".tmp", COLLEAGUE_OUT)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if COLLEAGUE_OUT:
    colleague()

sc = Scenario("natural_two_jobs_one_gpu", "natural", "the MLP training on CPUs 2-3 while a colleague's GPT "
              "training (process colleague_lm, CPU 4) shares the GPU all along, then 3 s alone, 20 s measured, "
              "nothing staged", job_cpus=[2, 3], culprit_cpus=[4], control=True)
OUT_PATH = os.path.join(tempfile.mkdtemp(prefix="zoo_colleague_"), "colleague.json")
env = dict(os.environ, ZOO_COLLEAGUE_OUT=OUT_PATH, ZOO_COLLEAGUE_CPUS=",".join(map(str, sc.culprit_cpus)))
other = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, text=True)
__import__("torch")  # while the colleague's job starts: no CUDA call yet

own = {"steps": 0, "item_s": 0.0}


def measured_step(tr: Trainer) -> None:
    """Trainer.step, with its loss.item() timed."""
    x, y = tr.xs[tr.i % len(tr.xs)], tr.ys[tr.i % len(tr.ys)]
    tr.i += 1
    loss = tr.loss_fn(tr.model(x), y)
    loss.backward()
    tr.opt.step()
    tr.opt.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    loss.item()
    own["item_s"] += time.perf_counter() - t0
    own["steps"] += 1


try:
    line = other.stdout.readline()  # the colleague's job is running: ours starts now (before its first CUDA call)
    assert line.strip() == "measured", f"the colleague's job did not start: {line!r}"
    ready = sc.mark("colleague_running")
    peer = {"pid": other.pid, "comm": comm_of(other.pid)}
    tr = Trainer(sc)
    tr.warmup()
    sc.mark("shared")
    sc.run_for(2.0 * sc.scale, lambda: measured_step(tr))
    tr.sync()
    own.update(steps=0, item_s=0.0)
    run0, wait0 = schedstat()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, lambda: measured_step(tr))
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, lambda: measured_step(tr))
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    run1, wait1 = schedstat()
    shared = dict(own)
    other.send_signal(signal.SIGTERM)  # the colleague's job ends; ours trains on
    sc.mark("colleague_stopped")
    deadline = time.monotonic() + 30.0
    while other.poll() is None and time.monotonic() < deadline:
        measured_step(tr)
        sc.step()
    assert other.poll() is not None, "the colleague's job did not stop"
    sc.mark("colleague_gone")
    sc.run_for(1.0 * sc.scale, lambda: measured_step(tr))
    tr.sync()
    own.update(steps=0, item_s=0.0)
    a0 = sc.mark("alone")
    ta = time.perf_counter()
    sc.run_for(3.0 * sc.scale, lambda: measured_step(tr))
    alone_wall = time.perf_counter() - ta
    a1 = sc.mark("alone_end")
    alone = dict(own)
    gpu_step_s = None
    if sc.cuda:
        def work(_) -> None:
            """One step's GPU work, nothing read back."""
            tr.loss_fn(tr.model(tr.xs[0]), tr.ys[0]).backward()
            tr.opt.step()
            tr.opt.zero_grad(set_to_none=True)

        runs = sorted(r for r in (gpu_seconds_queued(tr.torch, work) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    with open(OUT_PATH) as fh:
        col = json.load(fh)
finally:
    stop([other])
n = shared["steps"]
rate, alone_rate = n / wall, alone["steps"] / alone_wall
col_steps = sum(1 for e in col["step_ends_ns"] if b0 <= e < b1)
col_gpu = col["gpu_step_ms"]
mine_busy = n * gpu_step_s if gpu_step_s is not None else None
col_busy = col_steps * col_gpu / 1e3 if col_gpu is not None else None
both = (mine_busy + col_busy) / wall if mine_busy is not None and col_busy is not None else None
host_gap = n * max(0.0, 1 / alone_rate - gpu_step_s) if gpu_step_s is not None else None
sc.extra["other"] = {"pid": peer["pid"], "comm": peer["comm"] or col["comm"], "cpus": col["cpus"],
                     "gpu_step_ms": col_gpu, "alone_steps_per_s": col["alone_steps_per_s"],
                     "steps_in_run": col_steps, "steps_per_s_in_run": round(col_steps / wall, 3),
                     "gpu_busy_s": round(col_busy, 4) if col_busy is not None else None,
                     "gpu_busy_share": round(col_busy / wall, 4) if col_busy is not None else None,
                     "params_m": col["params_m"], "batch": col["batch"], "ctx": col["ctx"],
                     "first_step_end_ns": col["step_ends_ns"][0] if col["step_ends_ns"] else None,
                     "running_from_ns": ready}
sc.extra["self"] = {"steps": n, "item_s": round(shared["item_s"], 4), "wall_s": round(wall, 4),
                    "steps_per_s": round(rate, 3), "item_share": round(shared["item_s"] / wall, 4),
                    "alone_steps": alone["steps"], "alone_wall_s": round(alone_wall, 4),
                    "alone_steps_per_s": round(alone_rate, 3), "alone_span_ns": [a0, a1],
                    "slowdown": round(alone_rate / rate, 4) if rate else None,
                    "lost_s": round(max(0.0, wall - n / alone_rate), 4),
                    "main_cpu_share": round((run1 - run0) / wall, 4),
                    "main_cpu_wait_share": round((wait1 - wait0) / wall, 4) if wait0 is not None else None,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "alone_gpu_busy_share": round(alone_rate * gpu_step_s, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(mine_busy, 4) if mine_busy is not None else None,
                    "gpu_busy_share": round(mine_busy / wall, 4) if mine_busy is not None else None,
                    "gpu_busy_share_both": round(both, 4) if both is not None else None,
                    "host_gap_s": round(host_gap, 4) if host_gap is not None else None,
                    "batch": tr.batch}
sc.note(f"natural: measured by the script: {n} steps ({rate:.1f}/s) in {wall:.2f} s with the colleague's job "
        f"(pid {peer['pid']}, {col_steps} of its steps in the run), {alone_rate:.1f}/s alone after it stopped "
        f"(slowdown {alone_rate / rate:.2f}x); {shared['item_s']:.2f} s in loss.item(); the main thread "
        f"{(run1 - run0) / wall:.0%} of the run on a CPU; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (ours) and {col_gpu:.2f} ms (the "
           f"colleague's): GPU busy {mine_busy / wall:.0%} with ours, {both:.0%} with both."
           if both is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
