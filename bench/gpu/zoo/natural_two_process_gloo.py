"""natural_two_process_gloo (natural, nothing staged): data-parallel training as a user without NCCL writes it:
torch.distributed with the gloo backend, 2 processes (rank 0 is this script's process, rank 1 the same script started
again with ZOO_GLOO_RANK=1), both on the one GPU, rank 0 pinned to CPU 2 and rank 1 to CPU 3; each wraps the zoo's MLP
(512-2048-2048-2048-10, batch 8192, fp32 without TF32, fused AdamW) in DistributedDataParallel over the gloo process
group, so each backward's gradient buckets (~38 MB) are copied to the host, all-reduced over loopback TCP by gloo and
copied back; batches already on the GPU, loss.item() each step, every 10 steps a small CPU all_reduce (MAX) of a stop
flag so that both ranks stop on the same step. 20 s. The all-reduce is DDP's default one (sum / world size) done by a
comm hook that also times it (from the first bucket's hook to the last bucket's completion, each step). Each rank
measures itself: the steps per second, its time in loss.backward() (which holds the all-reduce), in loss.item(), in
the all-reduce, a plain (no-DDP) forward+backward's wall time, and a step's GPU time queued without the all-reduce
(common.gpu_seconds_queued on a plain copy of the model with its own optimiser: forward, backward, optimiser step), the
two ranks measuring in turn so that neither's kernels share the GPU with the other's then. Rank 1 writes its measures
to a file that rank 0 reads into the truth (`self.rank1`); truth `peer` names rank 1's process. The feeder is rank 0's
main thread."""

import copy
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import types

from common import Scenario, Trainer, gpu_seconds_queued, pin, stop

RANK = int(os.environ.get("ZOO_GLOO_RANK", "0"))
STOP_EVERY = 10
WARMUP_STEPS = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if RANK == 0:
    sc = Scenario("natural_two_process_gloo", "natural", "DistributedDataParallel of the MLP over gloo, 2 processes "
                  "on one GPU (CPUs 2 and 3), gradients all-reduced on the host, loss.item() each step, 20 s, "
                  "nothing staged", job_cpus=[2, 3], control=True)
    cfg = types.SimpleNamespace(cuda=sc.cuda, device=sc.device, scale=sc.scale)
    PORT = free_port()
    OTHER = os.path.join(tempfile.mkdtemp(prefix="zoo_gloo_"), "rank1.json")
    env = dict(os.environ, ZOO_GLOO_RANK="1", ZOO_GLOO_PORT=str(PORT), ZOO_GLOO_OUT=OTHER,
               GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    os.environ["GLOO_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"]
    peer = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env)
    pin([2])  # the calling thread, before torch starts any: the threads it starts inherit CPU 2
else:
    sc = None
    pin([3])
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    scale = float(sys.argv[sys.argv.index("--scale") + 1]) if "--scale" in sys.argv else 1.0
    cfg = types.SimpleNamespace(cuda=device == "cuda", device=device, scale=scale)
    PORT = int(os.environ["ZOO_GLOO_PORT"])
    OTHER = os.environ["ZOO_GLOO_OUT"]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

if cfg.cuda:
    torch.cuda.set_device(0)
else:
    torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK, world_size=2,
                        timeout=datetime.timedelta(seconds=120))
tr = Trainer(cfg)
model, opt, loss_fn = tr.model, tr.opt, tr.loss_fn
plain = copy.deepcopy(model)  # before DDP: the same weights, never all-reduced (the measures without the all-reduce)
ddp = DDP(model)
own = {"steps": 0, "backward_s": 0.0, "item_s": 0.0, "allreduce_s": 0.0, "stop_checks_s": 0.0}
hook_state = {"first": None, "last": None}


def timed_allreduce(state, bucket):
    """DDP's default all-reduce (sum, then / world size), timed from the step's first bucket to its last completion."""
    t0 = time.perf_counter()
    if state["first"] is None:
        state["first"] = t0
    buf = bucket.buffer()
    buf.div_(dist.get_world_size())
    fut = dist.all_reduce(buf, async_op=True).get_future()

    def done(f):
        state["last"] = time.perf_counter()
        return f.value()[0]

    return fut.then(done)


ddp.register_comm_hook(hook_state, timed_allreduce)
flag = torch.zeros(1)


def agree_stop(mine: bool) -> bool:
    t0 = time.perf_counter()
    flag.fill_(1.0 if mine else 0.0)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    own["stop_checks_s"] += time.perf_counter() - t0
    return flag.item() > 0


def step() -> None:
    i = tr.i
    tr.i += 1
    x, y = tr.xs[i % len(tr.xs)], tr.ys[i % len(tr.ys)]
    loss = loss_fn(ddp(x), y)
    t0 = time.perf_counter()
    loss.backward()
    t1 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t2 = time.perf_counter()
    loss.item()
    t3 = time.perf_counter()
    own["backward_s"] += t1 - t0
    own["item_s"] += t3 - t2
    if hook_state["first"] is not None and hook_state["last"] is not None:
        own["allreduce_s"] += max(0.0, hook_state["last"] - hook_state["first"])
    hook_state.update(first=None, last=None)
    own["steps"] += 1


