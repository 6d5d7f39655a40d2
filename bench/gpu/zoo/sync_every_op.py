"""sync_every_op: for 10 s every layer of the model (each Linear and ReLU, forward and backward)
ends in torch.cuda.synchronize() from a module hook that also takes a timestamp: per-layer timing
code left in, as debugging does. The host can no longer queue work ahead of the GPU: it waits for
each layer, then launches the next while the GPU idles (~38 syncs a step). The model is deeper
and smaller than the zoo's usual one (8 hidden layers of 1024, batch 2048: ~2 ms of GPU work a
step) so that the per-layer launches are a real share of it. CPUs 2-3. No culprit."""

import time

from common import Scenario, Trainer

sc = Scenario("sync_every_op", "excess_sync", "torch.cuda.synchronize() after every layer, forward and backward "
              "(timing hooks) for 10 s", job_cpus=[2, 3])
tr = Trainer(sc, width=1024, batch=2048, depth=8)
tr.warmup()
torch = tr.torch
layers = [m for m in tr.model.modules() if not list(m.children())]
stamps: list[float] = []
hooks: list = []


def after_layer(module, *_args) -> None:
    """Forward and backward hook: wait for the GPU, then note the time (per-layer timing)."""
    if sc.cuda:
        torch.cuda.synchronize()
    stamps.append(time.perf_counter())
    if len(stamps) > 100_000:
        del stamps[:50_000]


def start() -> None:
    for m in layers:
        hooks.append(m.register_forward_hook(after_layer))
        hooks.append(m.register_full_backward_hook(after_layer))


def end() -> None:
    for h in hooks:
        h.remove()
    hooks.clear()


if not sc.cuda:
    sc.note("no CUDA: the hooks ran without torch.cuda.synchronize() (only their own cost is staged here).")
sc.extra["syncs_per_step"] = 2 * len(layers)
width = tr.model[0].out_features
sc.note(f"MLP {tr.in_dim}-{'-'.join([str(width)] * 9)}-10 (8 hidden layers), batch {tr.batch}; in the window "
        f"{2 * len(layers)} hooks a step ({len(layers)} layers, forward and backward) each synchronize.")
sc.standard_phases(tr.step, start, end)
