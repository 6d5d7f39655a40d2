"""checkpoint_fsync: for 10 s the main thread saves a checkpoint every ~2.5 s: the model's and the
optimizer's state plus a large embedding table (~1.5 GiB in all), copied from the GPU to CPU
memory, torch.save'd to /var/tmp/zoo_checkpoint.pt and fsync'ed (CPUs 10-11).

Each save stalls the loop for 1-3 s: the device-to-host copy, the write into the page cache, then
the main thread in D state while fsync writes the file back. No culprit process: the feeder's
own saves. The truth's `episodes_ns` lists [start, end] of each save. The file is removed at the
end. Smoke runs (--device cpu or --scale < 0.5) save ~48 MiB instead."""

import os

from common import Scenario, Trainer, now

sc = Scenario("checkpoint_fsync", "disk_io", "a ~1.5 GiB checkpoint (torch.save + fsync) every 2.5 s on the main "
              "thread for 10 s", job_cpus=[10, 11])
PATH = os.environ.get("ZOO_CHECKPOINT_FILE", "/var/tmp/zoo_checkpoint.pt")
TOTAL = (48 << 20) if sc.smoke else (1536 << 20)
PERIOD_S = 2.5 * sc.scale
tr = Trainer(sc)
torch = tr.torch
tr.warmup()  # AdamW's state exists from here on
state_bytes = 3 * sum(p.numel() * p.element_size() for p in tr.model.parameters())  # weights + 2 AdamW moments
EMB_DIM = 1024
emb = torch.nn.Embedding(max(1, (TOTAL - state_bytes) // (4 * EMB_DIM)), EMB_DIM, device=tr.dev)
emb.requires_grad_(False)  # a frozen table that is part of the model's state
tr.sync()
episodes: list[list[int]] = []
sizes: list[int] = []


def save_checkpoint() -> None:
    """The usual checkpoint: state copied to CPU, torch.save to one file, flush and fsync before going on."""
    t0 = now()
    state = {"model": {k: v.detach().to("cpu", copy=True) for k, v in tr.model.state_dict().items()},
             "embedding": emb.weight.detach().to("cpu", copy=True),
             "optimizer": tr.opt.state_dict(), "step": tr.i}
    with open(PATH, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    sizes.append(os.path.getsize(PATH))
    episodes.append([t0, now()])


def window_step() -> None:
    """Train; save when the next checkpoint is due (every PERIOD_S from the window's start, 4 in 10 s)."""
    k = len(episodes)
    if k * PERIOD_S < sc.window_s - 0.5 * PERIOD_S and now() >= sc.marks["window"] + k * PERIOD_S * 1e9:
        save_checkpoint()
    tr.step()


def summary() -> None:
    """What the saves took, for the truth."""
    sc.extra["checkpoint_bytes"] = sizes
    sc.extra["checkpoint_s"] = [round((e - s) / 1e9, 3) for s, e in episodes]
    sc.note(f"{len(episodes)} checkpoints of ~{TOTAL >> 20} MiB, each saved and fsync'ed on the main thread: "
            f"{', '.join(f'{x:.2f}' for x in sc.extra['checkpoint_s'])} s.")


try:
    sc.extra.update(episodes_ns=episodes, checkpoint_file=PATH, checkpoint_period_s=PERIOD_S)
    sc.standard_phases(tr.step, lambda: None, lambda: None, window_step, before_truth=summary)
finally:
    try:
        os.unlink(PATH)
    except OSError:
        pass
