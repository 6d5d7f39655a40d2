"""natural_gil_stats_thread (natural, nothing staged): a small text classifier whose training script also runs a data
team's "live dataset stats" feature in a background thread of the same process, computed in pure Python: the corpus is
held twice, as the GPU's padded token tensor (12,000 documents x 128 token ids, vocabulary 8,192, labels from the
documents' leading tokens) and as the Python lists of token ids it was tokenised into (~1.4 million ids, Zipf-like,
lengths 16-400); the model is an embedding (256) mean-pooled over the non-padding tokens and an MLP (256-512-512-20),
batches of 256 documents drawn on the GPU, fp32, fused AdamW, loss.item() each step: short steps, a few hundred a
second, whose time is the main thread's Python and launches. The stats thread (threading's name and OS name
`ds_stats`) walks the lists over and over (one pass a "refresh"): a collections.Counter of token ids, a Counter of
bigrams (zip(doc, doc[1:])), a histogram of lengths, the documents decoded into words (" ".join over the vocabulary's
strings) with their characters counted and a normalised-text hash for duplicates, and every 2,000 documents a snapshot
(top tokens, distinct bigrams, type/token ratio, duplicate share) published for the loop to log every 200 steps. The
main loop runs ~5 s alone, then the thread starts and runs with it for ~15 s, to the end: CPython runs one thread's
bytecode at a time (the GIL; torch's ops release it while they run and take it back after). CPUs 2-3.

The script measures itself, in each stretch (alone, with the thread): the steps and steps per second; the main
thread's time on a CPU, waiting for one and asleep (its schedstat: exec runtime and run delay; asleep the rest), its
time queueing the steps and in loss.item(); every thread's CPU time and run-queue wait (truth `threads`); the stats
thread's CPU time and wait (schedstat), documents and tokens counted and passes made; a step's GPU time queued
(common.gpu_seconds_queued on a copy of the model with its own optimiser, before the run), so that the GPU's busy
share in each stretch is known; the process's minor page faults and cudaMalloc calls; which Python ran, its switch
interval and whether its GIL was enabled (sys._is_gil_enabled where it exists). Truth `stats_thread` names the thread;
marks_ns `thread` is when it started (steps_per_s: `baseline` alone, `window` with it)."""

import collections
import copy
import os
import resource
import sys
import sysconfig
import threading
import time

from common import Scenario, comm_of, gpu_seconds_queued, set_thread_name, tids_of

sc = Scenario("natural_gil_stats_thread", "natural", "a small text classifier (embedding, mean pool, MLP, a few "
              "hundred steps a second) with a 'live dataset stats' thread counting tokens, bigrams and characters in "
              "pure Python over the corpus's token lists, started after 5 s alone, 20 s, nothing staged",
              job_cpus=[2, 3], control=True)
import numpy as np  # noqa: E402
import torch  # noqa: E402

PID, MAIN = os.getpid(), threading.get_native_id()
dev = torch.device(sc.device)
VOCAB, NDOCS, SEQ, BATCH, EMB, HID, NCLASS = 8192, 12_000, 128, 256, 256, 512, 20
if not sc.cuda:
    NDOCS, BATCH = 3000, 64
SNAPSHOT_EVERY, LOG_EVERY = 2000, 200
ALONE_S, WITH_S = 5.0, 15.0

# ---- the corpus: token lists (the stats thread's) and the padded tensor (the model's) -----------------------------
rng = np.random.default_rng(0)
letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
WORDS = ["<pad>"] + ["".join(letters[rng.integers(0, 26, rng.integers(2, 11))]) for _ in range(VOCAB - 1)]
lengths = np.clip(rng.lognormal(4.6, 0.6, NDOCS), 16, 400).astype(int)
ranks = rng.zipf(1.15, int(lengths.sum())) % (VOCAB - 1) + 1  # Zipf-like ids, 0 is padding
docs: list[list[int]] = [ranks[a:b].tolist() for a, b in zip(np.r_[0, np.cumsum(lengths)[:-1]], np.cumsum(lengths))]
padded = np.zeros((NDOCS, SEQ), np.int64)
for i, d in enumerate(docs):
    padded[i, :min(len(d), SEQ)] = d[:SEQ]
tokens = torch.from_numpy(padded).to(dev)
labels = torch.from_numpy((padded[:, :4].sum(1) * 2654435761 % NCLASS).astype(np.int64)).to(dev)


class TextClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, EMB, padding_idx=0)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(EMB, HID), torch.nn.ReLU(), torch.nn.Linear(HID, HID),
                                       torch.nn.ReLU(), torch.nn.Linear(HID, NCLASS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x != 0).unsqueeze(-1).float()
        pooled = (self.emb(x) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.mlp(pooled)


if sc.cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
torch.manual_seed(0)
model = TextClassifier().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=sc.cuda or None)
loss_fn = torch.nn.CrossEntropyLoss()
gen = torch.Generator(device=dev)
gen.manual_seed(0)


# ---- the stats thread ------------------------------------------------------------------------------------------------
class DatasetStats:
    """Live statistics of the corpus, recomputed pass after pass (a refresh), in pure Python."""

    def __init__(self) -> None:
        self.latest: dict = {}
        self.reset()

    def reset(self) -> None:
        self.tok: collections.Counter = collections.Counter()
        self.bigrams: collections.Counter = collections.Counter()
        self.chars: collections.Counter = collections.Counter()
        self.lengths: collections.Counter = collections.Counter()
        self.hashes: set[int] = set()
        self.dups = self.ndocs = self.ntok = 0

    def add(self, doc: list[int]) -> None:
        self.tok.update(doc)
        self.bigrams.update(zip(doc, doc[1:]))
        self.lengths[len(doc) // 16 * 16] += 1
        text = " ".join(WORDS[t] for t in doc)
        self.chars.update(text)
        h = hash(" ".join(text.lower().split()))
        if h in self.hashes:
            self.dups += 1
        self.hashes.add(h)
        self.ndocs += 1
        self.ntok += len(doc)

    def snapshot(self) -> dict:
        return {"docs": self.ndocs, "tokens": self.ntok, "types": len(self.tok),
                "type_token_ratio": len(self.tok) / max(self.ntok, 1), "top_tokens": self.tok.most_common(10),
                "distinct_bigrams": len(self.bigrams), "top_chars": self.chars.most_common(5),
                "mean_length": self.ntok / max(self.ndocs, 1), "dup_share": self.dups / max(self.ndocs, 1)}


stats = DatasetStats()
stop = threading.Event()
counted = {"docs": 0, "tokens": 0, "passes": 0, "snapshots": 0, "cpu_s": 0.0}


def stats_loop() -> None:
    set_thread_name("ds_stats")
    c0 = time.thread_time()
    while not stop.is_set():
        stats.reset()
        for doc in docs:
            if stop.is_set():
                break
            stats.add(doc)
            counted["docs"] += 1
            counted["tokens"] += len(doc)
            if stats.ndocs % SNAPSHOT_EVERY == 0:
                stats.latest = stats.snapshot()
                counted["snapshots"] += 1
        else:
            counted["passes"] += 1
    counted["cpu_s"] = time.thread_time() - c0


# ---- the training loop -----------------------------------------------------------------------------------------------
own = {"steps": 0, "issue_s": 0.0, "item_s": 0.0}
logged: list[dict] = []


def train(m: torch.nn.Module, o: torch.optim.Optimizer) -> torch.Tensor:
    idx = torch.randint(0, NDOCS, (BATCH,), device=dev, generator=gen)
    loss = loss_fn(m(tokens[idx]), labels[idx])
    loss.backward()
    o.step()
    o.zero_grad(set_to_none=True)
    return loss


def step() -> None:
    t0 = time.perf_counter()
    loss = train(model, opt)
    t1 = time.perf_counter()
    value = loss.item()
    t2 = time.perf_counter()
    own["issue_s"] += t1 - t0
    own["item_s"] += t2 - t1
    own["steps"] += 1
    if own["steps"] % LOG_EVERY == 0:
        logged.append({"step": own["steps"], "loss": value, "ttr": stats.latest.get("type_token_ratio")})


def sync() -> None:
    if sc.cuda:
        torch.cuda.synchronize()


def schedstat(tid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{PID}/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None


def all_stats() -> dict[int, tuple[int, int] | None]:
    return {t: schedstat(t) for t in tids_of(PID)}


def mallocs() -> int:
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0)) if sc.cuda else 0


for _ in range(50):
    step()
