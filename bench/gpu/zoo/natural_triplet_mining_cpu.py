"""natural_triplet_mining_cpu (natural, nothing staged): a metric-learning job (person re-identification style) trained
with online triplet mining the way a widely copied PyTorch implementation writes it (siamese-triplet's OnlineTripletLoss
with a RandomNegativeTripletSelector): a ResNet-18-style embedding net (BasicBlocks 64-128-256-512, BatchNorm, global
average pool, a 128-d L2-normalised embedding; fp32 without TF32, cudnn.benchmark) on batches of 32 identities x 4
images (3x128x64) chosen by a balanced batch sampler (numpy on the host: the indices and labels then copied to the
GPU, where 256 identities x 8 images are held). The loss hands the embeddings to the selector, which does its work on
the CPU, as that code does by default (`cpu=True`): embeddings.cpu() (waiting for the forward) and the pairwise
distance matrix computed there with torch CPU ops, labels.cpu().numpy(), then for each identity every anchor-positive
pair (itertools.combinations: 6 per identity, 192 a batch) and for each pair the distances to all other identities'
images indexed out of the CPU matrix, the hinge values read back as numpy and a negative with a positive loss chosen
at random (np.where, np.random.choice): hundreds of small torch and numpy operations in Python a step, tens of
milliseconds of one CPU thread; then the triplets (a LongTensor) copied to the GPU, the triplet loss on the GPU, the
backward, Adam, loss.item() each step. The GPU idles while the CPU mines. One process on CPUs 2-3, no threads of its own
(PyTorch's autograd thread runs the backward), no workers, no children, no IO, no lock, no sleep. 20 s (smaller with
--device cpu: a 2-stage net of 16-32 channels, 3x32x16 images, 16 identities x 4).

The script measures itself: the steps per second; the main thread's time drawing the batch (the sampler and its
copies: `sample_s`), queueing the forward, in the selector's copies to the host (`d2h_s`: embeddings.cpu(), waiting
for the forward, and labels.cpu()), in its mining on the CPU (`select_s`, wall and its CPU clock: the CPU distance
matrix and the Python loop), in copying the triplets to the GPU (`h2d_s`), queueing the loss, in loss.backward()
(`backward_s`, its wait on PyTorch's autograd thread), in the optimiser and in loss.item(); the triplets and
anchor-positive pairs a step; before the run, the same steps with the mining replaced by batch-hard mining on the GPU
(the fix, a few masked max/min kernels: `gpu_mining_steps_per_s`), so that what mining on the CPU costs the run is
known (`mining_overhead_s`: the run's wall time beyond its steps at that rate); the main thread's and the autograd
thread's time on a CPU and waiting for one over the run (their schedstat); the process's minor page faults, the device
allocator's cudaMalloc calls and the caching host allocator's cudaHostAlloc calls; and a step's GPU time queued
(common.gpu_seconds_queued: the forward, the triplet loss with a fixed set of triplets already on the GPU, the backward
and Adam, nothing read back), so that the GPU's busy share is known. Truth `autograd` names PyTorch's autograd
thread."""

import os
import resource
import threading
import time
from itertools import combinations

from common import Scenario, gpu_seconds_queued

sc = Scenario("natural_triplet_mining_cpu", "natural", "a ResNet-18-style embedding net trained with online triplet "
              "mining whose selector copies the embeddings to the CPU and loops over anchor-positive pairs in Python "
              "with torch CPU ops and numpy (siamese-triplet's OnlineTripletLoss), 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

nn = torch.nn
F = nn.functional
PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
WIDTHS, H, W, IDS, PER_ID, P, K, EMB = (((64, 128, 256, 512), 128, 64, 256, 8, 32, 4, 128) if sc.cuda
                                        else ((16, 32), 32, 16, 64, 8, 16, 4, 32))
MARGIN = 1.0
KEYS = ("sample_s", "forward_s", "d2h_s", "select_s", "select_cpu_s", "h2d_s", "loss_s", "backward_s", "opt_s",
        "item_s")
own = {"steps": 0, **dict.fromkeys(KEYS, 0.0), "triplets": 0, "pairs": 0, "running_loss": 0.0}


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.short(x))


class EmbeddingNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, WIDTHS[0], 7, 2, 3, bias=False), nn.BatchNorm2d(WIDTHS[0]), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], WIDTHS[0]
        for k, cout in enumerate(WIDTHS):
            blocks += [BasicBlock(cin, cout, 1 if k == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, EMB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.stem(x)).mean(dim=(2, 3))
        return F.normalize(self.fc(h), dim=1)


def pdist(vectors: torch.Tensor) -> torch.Tensor:
    return (-2 * vectors.mm(torch.t(vectors)) + vectors.pow(2).sum(dim=1).view(1, -1)
            + vectors.pow(2).sum(dim=1).view(-1, 1))


def random_hard_negative(loss_values: np.ndarray):
    hard_negatives = np.where(loss_values > 0)[0]
    return np.random.choice(hard_negatives) if len(hard_negatives) > 0 else None


class RandomNegativeTripletSelector:
    """siamese-triplet's FunctionNegativeTripletSelector (random hard negatives), its work on the CPU (cpu=True)."""

    def __init__(self, margin: float, cpu: bool = True) -> None:
        self.margin, self.cpu = margin, cpu

    def get_triplets(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        if self.cpu:
            embeddings = embeddings.cpu()
        labels = labels.cpu().data.numpy()
        t1, c1 = time.perf_counter(), time.thread_time()
        distance_matrix = pdist(embeddings)
        distance_matrix = distance_matrix.cpu()
        triplets, anchor_positive, negative_indices = [], None, None
        for label in set(labels):
            label_mask = labels == label
            label_indices = np.where(label_mask)[0]
            if len(label_indices) < 2:
                continue
            negative_indices = np.where(np.logical_not(label_mask))[0]
            anchor_positives = np.array(list(combinations(label_indices, 2)))  # all anchor-positive pairs
            own["pairs"] += len(anchor_positives)
            ap_distances = distance_matrix[anchor_positives[:, 0], anchor_positives[:, 1]]
            for anchor_positive, ap_distance in zip(anchor_positives, ap_distances):
                loss_values = (ap_distance - distance_matrix[torch.LongTensor(np.array([anchor_positive[0]])),
                                                             torch.LongTensor(negative_indices)] + self.margin)
                loss_values = loss_values.data.cpu().numpy()
                hard_negative = random_hard_negative(loss_values)
                if hard_negative is not None:
                    triplets.append([anchor_positive[0], anchor_positive[1], negative_indices[hard_negative]])
        if len(triplets) == 0:
            triplets.append([anchor_positive[0], anchor_positive[1], negative_indices[0]])
        out = torch.LongTensor(np.array(triplets))
        t2, c2 = time.perf_counter(), time.thread_time()
        own["d2h_s"] += t1 - t0
        own["select_s"] += t2 - t1
        own["select_cpu_s"] += c2 - c1
        own["triplets"] += len(triplets)
        return out


class OnlineTripletLoss(nn.Module):
    def __init__(self, margin: float, triplet_selector: RandomNegativeTripletSelector) -> None:
        super().__init__()
        self.margin, self.triplet_selector = margin, triplet_selector

    def forward(self, embeddings: torch.Tensor, target: torch.Tensor,
                triplets: torch.Tensor | None = None) -> torch.Tensor:
        if triplets is None:
            triplets = self.triplet_selector.get_triplets(embeddings, target)
            th = time.perf_counter()
            if embeddings.is_cuda:
                triplets = triplets.cuda()
            own["h2d_s"] += time.perf_counter() - th
        ap_distances = (embeddings[triplets[:, 0]] - embeddings[triplets[:, 1]]).pow(2).sum(1)
        an_distances = (embeddings[triplets[:, 0]] - embeddings[triplets[:, 2]]).pow(2).sum(1)
        losses = F.relu(ap_distances - an_distances + self.margin)
        return losses.mean()


def batch_hard_loss(embeddings: torch.Tensor, target: torch.Tensor, margin: float = MARGIN) -> torch.Tensor:
    """The fix: batch-hard mining on the GPU (the hardest positive and negative per anchor, masked max/min)."""
    d = pdist(embeddings).clamp_min(0)
    same = target.view(-1, 1) == target.view(1, -1)
    hardest_pos = (d * same).max(1).values
    hardest_neg = (d + same * 1e9).min(1).values
    return F.relu(hardest_pos - hardest_neg + margin).mean()


class BalancedBatchSampler:
    """P identities x K images each, drawn with numpy (the dataset's labels are known on the host)."""

    def __init__(self, labels: np.ndarray, n_classes: int, n_samples: int, seed: int = 0) -> None:
        self.labels, self.n_classes, self.n_samples = labels, n_classes, n_samples
        self.classes = np.unique(labels)
        self.by_class = {c: np.where(labels == c)[0] for c in self.classes}
        self.rng = np.random.default_rng(seed)

    def next(self) -> np.ndarray:
        chosen = self.rng.choice(self.classes, self.n_classes, replace=False)
        return np.concatenate([self.rng.choice(self.by_class[c], self.n_samples, replace=False) for c in chosen])


torch.manual_seed(0)
np.random.seed(0)
model = EmbeddingNet().to(dev)
opt = torch.optim.Adam(model.parameters(), lr=3e-4)
loss_fn = OnlineTripletLoss(MARGIN, RandomNegativeTripletSelector(MARGIN))
labels_np = np.repeat(np.arange(IDS), PER_ID)
images = torch.randn(IDS * PER_ID, 3, H, W, device=dev)  # the identities' images, already normalised on the device
images += torch.randn(IDS, 3, H, W, device=dev).repeat_interleave(PER_ID, 0)  # an identity's look
sampler = BalancedBatchSampler(labels_np, P, K)
mode = {"fix": False}


def step() -> None:
    t0 = time.perf_counter()
    idx = sampler.next()
    data = images[torch.from_numpy(idx).to(dev)]
    target = torch.from_numpy(labels_np[idx]).to(dev)
    t1 = time.perf_counter()
    opt.zero_grad()
    embeddings = model(data)
    t2 = time.perf_counter()
    loss = batch_hard_loss(embeddings, target) if mode["fix"] else loss_fn(embeddings, target)
    t3 = time.perf_counter()
    loss.backward()  # queued by PyTorch's autograd thread; the main thread waits for it
    t4 = time.perf_counter()
    opt.step()
    t5 = time.perf_counter()
    own["running_loss"] += loss.item()
    t6 = time.perf_counter()
    own["sample_s"] += t1 - t0
    own["forward_s"] += t2 - t1
    own["loss_s"] += t3 - t2  # the selector's copies, its mining and the triplets' copy in it (each also apart)
    own["backward_s"] += t4 - t3
    own["opt_s"] += t5 - t4
    own["item_s"] += t6 - t5
    own["steps"] += 1


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def reset() -> None:
    for k in own:
        own[k] = 0 if k in ("steps", "triplets", "pairs") else 0.0


def schedstat(tid: int) -> tuple[float, float] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def autograd_thread() -> dict | None:
    """PyTorch's autograd thread for the GPU (pt_autograd_0), started at the first backward on CUDA tensors."""
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{PID}/task")):
        try:
            with open(f"/proc/{PID}/task/{tid}/comm") as fh:
                comm = fh.read().strip()
        except OSError:
            continue
        if comm.startswith("pt_autograd"):
            return {"pid": PID, "tid": tid, "comm": comm}
    return None


def allocs() -> tuple[int, int | None]:
    """(the device allocator's cudaMalloc calls, the caching host allocator's cudaHostAlloc calls) so far."""
    if not sc.cuda:
        return 0, None
    try:
        host = int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))
    except (RuntimeError, AttributeError):
        host = None
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)), host


