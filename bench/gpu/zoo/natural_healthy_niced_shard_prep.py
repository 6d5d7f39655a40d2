"""natural_healthy_niced_shard_prep (natural, nothing staged; a control): a GPU-bound diffusion model's training job
that prepares the next data shards in the background at low priority, on its own CPUs. The job: a DDPM noise-prediction
U-Net (64x64 RGB; levels of 128-256-256-512 channels, two residual blocks of GroupNorm, SiLU and 3x3 convolutions per
level down and three up with skip connections, a sinusoidal timestep embedding through an MLP; ~61 M parameters) on 64
images a step drawn from 4,096 held on the GPU, a random timestep and Gaussian noise each, bf16 autocast,
channels_last, fused AdamW, MSE on the noise, loss.item() each step for the running loss: tens of milliseconds of GPU
work a step against a few of queueing, so the GPU is busy nearly all along. The decoys: two processes `shard_prep`
that the job starts (common.spawn_python, before the measured run) on the job's own CPUs 2-3 at nice 19 (os.nice(19),
as a "don't disturb training" background job is started), each preparing the next epoch's token shards flat out:
a 4 M-token stream drawn from a Zipf distribution with numpy, compressed with zlib (level 6), hashed with sha256 and
written to /var/tmp (no fsync; four file names reused, removed at the end). They keep both of the job's CPUs busy the
whole run, yet at nice 19 against the trainer's nice 0 they get the CPU only when the trainer's threads do not want it
(the main thread's wait in loss.item() spins or sleeps in the CUDA driver; whenever it wakes it preempts them). They
share no file, pipe, lock or GPU with the training loop. 4 s of the job alone first (the decoys not started), then 20 s
beside them (smaller with --device cpu: 32 px images, a 16-32-32-64 U-Net, 8 images a step, 1 M-token shards).

The script measures itself: the steps per second alone and beside the decoys (`with_over_alone`; the run's time
beyond its steps at the rate alone, `prep_overhead_s`); the main thread's time queueing the steps (`issue_s`) and in
loss.item() (`item_s`); its time on a CPU and waiting for one (schedstat) and asleep (the rest) over the run; every
thread's CPU time and run-queue wait (truth `threads`), PyTorch's autograd thread's apart (truth `autograd`); the
process's minor and major page faults; the device allocator's cudaMalloc calls; a step's GPU time queued
(common.gpu_seconds_queued, in three parts so that none fills the launch queue: the forward with the loss, the
backward, AdamW), so that the GPU's busy share is known; and the decoys' CPU time, run-queue wait and niceness over
the run (their schedstat and /proc stat), the shards and bytes they wrote (their own counts, read from a file each
rewrites). Truth `decoys` and `shard_prep` name them (pids, tids, comm, CPUs, nice, span); they are no culprit: the
job is GPU-bound and they yield to it."""

import os
import resource
import shutil
import sys
import tempfile
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, spawn_python, stop, tids_of

sc = Scenario("natural_healthy_niced_shard_prep", "natural", "a GPU-bound DDPM U-Net (64 images of 64 px, bf16, "
              "loss.item() each step) on CPUs 2-3 beside two shard_prep processes it started at nice 19 on the same "
              "CPUs, drawing, compressing, hashing and writing token shards flat out, 20 s, nothing staged: a control",
              job_cpus=[2, 3], control=True)
import math  # noqa: E402

import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
SIDE, CHANNELS, BATCH, NIMAGES, SHARD_TOKENS = (((64, (128, 256, 256, 512), 64, 4096, 4_194_304)) if sc.cuda
                                                else (32, (16, 32, 32, 64), 8, 256, 1_048_576))