sync()
gpu_step_s = None
if sc.cuda:
    m2 = copy.deepcopy(model)
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-3, fused=True)
    train(m2, o2)
    torch.cuda.synchronize()
    runs = sorted(r for r in (gpu_seconds_queued(torch, lambda _: train(m2, o2)) for _ in range(5)) if r is not None)
    gpu_step_s = runs[len(runs) // 2] if runs else None
    del m2, o2
warm_end = time.perf_counter() + 2.0 * sc.scale  # the spin kernels well before the baseline
while time.perf_counter() < warm_end:
    step()
sync()
own.update(steps=0, issue_s=0.0, item_s=0.0)
parts: list[dict] = []
stats0 = all_stats()
f0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
b0 = sc.mark("baseline")
t = time.perf_counter()
sc.run_for(ALONE_S * sc.scale, step)
t_mid = time.perf_counter()
parts.append({**own, "wall_s": t_mid - t})
own.update(steps=0, issue_s=0.0, item_s=0.0)
stats_mid = all_stats()
split = sc.mark("thread")
thread = threading.Thread(target=stats_loop, name="ds_stats", daemon=True)
thread.start()  # returns once the thread runs: its native id is known
STATS_TID = thread.native_id
sc.run_for(WITH_S * sc.scale, step)
b1 = sc.mark("end")
t_end = time.perf_counter()
stats1 = all_stats()
f1, m1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallocs()
parts.append({**own, "wall_s": t_end - t_mid})
stop.set()
thread.join(30)
names = {tid: comm_of(PID, tid) for tid in stats1}
wall = t_end - t
alone, with_ = parts


def delta(a: dict, z: dict, tid: int, k: int) -> float | None:
    """A thread's CPU time (k=0) or run-queue wait (k=1) between two readings (s); started between: since it started."""
    za = a.get(tid) or (0, 0)
    zz = z.get(tid)
    return round((zz[k] - za[k]) / 1e9, 4) if zz else None


def main_shares(a: dict, z: dict, span: float) -> dict:
    run, wait = delta(a, z, MAIN, 0) or 0.0, delta(a, z, MAIN, 1) or 0.0
    return {"run_s": round(run, 4), "cpu_wait_s": round(wait, 4), "sleep_s": round(max(0.0, span - run - wait), 4),
            "cpu_share": round(run / span, 4), "cpu_wait_share": round(wait / span, 4),
            "sleep_share": round(max(0.0, span - run - wait) / span, 4)}


m_alone = main_shares(stats0, stats_mid, alone["wall_s"])
m_with = main_shares(stats_mid, stats1, with_["wall_s"])
m_all = main_shares(stats0, stats1, wall)
sps_alone = alone["steps"] / alone["wall_s"]
sps_with = with_["steps"] / with_["wall_s"]
lost = with_["wall_s"] - with_["steps"] / sps_alone if sps_alone else None
others = [tid for tid in stats1 if tid not in (MAIN, STATS_TID)]
others_with = sum(v for v in (delta(stats_mid, stats1, tid, 0) for tid in others) if v is not None)
stats_run, stats_wait = delta(stats_mid, stats1, STATS_TID, 0), delta(stats_mid, stats1, STATS_TID, 1)
extra_off = (1 - m_with["cpu_share"]) - (1 - m_alone["cpu_share"])  # the main thread off a CPU, more than alone
gil_enabled = getattr(sys, "_is_gil_enabled", lambda: True)()
steps = alone["steps"] + with_["steps"]


def busy(n: int, span: float) -> float | None:
    return round(n * gpu_step_s / span, 4) if gpu_step_s is not None else None


sc.extra["stats_thread"] = {"pid": PID, "tid": STATS_TID, "comm": names.get(STATS_TID) or "ds_stats"}
sc.extra["threads"] = [{"tid": tid, "comm": names[tid], "run_alone_s": delta(stats0, stats_mid, tid, 0),
                        "run_with_s": delta(stats_mid, stats1, tid, 0),
                        "cpu_wait_with_s": delta(stats_mid, stats1, tid, 1)} for tid in sorted(names)]
sc.extra["self"] = {
    "wall_s": round(wall, 4), "steps": steps, "steps_per_s": round(steps / wall, 2),
    "wall_alone_s": round(alone["wall_s"], 4), "wall_with_s": round(with_["wall_s"], 4),
    "steps_alone": alone["steps"], "steps_with": with_["steps"],
    "steps_per_s_alone": round(sps_alone, 2), "steps_per_s_with": round(sps_with, 2),
    "slowdown": round(sps_alone / sps_with, 3) if sps_with else None,
    "lost_s": round(lost, 4) if lost is not None else None,
    "lost_share": round(lost / wall, 4) if lost is not None else None,
    "lost_share_with": round(lost / with_["wall_s"], 4) if lost is not None else None,
    "issue_s": round(alone["issue_s"] + with_["issue_s"], 4), "item_s": round(alone["item_s"] + with_["item_s"], 4),
    "issue_share_alone": round(alone["issue_s"] / alone["wall_s"], 4),
    "item_share_alone": round(alone["item_s"] / alone["wall_s"], 4),
    "issue_share_with": round(with_["issue_s"] / with_["wall_s"], 4),
    "item_share_with": round(with_["item_s"] / with_["wall_s"], 4),
    "main_run_s": m_all["run_s"], "main_cpu_wait_s": m_all["cpu_wait_s"], "main_sleep_s": m_all["sleep_s"],
    "main_cpu_share": m_all["cpu_share"], "main_cpu_wait_share": m_all["cpu_wait_share"],
    "main_sleep_share": m_all["sleep_share"],
    **{f"main_{k}_alone": v for k, v in m_alone.items()}, **{f"main_{k}_with": v for k, v in m_with.items()},
    "main_extra_off_cpu_share_with": round(extra_off, 4),
    "main_extra_off_cpu_s_with": round(extra_off * with_["wall_s"], 4),
    "stats_run_s": stats_run, "stats_cpu_wait_s": stats_wait,
    "stats_run_share_with": round(stats_run / with_["wall_s"], 4) if stats_run is not None else None,
    "stats_thread_cpu_s": round(counted["cpu_s"], 4), "stats_docs": counted["docs"], "stats_tokens": counted["tokens"],
    "stats_passes": counted["passes"], "stats_snapshots": counted["snapshots"],
    "stats_docs_per_s": round(counted["docs"] / with_["wall_s"], 1),
    "other_threads_run_with_s": round(others_with, 4),
    "gpu_step_ms": round(gpu_step_s * 1e3, 4) if gpu_step_s is not None else None,
    "gpu_busy_share": busy(steps, wall), "gpu_busy_share_alone": busy(alone["steps"], alone["wall_s"]),
    "gpu_busy_share_with": busy(with_["steps"], with_["wall_s"]),
    "minor_faults_per_s": round((f1 - f0) / wall, 1), "cuda_mallocs_per_s": round((m1 - m0) / wall, 3),
    "python": sys.version.split()[0], "implementation": sys.implementation.name,
    "gil_enabled": bool(gil_enabled), "free_threaded_build": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    "switch_interval_ms": round(sys.getswitchinterval() * 1e3, 3),
    "batch": BATCH, "docs": NDOCS, "corpus_tokens": int(lengths.sum()), "logged": len(logged)}
sc.note(f"natural: measured by the script: alone {alone['steps']} steps in {alone['wall_s']:.2f} s "
        f"({sps_alone:.1f}/s), the main thread on a CPU {m_alone['cpu_share']:.0%}, waiting for one "
        f"{m_alone['cpu_wait_share']:.0%}, asleep {m_alone['sleep_share']:.0%}; with the stats thread {with_['steps']} "
        f"steps in {with_['wall_s']:.2f} s ({sps_with:.1f}/s, {lost or 0.0:.2f} s lost against the rate alone), the "
        f"main thread on a CPU {m_with['cpu_share']:.0%}, waiting for one {m_with['cpu_wait_share']:.0%}, asleep "
        f"{m_with['sleep_share']:.0%}; "
        f"the stats thread ran {stats_run} s ({counted['docs']} documents, {counted['passes']} passes); Python "
        f"{sys.version.split()[0]}, GIL {'enabled' if gil_enabled else 'disabled'}, switch interval "
        f"{sys.getswitchinterval() * 1e3:.1f} ms; "
        + (f"a step's kernels take {gpu_step_s * 1e3:.3f} ms of GPU time queued (GPU busy "
           f"{steps * gpu_step_s / wall:.0%} of the run)." if gpu_step_s is not None else "no GPU timings (no CUDA)."))
sc.write_truth(baseline=(b0, b1), window=None, ratio_spans=((b0, split), (split, b1)))