def timed(seconds: float) -> tuple[int, float]:
    """Steps back to back for `seconds` (then synchronised): (steps, wall)."""
    n0, t = own["steps"], time.perf_counter()
    end = t + seconds
    while time.perf_counter() < end:
        step()
    sync()
    return own["steps"] - n0, time.perf_counter() - t


for _ in range(10):  # warm-up: cuDNN's algorithms chosen, the allocator, the autograd thread started
    step()
sync()
fixed_idx = sampler.next()
fixed_data = images[torch.from_numpy(fixed_idx).to(dev)]
fixed_target = torch.from_numpy(labels_np[fixed_idx]).to(dev)
fixed_triplets = loss_fn.triplet_selector.get_triplets(model(fixed_data).detach(), fixed_target).to(dev)
gpu_step_s = None
if sc.cuda:
    def work(_) -> None:
        """One step's GPU work with a fixed set of triplets already on the GPU (forward, the triplet loss, backward,
        Adam), nothing read back (the CPU's mining and its copies left out)."""
        opt.zero_grad()
        loss_fn(model(fixed_data), fixed_target, fixed_triplets).backward()
        opt.step()

    runs = sorted(r for r in (gpu_seconds_queued(torch, work) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
# The fix, before the run: batch-hard mining on the GPU.
mode["fix"] = True
for _ in range(5):
    step()
sync()
reset()
fix_steps, fix_wall = timed(3.0 * sc.scale)
fix = {k: own[k] / max(fix_steps, 1) for k in KEYS}
# As the script has it: the selector on the CPU.
mode["fix"] = False
timed(2.0 * sc.scale)  # the spin kernels well before the run
ag = autograd_thread()
reset()
main0 = schedstat(MAIN)
ag0 = schedstat(ag["tid"]) if ag else None
f0, (m0, h0) = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, allocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(10.0 * sc.scale, step)
mid = sc.mark("half")
sc.run_for(10.0 * sc.scale, step)
sync()
b1 = sc.mark("end")
wall = time.perf_counter() - t
main1 = schedstat(MAIN)
ag1 = schedstat(ag["tid"]) if ag else None
f1, (m1, h1) = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, allocs()
n = own["steps"]


def share(v: float | None) -> float | None:
    return round(v / wall, 4) if v is not None else None


def ms(v: float) -> float:
    return round(v * 1e3, 4)


fix_rate = fix_steps / fix_wall if fix_wall > 0 else None
at_fix_rate = n / fix_rate if fix_rate else None
overhead = max(0.0, wall - at_fix_rate) if at_fix_rate is not None else None
mining = own["d2h_s"] + own["select_s"] + own["h2d_s"]
loss_issue = max(0.0, own["loss_s"] - mining)
main_run = round(main1[0] - main0[0], 4) if main0 and main1 else None
main_wait = round(main1[1] - main0[1], 4) if main0 and main1 else None
ag_run = round(ag1[0] - ag0[0], 4) if ag0 and ag1 else None
ag_wait = round(ag1[1] - ag0[1], 4) if ag0 and ag1 else None
gpu_busy = n * gpu_step_s if gpu_step_s is not None else None
sc.extra["autograd"] = ag
sc.extra["self"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in own.items()},
                    "wall_s": round(wall, 4), "steps_per_s": round(n / wall, 2), "step_ms_mean": ms(wall / max(n, 1)),
                    "mining_s": round(mining, 4), "mining_share": share(mining),
                    "mining_ms_mean": ms(mining / max(n, 1)),
                    "select_share": share(own["select_s"]), "select_cpu_share": share(own["select_cpu_s"]),
                    "d2h_share": share(own["d2h_s"]), "h2d_share": share(own["h2d_s"]),
                    "sample_share": share(own["sample_s"]), "forward_share": share(own["forward_s"]),
                    "loss_issue_s": round(loss_issue, 4), "backward_share": share(own["backward_s"]),
                    "item_share": share(own["item_s"]),
                    "triplets_per_step": round(own["triplets"] / max(n, 1), 2),
                    "pairs_per_step": round(own["pairs"] / max(n, 1), 2),
                    "gpu_mining_steps": fix_steps, "gpu_mining_wall_s": round(fix_wall, 4),
                    "gpu_mining_steps_per_s": round(fix_rate, 2) if fix_rate else None,
                    **{f"gpu_mining_{k.removesuffix('_s')}_ms": ms(v) for k, v in fix.items()},
                    "at_gpu_mining_rate_s": round(at_fix_rate, 4) if at_fix_rate is not None else None,
                    "mining_overhead_s": round(overhead, 4) if overhead is not None else None,
                    "mining_overhead_share": share(overhead),
                    "main_run_s": main_run, "main_cpu_share": share(main_run),
                    "main_cpu_wait_s": main_wait, "main_cpu_wait_share": share(main_wait),
                    "autograd_run_s": ag_run, "autograd_cpu_share": share(ag_run),
                    "autograd_cpu_wait_s": ag_wait, "autograd_cpu_wait_share": share(ag_wait),
                    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
                    "host_allocs_per_s": round((h1 - h0) / wall, 3) if h0 is not None and h1 is not None else None,
                    "gpu_step_ms": ms(gpu_step_s) if gpu_step_s is not None else None,
                    "gpu_busy_s": round(gpu_busy, 4) if gpu_busy is not None else None,
                    "gpu_busy_share": share(gpu_busy), "batch": P * K, "identities_per_batch": P,
                    "images_per_identity": K, "image": [3, H, W], "intra_op_threads": torch.get_num_threads()}
if not sc.cuda:
    sc.note("on the CPU: the selector's copies are no copies, no autograd thread (the backward runs on the main "
            "thread), no GPU timings, no allocator counters.")
sc.note(f"natural: measured by the script: {n} steps ({n / wall:.1f}/s) in {wall:.2f} s: {mining:.2f} s in the "
        f"selector ({own['d2h_s']:.2f} s in its copies to the host, {own['select_s']:.2f} s mining on the CPU, "
        f"{own['select_cpu_s']:.2f} s of CPU; {own['triplets'] / max(n, 1):.0f} triplets a step), {own['h2d_s']:.2f} s "
        f"copying the triplets to the device, {own['backward_s']:.2f} s in backward(), {own['item_s']:.2f} s in "
        f".item(); with batch-hard mining on the device {fix_rate and round(fix_rate, 1)} steps/s (mining on the CPU "
        f"cost {overhead and round(overhead, 2)} s of the run); the main thread ran {main_run} s, waited for a CPU "
        f"{main_wait} s; the autograd thread {(ag or {}).get('comm')} ran {ag_run} s; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.2f} ms of GPU time queued (GPU busy {gpu_busy / wall:.0%} of the "
           "run)." if gpu_busy is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, mid), (mid, b1)))