PREP, NICE, STEPS_T = 2, 19, 1000
OUT_DIR = tempfile.mkdtemp(prefix="zoo_shardprep_", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
PREP_CODE = """
import hashlib, os, sys, time, zlib
import numpy as np
os.nice({nice})
JOB, DEADLINE, K, OUT = {job}, time.monotonic() + 150, int(sys.argv[1]) if len(sys.argv) > 1 else {k}, {out!r}
COUNT = os.path.join(OUT, "count_%d" % K)


def alive():
    try:
        os.kill(JOB, 0)
    except OSError:
        return False
    return time.monotonic() < DEADLINE


rng = np.random.default_rng(K)
shards = written = 0
while alive():
    toks = np.minimum(rng.zipf(1.2, {tokens}), 65535).astype(np.uint16)  # the next shard's token stream
    blob = zlib.compress(toks.tobytes(), 6)
    digest = hashlib.sha256(blob).hexdigest()
    with open(os.path.join(OUT, "shard_%d_%d.bin.z" % (K, shards % 4)), "wb") as fh:
        fh.write(blob)
    shards += 1
    written += len(blob)
    with open(COUNT + ".tmp", "w") as fh:
        fh.write("%d %d %s" % (shards, written, digest))
    os.replace(COUNT + ".tmp", COUNT)
"""


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int) -> None:
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(min(32, cin // 4), cin), nn.Conv2d(cin, cout, 3, 1, 1)
        self.t = nn.Linear(tdim, cout)
        self.n2, self.c2 = nn.GroupNorm(min(32, cout // 4), cout), nn.Conv2d(cout, cout, 3, 1, 1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.c1(F.silu(self.n1(x))) + self.t(temb)[:, :, None, None]
        h = self.c2(F.silu(self.n2(h)))
        return h + self.skip(x)


class UNet(nn.Module):
    """Down: two ResBlocks a level, a stride-2 convolution between levels; up: two ResBlocks a level on the skip
    connections concatenated, nearest upsampling and a convolution between levels."""

    def __init__(self, ch: tuple[int, ...]) -> None:
        super().__init__()
        self.tdim = ch[0] * 4
        self.temb = nn.Sequential(nn.Linear(ch[0], self.tdim), nn.SiLU(), nn.Linear(self.tdim, self.tdim))
        self.inp = nn.Conv2d(3, ch[0], 3, 1, 1)
        self.down, self.downsample = nn.ModuleList(), nn.ModuleList()
        skips, cin = [ch[0]], ch[0]
        for i, c in enumerate(ch):
            for _ in range(2):
                self.down.append(ResBlock(cin, c, self.tdim))
                cin = c
                skips.append(c)
            if i < len(ch) - 1:
                self.downsample.append(nn.Conv2d(c, c, 3, 2, 1))
                skips.append(c)
        self.mid = ResBlock(cin, cin, self.tdim)
        self.up, self.upsample = nn.ModuleList(), nn.ModuleList()
        for i, c in reversed(list(enumerate(ch))):
            for _ in range(3):
                self.up.append(ResBlock(cin + skips.pop(), c, self.tdim))
                cin = c
            if i > 0:
                self.upsample.append(nn.Conv2d(c, c, 3, 1, 1))
        self.out = nn.Sequential(nn.GroupNorm(min(32, cin // 4), cin), nn.SiLU(), nn.Conv2d(cin, 3, 3, 1, 1))
        self.levels = len(ch)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        temb = self.temb(timestep_embedding(t, self.inp.out_channels))
        h = self.inp(x)
        hs, d = [h], 0
        for i in range(self.levels):
            for _ in range(2):
                h = self.down[d](h, temb)
                d += 1
                hs.append(h)
            if i < self.levels - 1:
                h = self.downsample[i](h)
                hs.append(h)
        h = self.mid(h, temb)
        u = 0
        for i in reversed(range(self.levels)):
            for _ in range(3):
                h = self.up[u](torch.cat([h, hs.pop()], 1), temb)
                u += 1
            if i > 0:
                h = self.upsample[self.levels - 1 - i](F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(h)


def make_images(n: int) -> torch.Tensor:
    """n images in [-1, 1]: smooth colour fields (8x8 upsampled bilinearly) and fine noise, made on the device."""
    g = torch.Generator(device=dev).manual_seed(0)
    low = torch.rand(n, 3, 8, 8, generator=g, device=dev) * 2 - 1
    img = F.interpolate(low, size=(SIDE, SIDE), mode="bilinear", align_corners=False)
    return (img + 0.05 * torch.randn(n, 3, SIDE, SIDE, generator=g, device=dev)).clamp_(-1, 1)


def schedstat(pid: int, tid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def process_schedstat(pid: int) -> dict[int, tuple[int, int]]:
    return {t: s for t in tids_of(pid) if (s := schedstat(pid, t))}


def delta_s(a: dict, b: dict, k: int) -> float:
    """The CPU time (k=0) or run-queue wait (k=1) of the tasks in `b` since `a` (s)."""
    return round(sum(v[k] - (a.get(t) or (0, 0))[k] for t, v in b.items()) / 1e9, 4)


def nice_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[16])
    except (OSError, ValueError, IndexError):
        return None


def prep_count(k: int) -> tuple[int, int] | None:
    try:
        with open(os.path.join(OUT_DIR, f"count_{k}")) as fh:
            shards, written = fh.read().split()[:2]
        return int(shards), int(written)
    except (OSError, ValueError):
        return None


torch.manual_seed(0)
model = UNet(CHANNELS).to(dev).to(memory_format=torch.channels_last)
opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.0, fused=sc.cuda or None)
images = make_images(NIMAGES)
betas = torch.linspace(1e-4, 0.02, STEPS_T, device=dev)
alpha_bar = torch.cumprod(1 - betas, 0)
NPARAM = sum(p.numel() for p in model.parameters())
own = {"steps": 0, "issue_s": 0.0, "item_s": 0.0, "running_loss": 0.0}


def draw() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, NIMAGES, (BATCH,), device=dev)
    x0 = images[idx]
    t = torch.randint(0, STEPS_T, (BATCH,), device=dev)
    noise = torch.randn_like(x0)
    a = alpha_bar[t].view(-1, 1, 1, 1)
    xt = (a.sqrt() * x0 + (1 - a).sqrt() * noise).contiguous(memory_format=torch.channels_last)
    return xt, t, noise


def loss_of(xt: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    with torch.autocast(sc.device, dtype=torch.bfloat16, enabled=sc.cuda):
        pred = model(xt, t)
    return F.mse_loss(pred.float(), noise)


def train() -> torch.Tensor:
    loss = loss_of(*draw())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def step() -> None:
    t0 = time.perf_counter()
    loss = train()
    t1 = time.perf_counter()
    own["running_loss"] += loss.item()
    t2 = time.perf_counter()
    own["issue_s"] += t1 - t0
    own["item_s"] += t2 - t1
    own["steps"] += 1
    if own["steps"] % 100 == 0:
        print(f"step {own['steps']}: loss {own['running_loss'] / own['steps']:.4f}", flush=True)


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def median_gpu_s(work, prepare=None) -> float | None:
    runs = sorted(r for r in (gpu_seconds_queued(torch, work, prepare) for _ in range(3)) if r is not None)
    return runs[len(runs) // 2] if runs else None


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


for _ in range(8):  # warm-up: the allocator, cuDNN's convolutions chosen, the autograd thread started
    step()
sync()
gpu_step_s = gpu_fwd_s = gpu_bwd_s = gpu_opt_s = None
if sc.cuda:
    fixed = draw()

    def backward_prepared() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        return loss_of(*fixed)

    def grads_prepared() -> None:
        opt.zero_grad(set_to_none=True)
        loss_of(*fixed).backward()

    gpu_fwd_s = median_gpu_s(lambda _: loss_of(*fixed))
    gpu_bwd_s = median_gpu_s(lambda loss: loss.backward(), backward_prepared)
    gpu_opt_s = median_gpu_s(lambda _: opt.step(), grads_prepared)
    if None not in (gpu_fwd_s, gpu_bwd_s, gpu_opt_s):
        gpu_step_s = gpu_fwd_s + gpu_bwd_s + gpu_opt_s
    opt.zero_grad(set_to_none=True)
warm_end = time.perf_counter() + 1.0 * sc.scale  # the spin kernels well before the job's steps are timed alone
while time.perf_counter() < warm_end:
    step()
sync()
# the job alone
n0 = own["steps"]
sc.mark("alone")
t = time.perf_counter()
sc.run_for(4.0 * sc.scale, step)
sync()
alone_wall = time.perf_counter() - t
alone_rate = (own["steps"] - n0) / alone_wall
preps = []
try:
    for k in range(PREP):
        code = PREP_CODE.format(nice=NICE, job=PID, k=k, out=OUT_DIR, tokens=SHARD_TOKENS)
        preps.append(spawn_python(code, "shard_prep", sc.job_cpus, site=True))
    started = sc.mark("shard_prep")
    settle_end = time.perf_counter() + 1.5 * sc.scale  # numpy imported, the first shards under way
    while time.perf_counter() < settle_end:
        step()
    sync()
    for key in own:
        own[key] = 0 if key == "steps" else 0.0
    prep_tids = {p.pid: tids_of(p.pid) for p in preps}
    prep_nice = {p.pid: nice_of(p.pid) for p in preps}
    job0 = process_schedstat(PID)
    prep0 = {p.pid: process_schedstat(p.pid) for p in preps}
    cnt0 = [prep_count(k) for k in range(PREP)]
    r0, m0 = resource.getrusage(resource.RUSAGE_SELF), mallocs()
    b0 = sc.mark("baseline")
    t = time.perf_counter()
    sc.run_for(10.0 * sc.scale, step)
    mid = sc.mark("half")
    sc.run_for(10.0 * sc.scale, step)
    sync()
    b1 = sc.mark("end")
    wall = time.perf_counter() - t
    job1 = process_schedstat(PID)
    prep1 = {p.pid: process_schedstat(p.pid) for p in preps}
    cnt1 = [prep_count(k) for k in range(PREP)]
    r1, m1 = resource.getrusage(resource.RUSAGE_SELF), mallocs()
    alive = [p.poll() is None for p in preps]
finally:
    stop(preps)
    shutil.rmtree(OUT_DIR, ignore_errors=True)
n = own["steps"]
names = {tid: comm_of(PID, tid) for tid in job1}
autograd = next(({"pid": PID, "tid": tid, "comm": c} for tid, c in sorted(names.items())
                 if (c or "").startswith("pt_autograd")), None)
main_run = delta_s(job0, {MAIN: job1[MAIN]}, 0) if MAIN in job1 else None
main_wait = delta_s(job0, {MAIN: job1[MAIN]}, 1) if MAIN in job1 else None
ag_run = delta_s(job0, {autograd["tid"]: job1[autograd["tid"]]}, 0) if autograd else None
ag_wait = delta_s(job0, {autograd["tid"]: job1[autograd["tid"]]}, 1) if autograd else None
others = {tid: v for tid, v in job1.items() if tid != MAIN and (not autograd or tid != autograd["tid"])}
main_asleep = max(0.0, wall - main_run - main_wait) if main_run is not None else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
at_alone = n / alone_rate if alone_rate else None
overhead = max(0.0, wall - at_alone) if at_alone is not None else None


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def r4(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None


decoys = []
for k, p in enumerate(preps):
    a, z = prep0.get(p.pid, {}), prep1.get(p.pid, {})
    c0, c1 = cnt0[k] or (0, 0), cnt1[k]  # none yet at the run's start: none done before it
    decoys.append({"what": "shard_prep: a background process at nice 19 on the job's CPUs (zlib, sha256, numpy)",
                   "pid": p.pid, "tids": sorted(set(prep_tids.get(p.pid) or [p.pid]) | set(z)), "comm": "shard_prep",
                   "cpus": sc.host_cpus["job"], "cpus_used_here": sc.job_cpus, "nice": prep_nice.get(p.pid),
                   "span_ns": [started, b1], "alive_at_end": alive[k],
                   "run_s": delta_s(a, z, 0) if z else None, "cpu_wait_s": delta_s(a, z, 1) if z else None,
                   "shards": (c1[0] - c0[0]) if c1 else None,
                   "bytes_written": (c1[1] - c0[1]) if c1 else None})
prep_run = round(sum(d["run_s"] or 0.0 for d in decoys), 4)
prep_wait = round(sum(d["cpu_wait_s"] or 0.0 for d in decoys), 4)
sc.extra["decoys"] = decoys
sc.extra["shard_prep"] = {"pids": [p.pid for p in preps], "comm": "shard_prep", "nice": NICE,
                          "cpus": sc.host_cpus["job"], "cpus_used_here": sc.job_cpus,
                          "shard_tokens": SHARD_TOKENS, "folder": OUT_DIR,
                          "what": "numpy Zipf draws, zlib.compress level 6, hashlib.sha256, a write to /var/tmp, "
                                  "back to back"}
sc.extra["autograd"] = autograd
sc.extra["threads"] = [{"tid": tid, "comm": names[tid], "run_s": delta_s(job0, {tid: job1[tid]}, 0),
                        "cpu_wait_s": delta_s(job0, {tid: job1[tid]}, 1)} for tid in sorted(names)]
sc.extra["self"] = {**{k: round(v, 4) for k, v in own.items()}, "wall_s": round(wall, 4),
                    "steps_per_s": round(n / wall, 2), "steps_per_s_alone": round(alone_rate, 2),
                    "with_over_alone": round(n / wall / alone_rate, 4) if alone_rate else None,
                    "at_alone_rate_s": r4(at_alone), "prep_overhead_s": r4(overhead),
                    "prep_overhead_share": share(overhead),
                    "step_ms_mean": round(wall / max(n, 1) * 1e3, 4),
                    "issue_share": share(own["issue_s"]), "item_share": share(own["item_s"]),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "main_asleep_s": r4(main_asleep), "main_asleep_share": share(main_asleep),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "other_threads_run_s": delta_s(job0, others, 0),
                    "other_threads_cpu_wait_s": delta_s(job0, others, 1),
                    "minor_faults_per_s": round((r1.ru_minflt - r0.ru_minflt) / wall, 1),
                    "major_faults": r1.ru_majflt - r0.ru_majflt,
                    "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "gpu_fwd_ms": round(gpu_fwd_s * 1e3, 3) if gpu_fwd_s is not None else None,
                    "gpu_bwd_ms": round(gpu_bwd_s * 1e3, 3) if gpu_bwd_s is not None else None,
                    "gpu_opt_ms": round(gpu_opt_s * 1e3, 3) if gpu_opt_s is not None else None,
                    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
                    "gpu_busy_s": r4(gpu_busy), "gpu_busy_share": share(gpu_busy),
                    "prep_run_s": prep_run, "prep_cpu_share": round(prep_run / (wall * len(sc.job_cpus)), 4),
                    "prep_cpu_wait_s": prep_wait,
                    "prep_shards": sum(d["shards"] or 0 for d in decoys),
                    "prep_bytes_written": sum(d["bytes_written"] or 0 for d in decoys),
                    "prep_nice": sorted({d["nice"] for d in decoys if d["nice"] is not None}),
                    "prep_shares_job_cpus": True, "job_cpus": len(sc.job_cpus),
                    "params_m": round(NPARAM / 1e6, 2), "batch": BATCH, "image": [3, SIDE, SIDE],
                    "mean_loss": round(own["running_loss"] / max(n, 1), 4), "python": sys.version.split()[0]}
if not sc.cuda:
    sc.note("a tiny model on the CPU: no GPU timings, no allocator counters; the job is not GPU-bound there, so the "
            "decoys at nice 19 still take the CPU the trainer leaves.")
sc.note(f"natural, a control: measured by the script: alone {alone_rate:.2f} steps/s; beside {len(preps)} shard_prep "
        f"processes at nice {NICE} on its CPUs {sc.job_cpus} ({prep_run:.2f} s of CPU in the run, "
        f"{sum(d['shards'] or 0 for d in decoys)} shards) {n} steps ({n / wall:.2f}/s) in {wall:.2f} s (their cost "
        f"{overhead and round(overhead, 2)} s): {own['issue_s']:.2f} s queueing the steps, {own['item_s']:.2f} s in "
        f".item(); the main thread ran {main_run} s, waited for a CPU {main_wait} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