def measure_alone() -> dict:
    """This rank's forward+backward wall time without DDP (median of 20) and a step's GPU time queued, on the copy."""
    opt2 = torch.optim.AdamW(plain.parameters(), lr=1e-4, fused=cfg.cuda or None)
    x, y = tr.xs[0], tr.ys[0]
    walls = []
    for _ in range(25):
        tr.sync()
        t0 = time.perf_counter()
        loss_fn(plain(x), y).backward()
        tr.sync()
        walls.append(time.perf_counter() - t0)
        plain.zero_grad(set_to_none=True)
    walls = sorted(walls[5:])
    gpu_step_s = None
    if cfg.cuda:
        def work(_) -> None:
            loss_fn(plain(x), y).backward()
            opt2.step()
            opt2.zero_grad(set_to_none=True)

        work(None)
        torch.cuda.synchronize()
        runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
        gpu_step_s = runs[len(runs) // 2] if runs else None
    return {"plain_fwd_bwd_ms": round(walls[len(walls) // 2] * 1e3, 4),
            "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None}


def summary(wall: float, alone: dict) -> dict:
    n = max(own["steps"], 1)
    gpu = alone["gpu_step_ms"]
    return {**{k: round(v, 4) for k, v in own.items()}, **alone, "wall_s": round(wall, 4),
            "steps_per_s": round(own["steps"] / wall, 2), "step_ms_mean": round(wall / n * 1e3, 4),
            "backward_share": round(own["backward_s"] / wall, 4), "item_share": round(own["item_s"] / wall, 4),
            "allreduce_share": round(own["allreduce_s"] / wall, 4),
            "gpu_busy_s": round(own["steps"] * gpu / 1e3, 4) if gpu is not None else None,
            "gpu_busy_share": round(own["steps"] * gpu / 1e3 / wall, 4) if gpu is not None else None,
            "pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0))}


def measure_in_turn() -> dict:
    """Each rank measures alone while the other waits in a barrier (their kernels would share the GPU otherwise)."""
    tr.sync()
    alone = {}
    for r in (0, 1):
        dist.barrier()
        if r == RANK:
            alone = measure_alone()
    dist.barrier()
    return alone


def timed_loop(on_half=None) -> float:
    """Steps until rank 0 says stop (20 s by its clock); both ranks take the same number of steps."""
    t = time.perf_counter()
    half, end = t + 10.0 * cfg.scale, t + 20.0 * cfg.scale
    halved = False
    while True:
        step()
        if sc is not None:
            sc.step()
        now = time.perf_counter()
        if on_half and not halved and now >= half:
            on_half()
            halved = True
        if own["steps"] % STOP_EVERY == 0 and agree_stop(RANK == 0 and now >= end):
            break
    tr.sync()
    return time.perf_counter() - t


def prepare() -> dict:
    """Warm-up (both ranks), the measures alone (in turn), 2 s more steps (the spin kernels well before the baseline),
    then the counters zeroed on both ranks at the same step."""
    for _ in range(WARMUP_STEPS):
        step()
    alone = measure_in_turn()
    warm_end = time.perf_counter() + 2.0 * cfg.scale
    while True:
        step()
        if own["steps"] % STOP_EVERY == 0 and agree_stop(RANK == 0 and time.perf_counter() >= warm_end):
            break
    tr.sync()
    dist.barrier()
    for k in own:
        own[k] = 0 if k == "steps" else 0.0
    return alone


if RANK == 1:
    alone = prepare()
    wall = timed_loop()
    tmp = OTHER + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(summary(wall, alone), fh)
    os.replace(tmp, OTHER)
    dist.barrier()  # rank 0 reads the file after this
    sys.stdout.flush()
    os._exit(0)

try:
    alone = prepare()
    marks = {}
    b0 = sc.mark("baseline")
    wall = timed_loop(on_half=lambda: marks.setdefault("half", sc.mark("half")))
    b1 = sc.mark("end")
    mid = marks.get("half", (b0 + b1) // 2)
    dist.barrier()
    with open(OTHER) as fh:
        other = json.load(fh)
    peer.wait(60)
finally:
    stop([peer])
mine = summary(wall, alone)
both = (mine["gpu_busy_s"] + other["gpu_busy_s"]) / wall if mine["gpu_busy_s"] is not None and other[
    "gpu_busy_s"] is not None else None
sc.extra["self"] = {**mine, "gpu_busy_share_both": round(both, 4) if both is not None else None, "rank1": other,
                    "world_size": 2, "backend": "gloo", "batch": tr.batch, "stop_every": STOP_EVERY,
                    "grad_mb": round(sum(p.numel() for p in model.parameters()) * 4 / 2 ** 20, 2)}
sc.extra["peer"] = {"pid": peer.pid, "rank": 1, "cpus": other["cpus"]}
sc.note(f"natural: measured by the script: rank 0 took {own['steps']} steps ({own['steps'] / wall:.1f}/s) in "
        f"{wall:.2f} s: {own['backward_s']:.2f} s in loss.backward() (all-reduce {own['allreduce_s']:.2f} s by the "
        f"comm hook), {own['item_s']:.2f} s in loss.item(); a plain forward+backward takes "
        f"{alone['plain_fwd_bwd_ms']:.2f} ms; rank 1: {other['backward_s']:.2f} s in backward, "
        f"{other['allreduce_s']:.2f} s all-reducing; "
        + (f"a step's kernels take {alone['gpu_step_ms']:.2f} ms of GPU time queued (GPU busy {both:.0%} of the run "
           "with both ranks' kernels)." if both is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
